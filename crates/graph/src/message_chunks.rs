//! LangChain's message chunk arithmetic on message dicts: adding token chunks of one message
//! (`AIMessageChunk.__add__`) and turning the sum into a plain message
//! (`message_chunk_to_message`). The `messages` stream mode sends these sums.

use serde_json::{json, Map, Value};

/// Whether a message dict is a chunk (`AIMessageChunk`, `ToolMessageChunk`, ...).
pub fn is_chunk(msg: &Value) -> bool {
    msg.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t.ends_with("Chunk"))
}

/// Add `chunk` to `acc`, both chunks of the same message: contents concatenate, dicts merge,
/// tool call chunks merge by `index`, token usage adds up.
pub fn add_chunk(acc: &mut Value, chunk: &Value) {
    let (Value::Object(left), Value::Object(right)) = (acc, chunk) else {
        return;
    };
    let content = merge_content(
        left.get("content").unwrap_or(&Value::Null),
        right.get("content").unwrap_or(&Value::Null),
    );
    left.insert("content".into(), content);
    for key in ["additional_kwargs", "response_metadata"] {
        let mut merged = left
            .get(key)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if let Some(Value::Object(r)) = right.get(key) {
            merge_dicts(&mut merged, r);
        }
        left.insert(key.into(), Value::Object(merged));
    }
    if let Some(Value::Array(r)) = right.get("tool_call_chunks") {
        let mut merged = match left.get("tool_call_chunks") {
            Some(Value::Array(l)) => l.clone(),
            _ => Vec::new(),
        };
        merge_lists(&mut merged, r);
        left.insert("tool_call_chunks".into(), Value::Array(merged));
    }
    let usage = add_usage(
        left.get("usage_metadata").unwrap_or(&Value::Null),
        right.get("usage_metadata").unwrap_or(&Value::Null),
    );
    left.insert("usage_metadata".into(), usage);
    let id = best_id(left.get("id"), right.get("id"));
    left.insert("id".into(), id);
    if right.get("chunk_position").and_then(Value::as_str) == Some("last") {
        left.insert("chunk_position".into(), json!("last"));
    }
}

/// A chunk (or a sum of chunks) as the plain message it amounts to: `AIMessageChunk`
/// becomes `ai`, with its tool calls parsed from the tool call chunks. Plain messages are
/// returned as they are.
pub fn chunk_to_message(msg: &Value) -> Value {
    let Value::Object(m) = msg else {
        return msg.clone();
    };
    let Some(kind) = m.get("type").and_then(Value::as_str) else {
        return msg.clone();
    };
    let Some(base) = kind.strip_suffix("MessageChunk") else {
        return msg.clone();
    };
    let mut out = m.clone();
    out.insert("type".into(), json!(plain_type(base)));
    if base == "AI" {
        let chunks = out.remove("tool_call_chunks");
        out.remove("chunk_position");
        if let Some(Value::Array(chunks)) =
            chunks.filter(|c| c.as_array().is_some_and(|a| !a.is_empty()))
        {
            let (calls, invalid) = parse_tool_call_chunks(&chunks);
            out.insert("tool_calls".into(), Value::Array(calls));
            out.insert("invalid_tool_calls".into(), Value::Array(invalid));
        }
    }
    Value::Object(out)
}

fn plain_type(base: &str) -> String {
    match base {
        "AI" => "ai".into(),
        other => other.to_lowercase(),
    }
}

/// Tool calls from tool call chunks, as `AIMessageChunk.init_tool_calls` builds them:
/// arguments that do not parse (even as a prefix) make an invalid tool call.
fn parse_tool_call_chunks(chunks: &[Value]) -> (Vec<Value>, Vec<Value>) {
    let mut calls = Vec::new();
    let mut invalid = Vec::new();
    for c in chunks {
        let args = c.get("args").and_then(Value::as_str).unwrap_or_default();
        let parsed = if args.is_empty() {
            Some(json!({}))
        } else {
            parse_partial_json(args)
        };
        match parsed {
            Some(args @ Value::Object(_)) => calls.push(json!({
                "name": c.get("name").and_then(Value::as_str).unwrap_or_default(),
                "args": args,
                "id": c.get("id").cloned().unwrap_or(Value::Null),
                "type": "tool_call",
            })),
            _ => invalid.push(json!({
                "name": c.get("name").cloned().unwrap_or(Value::Null),
                "args": c.get("args").cloned().unwrap_or(Value::Null),
                "id": c.get("id").cloned().unwrap_or(Value::Null),
                "error": null,
                "type": "invalid_tool_call",
            })),
        }
    }
    (calls, invalid)
}

