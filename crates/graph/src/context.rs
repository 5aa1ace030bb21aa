//! What a running node can reach: the run's config and context, the stream, the store,
//! interrupts and cancellation. One [`TaskContext`] per task; the run-wide parts are shared.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::checkpoint::Checkpointer;
use crate::events::{EventScope, Traced};
use crate::message_chunks;
use crate::node::{Interrupt, NodeError};
use crate::store::Store;
use crate::stream::{EventSink, StreamEvent, StreamMode, StreamModes};

/// Run-wide state shared by every task of a run, subgraphs included.
pub struct RunShared {
    /// The run's config: `{configurable: {...}, metadata: {...}, ...}`.
    pub config: Value,
    /// The run's `context` (LangGraph's runtime context).
    pub context: Value,
    /// The long-term store, when the server provides one.
    pub store: Option<Arc<dyn Store>>,
    /// Where stream events go. Bounded: a slow consumer slows the run instead of growing memory.
    pub sink: Option<EventSink>,
    /// Which modes are streamed.
    pub modes: StreamModes,
    /// Whether subgraph events are streamed.
    pub stream_subgraphs: bool,
    /// Cancels the run at its next await point.
    pub cancel: CancellationToken,
    /// Checkpointer of the run, used by subgraphs too.
    pub checkpointer: Option<Arc<dyn Checkpointer>>,
    /// Ids of messages already streamed (or already in a task's input), run-wide so a
    /// message streamed inside a subgraph is not streamed again by its parent.
    pub seen_messages: Mutex<HashSet<String>>,
    /// Each message streamed in the accumulated `messages` form, as sent last, by id.
    pub accumulated_messages: Mutex<HashMap<String, Value>>,
}

impl RunShared {
    /// Whether events of `mode` in namespace `ns` reach the sink.
    pub fn wants(&self, mode: StreamMode, ns: &[String]) -> bool {
        self.sink.is_some() && self.modes.contains(mode) && (ns.is_empty() || self.stream_subgraphs)
    }

    /// Whether messages of a task in `ns` are streamed, in either form. Like other modes,
    /// a subgraph's messages are streamed from inside it only with `stream_subgraphs`;
    /// otherwise they are streamed when its node returns them.
    pub fn wants_messages(&self, ns: &[String]) -> bool {
        self.wants(StreamMode::Messages, ns) || self.wants(StreamMode::AccumulatedMessages, ns)
    }

    /// Whether the run streams `events` (of every graph, subgraphs included).
    pub fn wants_events(&self) -> bool {
        self.sink.is_some() && self.modes.contains(StreamMode::Events)
    }

    /// Send an event if it is wanted. Waits when the consumer is behind.
    pub async fn emit(&self, ns: &[String], mode: StreamMode, data: Value) {
        self.emit_part(ns, mode, None, data).await;
    }

    /// Send one of the several events of a mode (`messages/partial`, ...) if it is wanted.
    pub async fn emit_part(
        &self,
        ns: &[String],
        mode: StreamMode,
        part: Option<&'static str>,
        data: Value,
    ) {
        if !self.wants(mode, ns) {
            return;
        }
        if let Some(sink) = &self.sink {
            // A closed sink means nobody listens any more; the run still completes.
            let _ = sink
                .send(StreamEvent {
                    namespace: ns.to_vec(),
                    mode,
                    part,
                    data,
                })
                .await;
        }
    }

    /// The same, from a thread that is not a runtime worker (scripts run on blocking threads).
    pub fn emit_blocking(&self, ns: &[String], mode: StreamMode, data: Value) {
        if !self.wants(mode, ns) {
            return;
        }
        if let Some(sink) = &self.sink {
            let _ = sink.blocking_send(StreamEvent {
                namespace: ns.to_vec(),
                mode,
                part: None,
                data,
            });
        }
    }

