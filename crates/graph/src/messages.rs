//! LangChain-shaped chat messages and the `add_messages` reducer.
//!
//! Clients send loose forms (`{"role":"user","content":"hi"}`, a bare string, a `[role, text]`
//! pair); LangGraph stores every message as the dict LangChain serialises, so the state and the
//! stream payloads look the same whichever client wrote them. Field order follows LangChain's
//! serialisation because clients and snapshot tests compare payloads textually.

use serde_json::{json, Map, Value};

/// The id a `RemoveMessage` carries to clear the whole history (LangGraph's
/// `REMOVE_ALL_MESSAGES`).
pub const REMOVE_ALL_MESSAGES: &str = "__remove_all__";

/// Why a value could not be read as a message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct MessageError(pub String);

/// A fresh message id. LangChain uses uuid4 strings.
pub fn new_message_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn canonical_type(raw: &str) -> Option<&'static str> {
    Some(match raw {
        "human" | "user" | "HumanMessage" | "HumanMessageChunk" => "human",
        "ai" | "assistant" | "AIMessage" => "ai",
        "AIMessageChunk" => "AIMessageChunk",
        "system" | "developer" | "SystemMessage" => "system",
        "tool" | "ToolMessage" => "tool",
        "function" | "FunctionMessage" => "function",
        "remove" | "RemoveMessage" => "remove",
        "chat" | "ChatMessage" => "chat",
        _ => return None,
    })
}