/// JSON that may be cut short, as LangChain's `parse_partial_json` reads it: open strings
/// and brackets are closed, and trailing characters dropped until what is left parses.
pub fn parse_partial_json(s: &str) -> Option<Value> {
    if let Ok(v) = serde_json::from_str(s) {
        return Some(v);
    }
    let mut chars: Vec<char> = Vec::with_capacity(s.len() + 8);
    let mut closers: Vec<char> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    for c in s.chars() {
        if in_string {
            if c == '"' && !escaped {
                in_string = false;
            } else if c == '\n' && !escaped {
                chars.extend(['\\', 'n']);
                continue;
            } else if c == '\\' {
                escaped = !escaped;
            } else {
                escaped = false;
            }
        } else if c == '"' {
            in_string = true;
            escaped = false;
        } else if c == '{' {
            closers.push('}');
        } else if c == '[' {
            closers.push(']');
        } else if c == '}' || c == ']' {
            if closers.last() != Some(&c) {
                return None;
            }
            closers.pop();
        }
        chars.push(c);
    }
    if in_string {
        if escaped {
            chars.pop();
        }
        chars.push('"');
    }
    let tail: String = closers.iter().rev().collect();
    while !chars.is_empty() {
        let mut candidate: String = chars.iter().collect();
        candidate.push_str(&tail);
        if let Ok(v) = serde_json::from_str(&candidate) {
            return Some(v);
        }
        chars.pop();
    }
    None
}

/// `merge_content`: strings concatenate; lists of content blocks merge by `index`.
fn merge_content(left: &Value, right: &Value) -> Value {
    match (left, right) {
        (Value::Null, r) => r.clone(),
        (l, Value::Null) => l.clone(),
        (Value::String(l), Value::String(r)) => Value::String(format!("{l}{r}")),
        (Value::String(l), Value::Array(r)) => {
            let mut out = vec![Value::String(l.clone())];
            out.extend(r.iter().cloned());
            Value::Array(out)
        }
        (Value::Array(l), Value::Array(r)) => {
            let mut out = l.clone();
            merge_lists(&mut out, r);
            Value::Array(out)
        }
        (Value::Array(l), Value::String(r)) => {
            let mut out = l.clone();
            match out.last_mut() {
                Some(Value::String(last)) => last.push_str(r),
                _ if r.is_empty() => {}
                _ => out.push(Value::String(r.clone())),
            }
            Value::Array(out)
        }
        (l, _) => l.clone(),
    }
}

/// `merge_dicts`: keys only on the right are added, strings concatenate (ids and a few
/// identifying keys excepted), dicts and lists merge, numbers add (indexes excepted).
fn merge_dicts(left: &mut Map<String, Value>, right: &Map<String, Value>) {
    for (k, r) in right {
        let Some(l) = left.get_mut(k) else {
            left.insert(k.clone(), r.clone());
            continue;
        };
        match (l, r) {
            (_, Value::Null) => {}
            (l @ Value::Null, r) => *l = r.clone(),
            (Value::String(l), Value::String(r)) => {
                let keep = (k == "index" && l.starts_with("lc_"))
                    || (["id", "output_version", "model_provider"].contains(&k.as_str()) && l == r);
                if !keep {
                    l.push_str(r);
                }
            }
            (Value::Object(l), Value::Object(r)) => merge_dicts(l, r),
            (Value::Array(l), Value::Array(r)) => merge_lists(l, r),
            (Value::Number(l), Value::Number(r)) => {
                if ["index", "created", "timestamp"].contains(&k.as_str()) {
                    *l = r.clone();
                } else if let (Some(a), Some(b)) = (l.as_i64(), r.as_i64()) {
                    *l = (a + b).into();
                } else if let Some(sum) = l
                    .as_f64()
                    .zip(r.as_f64())
                    .and_then(|(a, b)| serde_json::Number::from_f64(a + b))
                {
                    *l = sum;
                }
            }
            // Values of different kinds cannot merge; LangChain raises, a stream keeps the
            // first value rather than failing the run.
            _ => {}
        }
    }
}

/// `merge_lists`: an element with an `index` merges into the element with the same index
/// (and no conflicting id); anything else is appended.
fn merge_lists(left: &mut Vec<Value>, right: &[Value]) {
    for e in right {
        let index = e.get("index").filter(|i| {
            i.is_i64() || i.is_u64() || i.as_str().is_some_and(|s| s.starts_with("lc_"))
        });
        let target = index.and_then(|idx| {
            left.iter().position(|l| {
                l.get("index") == Some(idx) && ids_compatible(l.get("id"), e.get("id"))
            })
        });
        match (target, e) {
            (Some(t), Value::Object(new)) => {
                let mut new = new.clone();
                new.remove("type");
                if let Value::Object(l) = &mut left[t] {
                    merge_dicts(l, &new);
                }
            }
            _ => left.push(e.clone()),
        }
    }
}

fn ids_compatible(a: Option<&Value>, b: Option<&Value>) -> bool {
    let blank = |v: Option<&Value>| v.is_none_or(|v| v.is_null() || v.as_str() == Some(""));
    blank(a) || blank(b) || a == b
}

