//! The write side of protocol v2: a v2 run's engine events become protocol-shaped logged
//! events, one logged event per protocol event, so each gets its own durable seq.
//!
//! Only what needs state across events happens here: assembling a model's message chunks
//! into `message-start`, `content-block-*` and `message-finish` events; tool events (from the
//! engine's `tools` mode as tools start and end, or else from the tool calls a model made and
//! the tool messages that answer them); `input.requested` from an
//! interrupt; the run's `lifecycle`. Everything else is logged as the engine made it and
//! shaped by the read side (the server's `protocol::envelope`), which also serves plain runs.
//!
//! As in the reference, the `messages` channel carries what chat models answer, and only
//! that: a reply streamed in chunks, or one a model that cannot stream gave whole (which
//! LangGraph reports with the model's metadata); a message a node returns whole (an AI
//! message with tool calls, a tool message) is in the node's update and the state, not on
//! `messages`.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};
use spindle_graph::stream::{StreamEvent, StreamMode};
use spindle_storage::{RunStatus, ThreadStatus};

use super::{input_requested, join_name};

/// A protocol event ready to be numbered and logged: `(event name, data)`.
pub type Logged = (String, Value);

/// Per-run state of the write side.
#[derive(Default)]
pub struct Normalizer {
    /// The message being streamed in chunks, per namespace (keyed by the joined name).
    open: HashMap<String, OpenMessage>,
    /// Tool calls models made, by id: `(name, args)`, for `tool-started`.
    tool_calls: HashMap<String, (String, Value)>,
    /// Tool calls whose result was already turned into tool events.
    answered: HashSet<String>,
    /// Interrupts already requested (an interrupt may be reported more than once).
    requested: HashSet<String>,
    /// Subgraph namespaces announced `started` and not completed yet, in order.
    subgraphs: Vec<Vec<String>>,
    /// Subgraphs whose node's update has been logged: they complete after it and after the
    /// task's result, as the reference's lifecycle follows the task result.
    finishing: Vec<Vec<String>>,
}

/// A message whose chunks are arriving.
struct OpenMessage {
    namespace: Vec<String>,
    id: String,
    /// Text so far, and its block index once started.
    text: String,
    text_index: Option<usize>,
    /// Tool call chunks by their chunk index: block index, id, name, args so far.
    calls: Vec<CallBlock>,
    next_index: usize,
    usage: Option<Value>,
}

struct CallBlock {
    chunk_index: Value,
    block: usize,
    id: Option<String>,
    name: Option<String>,
    args: String,
}

impl Normalizer {
    /// The protocol events one engine event becomes.
    pub fn push(&mut self, event: StreamEvent) -> Vec<Logged> {
        let mut out = Vec::new();
        let tasks = event.mode == StreamMode::Tasks;
        if !tasks {
            self.complete_finished(&mut out);
        }
        self.announce(&event.namespace, &mut out);
        if event.mode == StreamMode::Updates {
            self.finish_children(&event);
        }
        match event.mode {
            StreamMode::Messages => self.message(&event.namespace, &event.data, &mut out),
            StreamMode::Tools => {
                // Announced by the engine as the tool ran: its tool message adds nothing.
                if let Some(id) = event.data.get("tool_call_id").and_then(Value::as_str) {
                    self.answered.insert(id.to_owned());
                }
                out.push((event.event_name(), event.data));
            }
            StreamMode::Updates => {
                self.close(&event.namespace, &mut out);
                self.update(event, &mut out);
            }
            _ => {
                if event.mode == StreamMode::Values {
                    self.close(&event.namespace, &mut out);
                }
                out.push((event.event_name(), event.data));
            }
        }
        if tasks {
            // A task's result (or the next task's start) follows its update.
            self.complete_finished(&mut out);
        }
        out
    }