/// Coerce one loose message into LangChain's dict form. Ids are kept when given and left
/// `null` otherwise; [`add_messages`] assigns the missing ones.
pub fn coerce_message(value: &Value) -> Result<Value, MessageError> {
    match value {
        Value::String(text) => Ok(build("human", Value::String(text.clone()), &Map::new())),
        Value::Array(pair) if pair.len() == 2 => {
            let role = pair[0]
                .as_str()
                .ok_or_else(|| MessageError("a [role, content] pair needs a string role".into()))?;
            let kind = canonical_type(role)
                .ok_or_else(|| MessageError(format!("unknown message role `{role}`")))?;
            Ok(build(kind, pair[1].clone(), &Map::new()))
        }
        Value::Object(obj) => {
            let raw = obj
                .get("type")
                .or_else(|| obj.get("role"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    MessageError("a message needs a `type` or a `role` field".to_string())
                })?;
            let kind = canonical_type(raw)
                .ok_or_else(|| MessageError(format!("unknown message type `{raw}`")))?;
            let content = obj
                .get("content")
                .cloned()
                .unwrap_or(Value::String(String::new()));
            Ok(build(kind, content, obj))
        }
        other => Err(MessageError(format!(
            "cannot read {} as a message",
            type_name(other)
        ))),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn field(obj: &Map<String, Value>, key: &str, default: Value) -> Value {
    match obj.get(key) {
        Some(Value::Null) | None => default,
        Some(v) => v.clone(),
    }
}

fn build(kind: &str, content: Value, obj: &Map<String, Value>) -> Value {
    let mut m = Map::new();
    if kind == "remove" {
        m.insert("content".into(), Value::String(String::new()));
        m.insert("additional_kwargs".into(), json!({}));
        m.insert("response_metadata".into(), json!({}));
        m.insert("type".into(), json!("remove"));
        m.insert("name".into(), field(obj, "name", Value::Null));
        m.insert("id".into(), field(obj, "id", Value::Null));
        return Value::Object(m);
    }
    m.insert("content".into(), content);
    m.insert(
        "additional_kwargs".into(),
        field(obj, "additional_kwargs", json!({})),
    );
    m.insert(
        "response_metadata".into(),
        field(obj, "response_metadata", json!({})),
    );
    m.insert("type".into(), Value::String(kind.to_string()));
    m.insert("name".into(), field(obj, "name", Value::Null));
    m.insert("id".into(), field(obj, "id", Value::Null));
    match kind {
        "ai" | "AIMessageChunk" => {
            let tool_calls = field(obj, "tool_calls", json!([]));
            m.insert("tool_calls".into(), normalise_tool_calls(tool_calls));
            m.insert(
                "invalid_tool_calls".into(),
                field(obj, "invalid_tool_calls", json!([])),
            );
            m.insert(
                "usage_metadata".into(),
                field(obj, "usage_metadata", Value::Null),
            );
            if kind == "AIMessageChunk" {
                m.insert(
                    "tool_call_chunks".into(),
                    field(obj, "tool_call_chunks", json!([])),
                );
            }
        }
        "tool" => {
            m.insert("tool_call_id".into(), field(obj, "tool_call_id", json!("")));
            m.insert("artifact".into(), field(obj, "artifact", Value::Null));
            m.insert("status".into(), field(obj, "status", json!("success")));
        }
        "chat" => {
            m.insert("role".into(), field(obj, "role", json!("")));
        }
        _ => {}
    }
    for (k, v) in obj {
        // Keep extra fields a client sent (e.g. `example`) rather than silently dropping them.
        if !m.contains_key(k) && k != "role" {
            m.insert(k.clone(), v.clone());
        }
    }
    Value::Object(m)
}

/// OpenAI-style tool calls (`{"function": {"name", "arguments": "<json>"}}`) become LangChain's
/// `{name, args, id, type: "tool_call"}`.
fn normalise_tool_calls(calls: Value) -> Value {
    let Value::Array(calls) = calls else {
        return json!([]);
    };
    Value::Array(
        calls
            .into_iter()
            .map(|call| {
                if let Some(function) = call.get("function") {
                    let args = match function.get("arguments") {
                        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(json!({})),
                        Some(v) => v.clone(),
                        None => json!({}),
                    };
                    json!({
                        "name": function.get("name").cloned().unwrap_or(json!("")),
                        "args": args,
                        "id": call.get("id").cloned().unwrap_or(Value::Null),
                        "type": "tool_call",
                    })
                } else {
                    let mut c = call;
                    if let Value::Object(o) = &mut c {
                        o.entry("args").or_insert(json!({}));
                        o.entry("id").or_insert(Value::Null);
                        o.entry("type").or_insert(json!("tool_call"));
                    }
                    c
                }
            })
            .collect(),
    )
}

/// Coerce an update for a messages channel: one message or a list of them.
pub fn coerce_messages(value: &Value) -> Result<Vec<Value>, MessageError> {
    match value {
        Value::Array(items) if !is_role_pair(items) => items.iter().map(coerce_message).collect(),
        other => Ok(vec![coerce_message(other)?]),
    }
}

fn is_role_pair(items: &[Value]) -> bool {
    items.len() == 2
        && items[0]
            .as_str()
            .is_some_and(|s| canonical_type(s).is_some())
        && items[1].is_string()
}

fn ensure_id(msg: &mut Value) {
    if let Value::Object(o) = msg {
        if !matches!(o.get("id"), Some(Value::String(_))) {
            o.insert("id".into(), Value::String(new_message_id()));
        }
    }
}

/// The id of a coerced message (every message has one after [`add_messages`]).
pub fn message_id(msg: &Value) -> Option<&str> {
    msg.get("id").and_then(Value::as_str)
}

/// The outcome of merging: the new list plus what changed, so checkpoints can store a delta.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct MergeDelta {
    /// Messages added or replaced (by id), in the order they were written.
    pub upserted: Vec<Value>,
    /// Ids removed.
    pub removed: Vec<String>,
    /// True when everything before was cleared (`REMOVE_ALL_MESSAGES`).
    pub cleared: bool,
}

/// LangGraph's `add_messages`: merge `right` into `left` by message id. A message whose id is
/// already present replaces it in place; a new one is appended; a `remove` message deletes the
/// message with its id (an unknown id is an error, as in LangGraph).
pub fn add_messages(left: &mut Vec<Value>, right: &Value) -> Result<MergeDelta, MessageError> {
    let mut incoming = coerce_messages(right)?;
    let mut delta = MergeDelta::default();
    for m in left.iter_mut() {
        ensure_id(m);
    }
    for m in incoming.iter_mut() {
        ensure_id(m);
    }
    // Only the part after the last remove-all counts.
    if let Some(pos) = incoming.iter().rposition(|m| {
        m.get("type").and_then(Value::as_str) == Some("remove")
            && message_id(m) == Some(REMOVE_ALL_MESSAGES)
    }) {
        left.clear();
        incoming.drain(..=pos);
        delta.cleared = true;
    }
    // Index only the ids being written: one allocation-free pass over a long history.
    let wanted: std::collections::HashSet<String> = incoming
        .iter()
        .filter_map(|m| message_id(m).map(str::to_string))
        .collect();
    let mut index: std::collections::HashMap<String, usize> = left
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            message_id(m)
                .filter(|id| wanted.contains(*id))
                .map(|id| (id.to_string(), i))
        })
        .collect();
    let mut removed: Vec<usize> = Vec::new();
    for m in incoming {
        let id = message_id(&m).unwrap_or_default().to_string();
        let is_remove = m.get("type").and_then(Value::as_str) == Some("remove");
        match (index.get(&id).copied(), is_remove) {
            (Some(i), true) => {
                removed.push(i);
                index.remove(&id);
                delta.removed.push(id);
            }
            (None, true) => {
                return Err(MessageError(format!(
                    "Attempting to delete a message with an ID that doesn't exist ('{id}')"
                )))
            }
            (Some(i), false) => {
                left[i] = m.clone();
                delta.upserted.push(m);
            }
            (None, false) => {
                index.insert(id, left.len());
                left.push(m.clone());
                delta.upserted.push(m);
            }
        }
    }
    if !removed.is_empty() {
        removed.sort_unstable();
        let mut k = 0;
        let mut i = 0;
        left.retain(|_| {
            let drop = k < removed.len() && removed[k] == i;
            if drop {
                k += 1;
            }
            i += 1;
            !drop
        });
    }
    Ok(delta)
}

/// A message's text: `content` when it is a string, the text parts joined when it is a list.
pub fn message_text(msg: &Value) -> String {
    match msg.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.as_str().or_else(|| p.get("text").and_then(Value::as_str)))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// An AI message in LangChain's dict form.
pub fn ai_message(content: impl Into<Value>, tool_calls: Vec<Value>, id: Option<String>) -> Value {
    let mut obj = Map::new();
    obj.insert("tool_calls".into(), Value::Array(tool_calls));
    if let Some(id) = id {
        obj.insert("id".into(), Value::String(id));
    }
    build("ai", content.into(), &obj)
}

/// A tool message in LangChain's dict form.
pub fn tool_message(
    content: impl Into<Value>,
    tool_call_id: &str,
    name: &str,
    error: bool,
) -> Value {
    let mut obj = Map::new();
    obj.insert("tool_call_id".into(), json!(tool_call_id));
    obj.insert("name".into(), json!(name));
    obj.insert(
        "status".into(),
        json!(if error { "error" } else { "success" }),
    );
    build("tool", content.into(), &obj)
}