/// Token usage of two chunks added up, key by key.
fn add_usage(left: &Value, right: &Value) -> Value {
    match (left, right) {
        (Value::Null, r) => r.clone(),
        (l, Value::Null) => l.clone(),
        (Value::Object(l), Value::Object(r)) => {
            let mut out = l.clone();
            for (k, rv) in r {
                let sum = match out.get(k) {
                    Some(lv) => add_usage(lv, rv),
                    None => rv.clone(),
                };
                out.insert(k.clone(), sum);
            }
            Value::Object(out)
        }
        (Value::Number(l), Value::Number(r)) => match (l.as_i64(), r.as_i64()) {
            (Some(a), Some(b)) => json!(a + b),
            _ => left.clone(),
        },
        (l, _) => l.clone(),
    }
}

/// The id a sum of chunks keeps: a provider's id over LangChain's `lc_run-` ids over other
/// `lc_` ids, the first of each rank.
fn best_id(left: Option<&Value>, right: Option<&Value>) -> Value {
    let rank = |id: &str| {
        if !id.starts_with("lc_") {
            2
        } else if id.starts_with("lc_run-") {
            1
        } else {
            0
        }
    };
    let mut best: Option<&str> = None;
    for id in [left, right]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        if best.is_none_or(|b| rank(id) > rank(b)) {
            best = Some(id);
        }
    }
    best.map_or(Value::Null, |b| json!(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(content: &str, tool_call_chunks: Value) -> Value {
        json!({
            "content": content, "additional_kwargs": {}, "response_metadata": {},
            "type": "AIMessageChunk", "name": null, "id": "lc_run--x", "tool_calls": [],
            "invalid_tool_calls": [], "usage_metadata": null,
            "tool_call_chunks": tool_call_chunks, "chunk_position": null,
        })
    }

    // Expected values below are what langchain-core 1.x answers for the same chunks.
    #[test]
    fn contents_concatenate_and_the_sum_is_an_ai_message() {
        let mut acc = chunk("Hello", json!([]));
        add_chunk(&mut acc, &chunk(" ", json!([])));
        let mut last = chunk("world", json!([]));
        last["chunk_position"] = json!("last");
        add_chunk(&mut acc, &last);
        assert_eq!(acc["chunk_position"], "last");
        assert_eq!(
            chunk_to_message(&acc),
            json!({
                "content": "Hello world", "additional_kwargs": {}, "response_metadata": {},
                "type": "ai", "name": null, "id": "lc_run--x", "tool_calls": [],
                "invalid_tool_calls": [], "usage_metadata": null,
            })
        );
    }

    #[test]
    fn tool_call_chunks_merge_by_index_and_parse_partially() {
        let first = chunk(
            "",
            json!([{"name": "add", "args": "{\"a\": 2, \"b", "id": "c1", "index": 0, "type": "tool_call_chunk"}]),
        );
        assert_eq!(
            chunk_to_message(&first)["tool_calls"],
            json!([{"name": "add", "args": {"a": 2}, "id": "c1", "type": "tool_call"}])
        );
        let mut second = chunk(
            "",
            json!([{"name": null, "args": "\": 3}", "id": null, "index": 0, "type": "tool_call_chunk"}]),
        );
        second["usage_metadata"] =
            json!({"input_tokens": 1, "output_tokens": 2, "total_tokens": 3});
        let mut acc = first;
        add_chunk(&mut acc, &second);
        assert_eq!(
            acc["tool_call_chunks"],
            json!([{"name": "add", "args": "{\"a\": 2, \"b\": 3}", "id": "c1", "index": 0, "type": "tool_call_chunk"}])
        );
        let msg = chunk_to_message(&acc);
        assert_eq!(
            msg["tool_calls"],
            json!([{"name": "add", "args": {"a": 2, "b": 3}, "id": "c1", "type": "tool_call"}])
        );
        assert_eq!(msg["usage_metadata"]["total_tokens"], 3);
        assert!(msg.get("tool_call_chunks").is_none());
    }

    #[test]
    fn partial_json() {
        assert_eq!(
            parse_partial_json("{\"a\": [1, 2"),
            Some(json!({"a": [1, 2]}))
        );
        assert_eq!(parse_partial_json("{\"s\": \"ab"), Some(json!({"s": "ab"})));
        assert_eq!(parse_partial_json("{\"a\": 1}}"), None);
        assert_eq!(parse_partial_json(""), None);
    }

    #[test]
    fn provider_ids_win_over_langchain_ids() {
        assert_eq!(
            best_id(Some(&json!("lc_run--1")), Some(&json!("chatcmpl-9"))),
            json!("chatcmpl-9")
        );
        assert_eq!(
            best_id(Some(&json!("lc_1")), Some(&json!("lc_run--2"))),
            json!("lc_run--2")
        );
    }

    #[test]
    fn plain_messages_are_left_alone() {
        let m = json!({"type": "ai", "content": "x", "id": "1"});
        assert_eq!(chunk_to_message(&m), m);
        assert!(!is_chunk(&m));
    }
}