    /// What is left when the engine stops: messages still open are finished (or, when the
    /// run failed with `error`, end with a messages `error` event: they were cut off), and
    /// subgraphs still open complete, deepest first.
    pub fn finish(&mut self, error: Option<&str>) -> Vec<Logged> {
        let mut out = Vec::new();
        self.complete_finished(&mut out);
        let mut keys: Vec<String> = self.open.keys().cloned().collect();
        keys.sort();
        for key in keys {
            let Some(open) = self.open.remove(&key) else {
                continue;
            };
            match error {
                Some(message) => {
                    out.push((open.name(), json!({"event": "error", "message": message})))
                }
                None => self.finish_message(open, &mut out),
            }
        }
        let mut left = std::mem::take(&mut self.subgraphs);
        left.sort_by_key(|ns| std::cmp::Reverse(ns.len()));
        for ns in left {
            out.push(lifecycle(&ns, "completed", &graph_of(&ns), None));
        }
        out
    }

    /// `lifecycle completed` of the subgraphs whose node's update (and task result) is logged.
    fn complete_finished(&mut self, out: &mut Vec<Logged>) {
        for ns in std::mem::take(&mut self.finishing) {
            self.close(&ns, out);
            self.subgraphs.retain(|open| open != &ns);
            out.push(lifecycle(&ns, "completed", &graph_of(&ns), None));
        }
    }

    /// `lifecycle started` the first time a subgraph namespace (or any prefix of it) shows up.
    fn announce(&mut self, ns: &[String], out: &mut Vec<Logged>) {
        for depth in 1..=ns.len() {
            let prefix = &ns[..depth];
            if !self.subgraphs.iter().any(|open| open == prefix) {
                self.subgraphs.push(prefix.to_vec());
                out.push(started(prefix));
            }
        }
    }

    /// A node's update in namespace P finishes its subgraph `P + [node:task]` (and anything
    /// below it): the task that ran the subgraph is done. They complete once the update and
    /// the task's result are logged, so a client that reads the state on `completed` sees it.
    fn finish_children(&mut self, event: &StreamEvent) {
        let Some(nodes) = event.data.as_object() else {
            return;
        };
        let parent = &event.namespace;
        let mut done: Vec<Vec<String>> = self
            .subgraphs
            .iter()
            .filter(|ns| {
                ns.len() > parent.len()
                    && ns.starts_with(parent)
                    && nodes.contains_key(&graph_of(&ns[..=parent.len()]))
                    && !self.finishing.contains(ns)
            })
            .cloned()
            .collect();
        done.sort_by_key(|ns| std::cmp::Reverse(ns.len()));
        self.finishing.extend(done);
    }

    fn update(&mut self, event: StreamEvent, out: &mut Vec<Logged>) {
        let ns = &event.namespace;
        if let Some(interrupts) = event.data.get("__interrupt__").and_then(Value::as_array) {
            for interrupt in interrupts {
                let Some(id) = interrupt.get("id").and_then(Value::as_str) else {
                    continue;
                };
                if self.requested.insert(id.to_owned()) {
                    out.push((
                        join_name("input.requested", ns),
                        input_requested(&json!(id), interrupt.get("value")),
                    ));
                }
            }
            return;
        }
        // Tool messages a node returned (when the message stream did not carry them).
        if let Some(nodes) = event.data.as_object() {
            for update in nodes.values() {
                let messages = update.get("messages");
                let list = match messages {
                    Some(Value::Array(list)) => list.clone(),
                    Some(one @ Value::Object(_)) => vec![one.clone()],
                    _ => Vec::new(),
                };
                for message in &list {
                    if message_type(message) == "tool" {
                        self.tool_result(ns, message, out);
                    } else {
                        self.remember_tool_calls(message);
                    }
                }
            }
        }
        out.push((event.event_name(), event.data));
    }

