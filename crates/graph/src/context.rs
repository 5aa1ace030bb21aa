//! What a running node can reach: the run's config and context, the stream, the store,
//! interrupts and cancellation. One [`TaskContext`] per task; the run-wide parts are shared.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::Checkpointer;
use crate::node::{Interrupt, NodeError};
use crate::store::Store;
use crate::stream::{StreamEvent, StreamMode, StreamModes};

/// Run-wide state shared by every task of a run, subgraphs included.
pub struct RunShared {
    /// The run's config: `{configurable: {...}, metadata: {...}, ...}`.
    pub config: Value,
    /// The run's `context` (LangGraph's runtime context).
    pub context: Value,
    /// The long-term store, when the server provides one.
    pub store: Option<Arc<dyn Store>>,
    /// Where stream events go. Bounded: a slow consumer slows the run instead of growing memory.
    pub sink: Option<mpsc::Sender<StreamEvent>>,
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
}

impl RunShared {
    /// Whether events of `mode` in namespace `ns` reach the sink.
    pub fn wants(&self, mode: StreamMode, ns: &[String]) -> bool {
        self.sink.is_some() && self.modes.contains(mode) && (ns.is_empty() || self.stream_subgraphs)
    }

    /// Send an event if it is wanted. Waits when the consumer is behind.
    pub async fn emit(&self, ns: &[String], mode: StreamMode, data: Value) {
        if !self.wants(mode, ns) {
            return;
        }
        if let Some(sink) = &self.sink {
            // A closed sink means nobody listens any more; the run still completes.
            let _ = sink
                .send(StreamEvent {
                    namespace: ns.to_vec(),
                    mode,
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
                data,
            });
        }
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
    pub(crate) triggers: Vec<String>,
    pub(crate) path: Value,
    /// Resume values for this task's interrupts, in the order the interrupts are raised.
    pub(crate) resume: Vec<Value>,
    pub(crate) interrupt_counter: AtomicUsize,
    /// The checkpoint the task's step started from (parent of subgraph checkpoints).
    pub(crate) checkpoint_id: Option<String>,
    /// `parents` metadata of the graph the task belongs to.
    pub(crate) parents: Map<String, Value>,
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
            triggers: Vec::new(),
            path: json!(["__pregel_pull", node]),
            resume: Vec::new(),
            interrupt_counter: AtomicUsize::new(0),
            checkpoint_id: None,
            parents: Map::new(),
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

    /// Whether `messages` events of this task are streamed.
    pub fn streams_messages(&self) -> bool {
        self.run.wants(StreamMode::Messages, &self.graph_ns)
    }

    /// Stream one message chunk as `[chunk, metadata]`.
    pub async fn write_message(&self, chunk: Value) {
        if !self.streams_messages() {
            return;
        }
        if let Some(id) = chunk.get("id").and_then(Value::as_str) {
            if let Ok(mut seen) = self.run.seen_messages.lock() {
                seen.insert(id.to_string());
            }
        }
        let meta = self.message_metadata();
        self.run
            .emit(&self.graph_ns, StreamMode::Messages, json!([chunk, meta]))
            .await;
    }

    /// Stream a token chunk of a chat model, with the metadata LangChain adds for model
    /// runs (`ls_provider`, `ls_model_type`, ...).
    pub async fn write_model_chunk(&self, chunk: Value, provider: &str, model_name: Option<&str>) {
        if !self.streams_messages() {
            return;
        }
        if let Some(id) = chunk.get("id").and_then(Value::as_str) {
            if let Ok(mut seen) = self.run.seen_messages.lock() {
                seen.insert(id.to_string());
            }
        }
        let mut meta = self.message_metadata();
        if let Value::Object(m) = &mut meta {
            m.insert("ls_integration".into(), json!("langchain_chat_model"));
            m.insert("checkpoint_ns".into(), json!(self.task_checkpoint_ns()));
            m.insert("ls_provider".into(), json!(provider));
            m.insert("ls_model_type".into(), json!("chat"));
            if let Some(name) = model_name {
                m.insert("ls_model_name".into(), json!(name));
            }
        }
        self.run
            .emit(&self.graph_ns, StreamMode::Messages, json!([chunk, meta]))
            .await;
    }

    /// The metadata LangGraph attaches to message chunks.
    pub fn message_metadata(&self) -> Value {
        let mut meta = match self.run.config.get("metadata") {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        if let Some(tid) = self.run.config.pointer("/configurable/thread_id") {
            meta.entry("thread_id").or_insert(tid.clone());
        }
        if let Some(rid) = self.run.config.pointer("/configurable/run_id") {
            meta.entry("run_id").or_insert(rid.clone());
        }
        meta.insert("ls_integration".into(), json!("langgraph"));
        meta.insert("langgraph_step".into(), json!(self.step));
        meta.insert("langgraph_node".into(), json!(self.node));
        meta.insert("langgraph_triggers".into(), json!(self.triggers));
        meta.insert("langgraph_path".into(), self.path.clone());
        meta.insert(
            "langgraph_checkpoint_ns".into(),
            json!(self.task_checkpoint_ns()),
        );
        Value::Object(meta)
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