    /// A message in the accumulated form: `messages/metadata` the first time its id is seen,
    /// then the sum of its chunks so far (`messages/partial`) or the whole message
    /// (`messages/complete`), always as a plain message.
    async fn emit_accumulated(&self, msg: Value, meta: Value) {
        let id = msg
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let partial = message_chunks::is_chunk(&msg);
        let (first, sum) = {
            let Ok(mut sums) = self.accumulated_messages.lock() else {
                return;
            };
            match sums.entry(id.clone()) {
                Entry::Occupied(mut seen) => {
                    if partial {
                        message_chunks::add_chunk(seen.get_mut(), &msg);
                    } else {
                        *seen.get_mut() = msg;
                    }
                    (false, message_chunks::chunk_to_message(seen.get()))
                }
                Entry::Vacant(slot) => {
                    let sum = message_chunks::chunk_to_message(&msg);
                    slot.insert(msg);
                    (true, sum)
                }
            }
        };
        let mode = StreamMode::AccumulatedMessages;
        if first {
            let mut by_id = Map::new();
            by_id.insert(id, json!({ "metadata": meta }));
            self.emit_part(&[], mode, Some("metadata"), Value::Object(by_id))
                .await;
        }
        let part = if partial { "partial" } else { "complete" };
        self.emit_part(&[], mode, Some(part), json!([sum])).await;
    }

    /// Metadata of the graph run: the run's metadata with its thread and run ids.
    pub fn graph_metadata(&self) -> Map<String, Value> {
        let mut meta = match self.config.get("metadata") {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        if let Some(tid) = self.config.pointer("/configurable/thread_id") {
            meta.entry("thread_id").or_insert(tid.clone());
        }
        if let Some(rid) = self.config.pointer("/configurable/run_id") {
            meta.entry("run_id").or_insert(rid.clone());
        }
        meta.insert("ls_integration".into(), json!("langgraph"));
        meta
    }

    /// `config.configurable`.
    pub fn configurable(&self) -> Value {
        self.config
            .get("configurable")
            .cloned()
            .unwrap_or(json!({}))
    }
}

/// One task's view of the run.
pub struct TaskContext {
    pub(crate) run: Arc<RunShared>,
    /// Namespace of the graph the task belongs to (events are tagged with it).
    pub(crate) graph_ns: Vec<String>,
    pub(crate) task_id: String,
    pub(crate) node: String,
    pub(crate) step: i64,
    /// The run's step limit (`recursion_limit`).
    pub(crate) recursion_limit: usize,
    /// Steps the run may still take, this task's included: LangGraph's `RemainingSteps`
    /// (`1` on the last step, LangGraph's `IsLastStep`).
    pub(crate) remaining_steps: usize,
    pub(crate) triggers: Vec<String>,
    pub(crate) path: Value,
    /// Resume values for this task's interrupts, in the order the interrupts are raised.
    pub(crate) resume: Vec<Value>,
    pub(crate) interrupt_counter: AtomicUsize,
    /// The checkpoint the task's step started from (parent of subgraph checkpoints).
    pub(crate) checkpoint_id: Option<String>,
    /// `parents` metadata of the graph the task belongs to.
    pub(crate) parents: Map<String, Value>,
    /// The task's run in `events`, when the run streams them.
    pub(crate) events: Option<EventScope>,
    /// The chat model call in progress, whose token chunks become `on_chat_model_stream`.
    pub(crate) model_call: Mutex<Option<Traced>>,
}

impl TaskContext {
    /// A context for running a node outside the engine (tests, tools).
    pub fn detached(run: Arc<RunShared>, node: &str) -> Self {
        TaskContext {
            run,
            graph_ns: Vec::new(),
            task_id: uuid::Uuid::new_v4().to_string(),
            node: node.to_string(),
            step: 0,
            recursion_limit: crate::pregel::DEFAULT_RECURSION_LIMIT,
            remaining_steps: crate::pregel::DEFAULT_RECURSION_LIMIT,
            triggers: Vec::new(),
            path: json!(["__pregel_pull", node]),
            resume: Vec::new(),
            interrupt_counter: AtomicUsize::new(0),
            checkpoint_id: None,
            parents: Map::new(),
            events: None,
            model_call: Mutex::new(None),
        }
    }