    /// A `messages-tuple` event: `[message or chunk, metadata]`.
    fn message(&mut self, ns: &[String], data: &Value, out: &mut Vec<Logged>) {
        let Some(message) = data.get(0).filter(|m| m.is_object()) else {
            return;
        };
        let kind = message_type(message);
        let id = message
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let key = join_name("", ns);
        if kind.ends_with("Chunk") {
            let same = self.open.get(&key).is_some_and(|o| o.id == id);
            if !same {
                self.close(ns, out);
                out.push((
                    join_name("messages", ns),
                    json!({"event": "message-start", "role": "ai", "id": id}),
                ));
                self.open.insert(key.clone(), OpenMessage::new(ns, id));
            }
            if let Some(open) = self.open.get_mut(&key) {
                open.add_chunk(message, out);
            }
            if message.get("chunk_position").and_then(Value::as_str) == Some("last") {
                self.close(ns, out);
            }
            return;
        }
        self.close(ns, out);
        if kind == "ai" && from_chat_model(data.get(1)) {
            self.whole_reply(ns, id, message, out);
            return;
        }
        // Any other whole message is one a node returned: not on `messages`, but its tool
        // calls and results still make tool events.
        if kind == "tool" {
            self.tool_result(ns, message, out);
        }
        self.remember_tool_calls(message);
    }

    /// A chat model's reply that was not streamed (a model that cannot stream): on
    /// `messages` as a reply streamed in one chunk, as the reference shows every model reply.
    fn whole_reply(&mut self, ns: &[String], id: String, message: &Value, out: &mut Vec<Logged>) {
        out.push((
            join_name("messages", ns),
            json!({"event": "message-start", "role": "ai", "id": id}),
        ));
        let mut open = OpenMessage::new(ns, id);
        open.add_chunk(&as_one_chunk(message), out);
        self.finish_message(open, out);
    }

    /// Finishes the namespace's open message, if any.
    fn close(&mut self, ns: &[String], out: &mut Vec<Logged>) {
        if let Some(open) = self.open.remove(&join_name("", ns)) {
            self.finish_message(open, out);
        }
    }

    fn finish_message(&mut self, open: OpenMessage, out: &mut Vec<Logged>) {
        for call in &open.calls {
            if let Some(id) = &call.id {
                let args = serde_json::from_str(&call.args).unwrap_or_else(|_| json!({}));
                self.tool_calls
                    .insert(id.clone(), (call.name.clone().unwrap_or_default(), args));
            }
        }
        open.finish(out);
    }

    fn remember_tool_calls(&mut self, message: &Value) {
        for call in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                let name = call.get("name").and_then(Value::as_str).unwrap_or_default();
                let args = call.get("args").cloned().unwrap_or_else(|| json!({}));
                self.tool_calls
                    .insert(id.to_owned(), (name.to_owned(), args));
            }
        }
    }

    /// `tool-started` then `tool-finished` (or `tool-error`) for a tool message the engine did
    /// not announce (a node that returned tool messages without running tools).
    fn tool_result(&mut self, ns: &[String], message: &Value, out: &mut Vec<Logged>) {
        let Some(call_id) = message.get("tool_call_id").and_then(Value::as_str) else {
            return;
        };
        if !self.answered.insert(call_id.to_owned()) {
            return;
        }
        let (name, input) = self.tool_calls.get(call_id).cloned().unwrap_or_else(|| {
            let name = message
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            (name.to_owned(), Value::Null)
        });
        let name = json!(name);
        let tools = join_name("tools", ns);
        out.push((
            tools.clone(),
            json!({"event": "tool-started", "tool_call_id": call_id, "tool_name": name, "input": input}),
        ));
        if message.get("status").and_then(Value::as_str) == Some("error") {
            let text = text_of(message.get("content")).unwrap_or_default();
            out.push((
                tools,
                json!({"event": "tool-error", "tool_call_id": call_id, "message": text}),
            ));
        } else {
            out.push((
                tools,
                json!({"event": "tool-finished", "tool_call_id": call_id, "output": message}),
            ));
        }
    }
}

impl OpenMessage {
    fn new(ns: &[String], id: String) -> Self {
        Self {
            namespace: ns.to_vec(),
            id,
            text: String::new(),
            text_index: None,
            calls: Vec::new(),
            next_index: 0,
            usage: None,
        }
    }

    fn name(&self) -> String {
        join_name("messages", &self.namespace)
    }

    fn add_chunk(&mut self, chunk: &Value, out: &mut Vec<Logged>) {
        if let Some(text) = text_of(chunk.get("content")).filter(|t| !t.is_empty()) {
            let index = match self.text_index {
                Some(index) => index,
                None => {
                    let index = self.next_index;
                    self.next_index += 1;
                    self.text_index = Some(index);
                    out.push((
                        self.name(),
                        json!({"event": "content-block-start", "index": index,
                               "content": {"type": "text", "text": ""}}),
                    ));
                    index
                }
            };
            self.text.push_str(&text);
            out.push((
                self.name(),
                json!({"event": "content-block-delta", "index": index,
                       "delta": {"type": "text-delta", "text": text}}),
            ));
        }
        for chunk in chunk
            .get("tool_call_chunks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.add_call_chunk(chunk, out);
        }
        if let Some(usage) = chunk.get("usage_metadata").filter(|u| u.is_object()) {
            self.usage = Some(add_usage(self.usage.take(), usage));
        }
    }

    fn add_call_chunk(&mut self, chunk: &Value, out: &mut Vec<Logged>) {
        let chunk_index = chunk.get("index").cloned().unwrap_or(Value::Null);
        let text = |key: &str| chunk.get(key).and_then(Value::as_str).map(str::to_owned);
        let position = self
            .calls
            .iter()
            .position(|c| !chunk_index.is_null() && c.chunk_index == chunk_index);
        let position = match position {
            Some(position) => position,
            None => {
                let block = self.next_index;
                self.next_index += 1;
                out.push((
                    self.name(),
                    json!({"event": "content-block-start", "index": block,
                           "content": {"type": "tool_call_chunk", "id": text("id"),
                                       "name": text("name"), "args": ""}}),
                ));
                self.calls.push(CallBlock {
                    chunk_index,
                    block,
                    id: None,
                    name: None,
                    args: String::new(),
                });
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[position];
        if call.id.is_none() {
            call.id = text("id");
        }
        if call.name.is_none() {
            call.name = text("name");
        }
        if let Some(args) = text("args").filter(|a| !a.is_empty()) {
            call.args.push_str(&args);
            let block = call.block;
            out.push((
                self.name(),
                json!({"event": "content-block-delta", "index": block,
                       "delta": {"type": "tool-call-delta", "args": args}}),
            ));
        }
    }

    fn finish(self, out: &mut Vec<Logged>) {
        let name = self.name();
        let mut blocks: Vec<(usize, Value)> = Vec::new();
        if let Some(index) = self.text_index {
            blocks.push((index, json!({"type": "text", "text": self.text})));
        }
        for call in &self.calls {
            let args: Value = serde_json::from_str(&call.args).unwrap_or_else(|_| json!({}));
            blocks.push((
                call.block,
                json!({"type": "tool_call", "id": call.id, "name": call.name.clone().unwrap_or_default(), "args": args}),
            ));
        }
        blocks.sort_by_key(|(index, _)| *index);
        for (index, content) in blocks {
            out.push((
                name.clone(),
                json!({"event": "content-block-finish", "index": index, "content": content}),
            ));
        }
        out.push((name, message_finish(self.usage.as_ref())));
    }
}

fn message_finish(usage: Option<&Value>) -> Value {
    let mut finish = json!({"event": "message-finish"});
    if let Some(usage) = usage.and_then(Value::as_object) {
        let mut out = Map::new();
        for key in ["input_tokens", "output_tokens", "total_tokens"] {
            if let Some(n) = usage.get(key).filter(|n| n.is_u64()) {
                out.insert(key.into(), n.clone());
            }
        }
        finish["usage"] = Value::Object(out);
    }
    finish
}

fn add_usage(total: Option<Value>, more: &Value) -> Value {
    let mut total = total.unwrap_or_else(|| json!({}));
    for key in ["input_tokens", "output_tokens", "total_tokens"] {
        let sum = total.get(key).and_then(Value::as_u64).unwrap_or(0)
            + more.get(key).and_then(Value::as_u64).unwrap_or(0);
        total[key] = json!(sum);
    }
    total
}

/// Whether a whole message's metadata is a chat model's own: LangChain gives a model's call
/// the model's tracing parameters (`ls_model_type: "chat"`), and LangGraph reports a reply the
/// model did not stream with them at the model's end; a message a node returned carries the
/// node's metadata.
fn from_chat_model(metadata: Option<&Value>) -> bool {
    metadata
        .and_then(|m| m.get("ls_model_type"))
        .and_then(Value::as_str)
        == Some("chat")
}

/// A whole AI message as the one chunk it would have streamed in: its tool calls as tool call
/// chunks (arguments as JSON text).
fn as_one_chunk(message: &Value) -> Value {
    let calls: Vec<Value> = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(index, call)| {
            let args = call.get("args").cloned().unwrap_or_else(|| json!({}));
            json!({"index": index, "id": call.get("id"), "name": call.get("name"),
                   "args": args.to_string()})
        })
        .collect();
    json!({
        "content": message.get("content"),
        "tool_call_chunks": calls,
        "usage_metadata": message.get("usage_metadata"),
    })
}

fn message_type(message: &Value) -> &str {
    message
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The text of a message's content: a string, or the text blocks of a list.
pub fn text_of(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(text) => Some(text.clone()),
        Value::Array(items) => Some(
            items
                .iter()
                .filter_map(|item| match item {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(block) if block.get("type") == Some(&json!("text")) => {
                        block.get("text").and_then(Value::as_str)
                    }
                    _ => None,
                })
                .collect(),
        ),
        _ => None,
    }
}

/// The graph name of a namespace: its last segment without the task id (`child:3f` -> `child`).
fn graph_of(ns: &[String]) -> String {
    ns.last()
        .map(|s| s.split(':').next().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// A subgraph's `started`, with its namespace and the id of the task that runs it
/// (`trigger_call_id`, the segment's part after `:`), as the reference sends them.
fn started(ns: &[String]) -> Logged {
    let (name, mut data) = lifecycle(ns, "started", &graph_of(ns), None);
    let trigger = ns.last().and_then(|s| s.split_once(':')).map(|(_, id)| id);
    data = json!({
        "event": data["event"],
        "namespace": ns,
        "graph_name": data["graph_name"],
    });
    if let Some(id) = trigger {
        data["trigger_call_id"] = json!(id);
    }
    (name, data)
}

/// A lifecycle event of a namespace.
pub fn lifecycle(ns: &[String], status: &str, graph_name: &str, error: Option<&str>) -> Logged {
    let mut data = json!({"event": status, "graph_name": graph_name});
    if let Some(error) = error {
        data["error"] = json!(error);
    }
    (join_name("lifecycle", ns), data)
}

/// The root lifecycle event that ends a v2 run, logged in the transaction that ends it: a run
/// that stopped at an interrupt is `interrupted`, one that raised is `failed`.
/// `checkpoint` is the thread's latest checkpoint, the point to fork from.
pub fn terminal(
    graph_name: &str,
    status: RunStatus,
    thread_status: ThreadStatus,
    error: Option<&Value>,
    checkpoint: Option<&str>,
) -> Logged {
    let message = error.map(|e| {
        e.get("message")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| e.to_string())
    });
    let status = lifecycle_status(status, thread_status);
    let (name, mut data) = lifecycle(&[], status, graph_name, message.as_deref());
    if let Some(id) = checkpoint {
        data["checkpoint"] = json!({"id": id});
    }
    (name, data)
}

/// A run's status as a lifecycle status.
pub fn lifecycle_status(status: RunStatus, thread_status: ThreadStatus) -> &'static str {
    match status {
        RunStatus::Success if thread_status == ThreadStatus::Interrupted => "interrupted",
        RunStatus::Success => "completed",
        RunStatus::Interrupted => "interrupted",
        RunStatus::Pending | RunStatus::Running => "running",
        _ => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(mode: StreamMode, data: Value) -> StreamEvent {
        StreamEvent {
            namespace: Vec::new(),
            mode,
            part: None,
            data,
        }
    }

    fn events(out: &[Logged]) -> Vec<String> {
        out.iter()
            .map(|(name, data)| {
                format!(
                    "{name}:{}",
                    data.get("event").and_then(Value::as_str).unwrap_or("-")
                )
            })
            .collect()
    }

    #[test]
    fn whole_messages_a_node_returned_are_not_on_messages_but_make_tool_events() {
        let mut n = Normalizer::default();
        let ai = json!({"type": "ai", "id": "m1", "content": "",
            "tool_calls": [{"name": "add", "args": {"a": 2}, "id": "c1"}]});
        assert!(n.push(ev(StreamMode::Messages, json!([ai, {}]))).is_empty());
        let tool = json!({"type": "tool", "id": "t1", "content": "5", "tool_call_id": "c1"});
        let out = n.push(ev(StreamMode::Messages, json!([tool, {}])));
        assert_eq!(events(&out), ["tools:tool-started", "tools:tool-finished"]);
        assert_eq!(out[0].1["tool_name"], "add");
        assert_eq!(out[0].1["input"], json!({"a": 2}));
        // The same result in the node's update is not reported twice.
        let update = json!({"tools": {"messages": [tool_message()]}});
        let out = n.push(ev(StreamMode::Updates, update));
        assert_eq!(events(&out), ["updates:-"]);
    }

    #[test]
    fn a_chat_models_whole_reply_is_on_messages_as_one_chunk() {
        let mut n = Normalizer::default();
        let model = json!({"ls_model_type": "chat", "langgraph_node": "reply"});
        let reply = json!({"type": "ai", "id": "m1", "content": "quietly",
            "tool_calls": [{"name": "add", "args": {"a": 2}, "id": "c1"}],
            "usage_metadata": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}});
        let out = n.push(ev(StreamMode::Messages, json!([reply, model])));
        assert_eq!(
            events(&out),
            [
                "messages:message-start",
                "messages:content-block-start",
                "messages:content-block-delta",
                "messages:content-block-start",
                "messages:content-block-delta",
                "messages:content-block-finish",
                "messages:content-block-finish",
                "messages:message-finish"
            ]
        );
        assert_eq!(out[0].1["id"], "m1");
        assert_eq!(
            out[5].1["content"],
            json!({"type": "text", "text": "quietly"})
        );
        assert_eq!(
            out[6].1["content"],
            json!({"type": "tool_call", "id": "c1", "name": "add", "args": {"a": 2}})
        );
        assert_eq!(out[7].1["usage"]["total_tokens"], 3);
        // Its tool call is known when the tool's result comes.
        let tool = json!({"type": "tool", "id": "t1", "content": "5", "tool_call_id": "c1"});
        let out = n.push(ev(StreamMode::Messages, json!([tool, {}])));
        assert_eq!(out[0].1["input"], json!({"a": 2}));
        // A node's own whole message (the node's metadata) stays off `messages`.
        let node = json!({"type": "ai", "id": "m2", "content": "noted"});
        let meta = json!({"ls_integration": "langgraph", "langgraph_node": "note"});
        assert!(n
            .push(ev(StreamMode::Messages, json!([node, meta])))
            .is_empty());
    }

    #[test]
    fn a_streamed_reply_keeps_its_usage() {
        let mut n = Normalizer::default();
        let chunk = json!([{"type": "AIMessageChunk", "id": "m", "content": "hi",
            "usage_metadata": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
            "chunk_position": "last"}, {}]);
        let out = n.push(ev(StreamMode::Messages, chunk));
        assert_eq!(out.last().unwrap().1["usage"]["total_tokens"], 3);
    }

    fn tool_message() -> Value {
        json!({"type": "tool", "id": "t1", "content": "5", "tool_call_id": "c1"})
    }

    #[test]
    fn chunks_stream_as_deltas_and_finish_with_the_whole_text() {
        let mut n = Normalizer::default();
        let chunk =
            |text: &str| json!([{"type": "AIMessageChunk", "id": "m", "content": text}, {}]);
        let mut out = n.push(ev(StreamMode::Messages, chunk("Hello ")));
        out.extend(n.push(ev(StreamMode::Messages, chunk("world"))));
        out.extend(n.finish(None));
        assert_eq!(
            events(&out),
            [
                "messages:message-start",
                "messages:content-block-start",
                "messages:content-block-delta",
                "messages:content-block-delta",
                "messages:content-block-finish",
                "messages:message-finish"
            ]
        );
        assert_eq!(out[4].1["content"]["text"], "Hello world");
    }

    #[test]
    fn a_message_cut_off_by_a_failed_run_ends_with_an_error_event() {
        let mut n = Normalizer::default();
        let chunk = json!([{"type": "AIMessageChunk", "id": "m", "content": "Hel"}, {}]);
        let mut out = n.push(ev(StreamMode::Messages, chunk));
        out.extend(n.finish(Some("the model went away")));
        assert_eq!(
            events(&out),
            [
                "messages:message-start",
                "messages:content-block-start",
                "messages:content-block-delta",
                "messages:error"
            ]
        );
        assert_eq!(
            out[3].1,
            json!({"event": "error", "message": "the model went away"})
        );
        // Nothing is left open to finish again.
        assert!(n.finish(None).is_empty());
    }

    #[test]
    fn an_interrupt_becomes_input_requested_once() {
        let mut n = Normalizer::default();
        let update = json!({"__interrupt__": [{"value": {"q": 1}, "id": "i1"}]});
        let out = n.push(ev(StreamMode::Updates, update.clone()));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, "input.requested");
        assert_eq!(
            out[0].1,
            json!({"interrupt_id": "i1", "payload": {"q": 1}, "value": {"q": 1}})
        );
        assert!(n.push(ev(StreamMode::Updates, update)).is_empty());
    }