    /// The run-wide part.
    pub fn run(&self) -> &Arc<RunShared> {
        &self.run
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The task id.
    pub fn task_id(&self) -> &str {
        &self.task_id
    }

    /// The super-step number.
    pub fn step(&self) -> i64 {
        self.step
    }

    /// Steps the run may still take, this task's included (`1` on its last step).
    pub fn remaining_steps(&self) -> usize {
        self.remaining_steps
    }

    /// The run's config.
    pub fn config(&self) -> &Value {
        &self.run.config
    }

    /// The run's context.
    pub fn context(&self) -> &Value {
        &self.run.context
    }

    /// The store, if any.
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.run.store.as_ref()
    }

    /// The namespace of this task's own checkpoints and subgraphs: `node:task_id` under the
    /// graph's namespace.
    pub fn task_ns(&self) -> Vec<String> {
        let mut ns = self.graph_ns.clone();
        ns.push(format!("{}:{}", self.node, self.task_id));
        ns
    }

    /// The `checkpoint_ns` string of this task (`parent|node:task_id`).
    pub fn task_checkpoint_ns(&self) -> String {
        self.task_ns().join("|")
    }

    /// Whether the run was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.run.cancel.is_cancelled()
    }

    /// The run's cancellation token.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.run.cancel
    }

    /// Sleep, waking early with [`NodeError::Cancelled`] if the run is cancelled.
    pub async fn sleep(&self, d: Duration) -> Result<(), NodeError> {
        tokio::select! {
            _ = self.run.cancel.cancelled() => Err(NodeError::Cancelled),
            _ = tokio::time::sleep(d) => Ok(()),
        }
    }

    /// Write a `custom` stream event.
    pub async fn write_custom(&self, value: Value) {
        self.run
            .emit(&self.graph_ns, StreamMode::Custom, value)
            .await;
    }

    /// Write a `custom` stream event from a blocking thread.
    pub fn write_custom_blocking(&self, value: Value) {
        self.run
            .emit_blocking(&self.graph_ns, StreamMode::Custom, value);
    }

    /// Whether messages of this task are streamed (in either form).
    pub fn streams_messages(&self) -> bool {
        self.run.wants_messages(&self.graph_ns)
    }

    /// Whether a chat model called by this task should stream its tokens: for either
    /// messages form, or for `events`.
    pub fn streams_tokens(&self) -> bool {
        self.streams_messages() || self.events.is_some()
    }

    /// Stream a message a node returned (or a chunk of one).
    pub async fn write_message(&self, chunk: Value) {
        if !self.streams_messages() {
            return;
        }
        self.mark_seen(&chunk);
        let meta = self.message_metadata();
        self.send_message(chunk, meta).await;
    }

    /// Stream a token chunk of a chat model, with the metadata LangChain adds for model
    /// runs (`ls_provider`, `ls_model_type`, ...), and as `on_chat_model_stream`.
    pub async fn write_model_chunk(&self, chunk: Value, provider: &str, model_name: Option<&str>) {
        let call = match self.events {
            Some(_) => self.model_call.lock().ok().and_then(|c| c.clone()),
            None => None,
        };
        if let Some(call) = call {
            call.emit(&self.run, "on_chat_model_stream", json!({ "chunk": chunk }))
                .await;
        }
        if !self.streams_messages() {
            return;
        }
        self.mark_seen(&chunk);
        let meta = self.model_metadata(provider, model_name);
        self.send_message(chunk, meta).await;
    }

    fn mark_seen(&self, msg: &Value) {
        if let Some(id) = msg.get("id").and_then(Value::as_str) {
            if let Ok(mut seen) = self.run.seen_messages.lock() {
                seen.insert(id.to_string());
            }
        }
    }

    /// One message in the form the run asked for: `[message, metadata]` under the task's
    /// namespace, or accumulated (always under the root's, as the Platform sends it).
    async fn send_message(&self, msg: Value, meta: Value) {
        if self.run.modes.contains(StreamMode::Messages) {
            self.run
                .emit(&self.graph_ns, StreamMode::Messages, json!([msg, meta]))
                .await;
        } else {
            self.run.emit_accumulated(msg, meta).await;
        }
    }

    /// The metadata LangChain gives a chat model run inside this task.
    pub fn model_metadata(&self, provider: &str, model_name: Option<&str>) -> Value {
        let mut meta = self.inner_metadata();
        if let Value::Object(m) = &mut meta {
            m.insert("ls_integration".into(), json!("langchain_chat_model"));
            m.insert("ls_provider".into(), json!(provider));
            m.insert("ls_model_type".into(), json!("chat"));
            if let Some(name) = model_name {
                m.insert("ls_model_name".into(), json!(name));
            }
        }
        meta
    }

    /// The metadata LangGraph attaches to a task's messages and runs.
    pub fn message_metadata(&self) -> Value {
        let mut meta = self.run.graph_metadata();
        meta.insert("langgraph_step".into(), json!(self.step));
        meta.insert("langgraph_node".into(), json!(self.node));
        meta.insert("langgraph_triggers".into(), json!(self.triggers));
        meta.insert("langgraph_path".into(), self.path.clone());
        meta.insert(
            "langgraph_checkpoint_ns".into(),
            json!(self.task_checkpoint_ns()),
        );
        // Inside a subgraph, the subgraph's config (its namespace) is inherited.
        if !self.graph_ns.is_empty() {
            meta.insert("checkpoint_ns".into(), json!(self.graph_ns.join("|")));
        }
        Value::Object(meta)
    }

    /// Whether the run streams `events`: what is only needed for them is built only then.
    pub(crate) fn traces(&self) -> bool {
        self.events.is_some()
    }

    /// The task's own run in `events` (the node), when the run streams them.
    pub(crate) fn node_trace(&self) -> Option<Traced> {
        let scope = self.events.clone()?;
        Some(Traced {
            name: self.node.clone(),
            scope,
            tags: vec![format!("graph:step:{}", self.step)],
            metadata: self.message_metadata(),
        })
    }

    /// A run below the task's node in `events` (a router, a tool, a model call, a
    /// subgraph), when the run streams them. `metadata` is only built then.
    pub(crate) fn child_trace(
        &self,
        name: &str,
        tag: &str,
        metadata: impl FnOnce() -> Value,
    ) -> Option<Traced> {
        let scope = self.events.as_ref()?.child();
        Some(Traced {
            name: name.to_string(),
            scope,
            tags: vec![tag.to_string()],
            metadata: metadata(),
        })
    }

    /// Node metadata with `checkpoint_ns` set to the task's namespace, as runs called from
    /// inside the node (tools, subgraphs) see it.
    pub(crate) fn inner_metadata(&self) -> Value {
        let mut meta = self.message_metadata();
        if let Value::Object(m) = &mut meta {
            m.insert("checkpoint_ns".into(), json!(self.task_checkpoint_ns()));
        }
        meta
    }

    /// Set (or clear) the chat model call whose chunks are streamed as `events`.
    pub(crate) fn set_model_call(&self, call: Option<Traced>) {
        if let Ok(mut slot) = self.model_call.lock() {
            *slot = call;
        }
    }

    /// LangGraph's `interrupt(value)`: returns the resume value when the task is being resumed,
    /// otherwise stops the node with [`NodeError::Interrupted`]. Use it with `?`.
    pub fn interrupt(&self, value: Value) -> Result<Value, NodeError> {
        let idx = self.interrupt_counter.fetch_add(1, Ordering::SeqCst);
        if let Some(v) = self.resume.get(idx) {
            return Ok(v.clone());
        }
        Err(NodeError::Interrupted(vec![Interrupt {
            id: interrupt_id(&self.task_checkpoint_ns(), idx),
            value,
        }]))
    }

    /// Whether a message id was already streamed or came in with the input.
    pub(crate) fn message_seen(&self, id: &str) -> bool {
        self.run
            .seen_messages
            .lock()
            .map(|s| s.contains(id))
            .unwrap_or(false)
    }
}

/// Interrupt ids are derived from the task's namespace and the interrupt's position, so the
/// same interrupt keeps its id when the task is re-run on resume.
pub fn interrupt_id(task_ns: &str, index: usize) -> String {
    let name = format!("{task_ns}#{index}");
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes())
        .simple()
        .to_string()
}