    #[test]
    fn terminal_status_follows_the_run_and_its_thread() {
        let (_, data) = terminal(
            "g",
            RunStatus::Success,
            ThreadStatus::Interrupted,
            None,
            Some("c"),
        );
        assert_eq!(data["event"], "interrupted");
        assert_eq!(data["checkpoint"], json!({"id": "c"}));
        let err = json!({"error": "ValueError", "message": "boom"});
        let (_, data) = terminal("g", RunStatus::Error, ThreadStatus::Error, Some(&err), None);
        assert_eq!(
            data,
            json!({"event": "failed", "graph_name": "g", "error": "boom"})
        );
    }

    #[test]
    fn subgraphs_start_when_seen_and_complete_after_their_nodes_update_and_result() {
        let mut n = Normalizer::default();
        let ns = vec!["child:1".to_string()];
        let inner = StreamEvent {
            namespace: ns.clone(),
            mode: StreamMode::Values,
            part: None,
            data: json!({}),
        };
        let out = n.push(inner.clone());
        assert_eq!(out[0].0, "lifecycle|child:1");
        assert_eq!(
            out[0].1,
            json!({"event": "started", "namespace": ["child:1"], "graph_name": "child",
                   "trigger_call_id": "1"})
        );
        assert_eq!(n.push(inner).len(), 1, "announced once");
        let out = n.push(ev(StreamMode::Updates, json!({"child": {"messages": []}})));
        assert_eq!(events(&out), ["updates:-"]);
        let result =
            json!({"id": "1", "name": "child", "error": null, "result": {}, "interrupts": []});
        let out = n.push(ev(StreamMode::Tasks, result));
        assert_eq!(events(&out), ["tasks:-", "lifecycle|child:1:completed"]);
        assert!(n.finish(None).is_empty());
        // Without a task result, the parent's next event completes it.
        let mut n = Normalizer::default();
        n.push(StreamEvent {
            namespace: ns,
            mode: StreamMode::Values,
            part: None,
            data: json!({}),
        });
        n.push(ev(StreamMode::Updates, json!({"child": {}})));
        let out = n.push(ev(StreamMode::Values, json!({})));
        assert_eq!(events(&out), ["lifecycle|child:1:completed", "values:-"]);
    }
}
