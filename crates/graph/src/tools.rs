//! Tools a model can call: `http` (a request built from the arguments), `script`, and
//! `graph` (another graph run with the arguments: a sub-agent as a tool).

use std::sync::Arc;

use serde_json::{json, Value};

use crate::context::TaskContext;
use crate::graph::Graph;
use crate::model::ToolSchema;
use crate::node::NodeError;
use crate::script::Script;
use crate::stream::StreamMode;

/// How a tool runs.
pub enum ToolImpl {
    /// A Rhai script with `args` in scope; its value is the result.
    Script(Arc<Script>),
    /// An HTTP request. `{name}` in the URL is replaced by the URL-encoded argument; the
    /// remaining arguments go in the query (GET, DELETE) or the JSON body.
    Http {
        /// HTTP method.
        method: reqwest::Method,
        /// URL template.
        url: String,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// Client.
        client: reqwest::Client,
    },
    /// A graph run with the call's arguments as its input (or what `input` makes of them);
    /// its answer is `output`'s value, else the text of its last message, else its values.
    Graph {
        /// The graph.
        graph: Arc<Graph>,
        /// Makes the graph's input from `args`.
        input: Option<Arc<Script>>,
        /// Makes the tool's result from `result` (the graph's values) and `args`.
        output: Option<Arc<Script>>,
    },
}

/// A tool.
pub struct Tool {
    /// What the model sees.
    pub schema: ToolSchema,
    /// How it runs.
    pub imp: ToolImpl,
}

fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Check arguments against the tool's schema: required keys and the basic type of each
/// declared property. Models get this wrong often enough that the error message should say
/// what is wrong, so the model can correct itself.
fn check_args(schema: &Value, args: &Value) -> Result<(), String> {
    let Some(obj) = args.as_object() else {
        return Err(format!("arguments must be an object, got {args}"));
    };
    for req in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(k) = req.as_str() {
            if !obj.contains_key(k) {
                return Err(format!("missing required argument `{k}`"));
            }
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    for (k, v) in obj {
        let Some(t) = props
            .and_then(|p| p.get(k))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let ok = match t {
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "object" => v.is_object(),
            "array" => v.is_array(),
            _ => true,
        };
        if !ok {
            return Err(format!("argument `{k}` must be of type {t}, got {v}"));
        }
    }
    Ok(())
}

impl Tool {
    /// Run with the call's arguments; the result becomes the tool message's content. With
    /// `deltas` (the call's id, when the `tools` stream mode is wanted), output that arrives
    /// in parts (an HTTP response's body) is also streamed as `tool-output-delta` events.
    pub async fn call(
        &self,
        args: &Value,
        ctx: &TaskContext,
        deltas: Option<&str>,
    ) -> Result<String, NodeError> {
        self.call_as(args, ctx, deltas, None).await
    }

    /// [`Tool::call`] for the call `call_id` (a graph tool's runs stay apart by it).
    async fn call_as(
        &self,
        args: &Value,
        ctx: &TaskContext,
        deltas: Option<&str>,
        call_id: Option<&str>,
    ) -> Result<String, NodeError> {
        check_args(&self.schema.parameters, args).map_err(|m| {
            NodeError::new(
                "ToolException",
                format!("invalid arguments for `{}`: {m}", self.schema.name),
            )
        })?;
        match &self.imp {
            ToolImpl::Script(script) => {
                let v = script
                    .eval(&[("args", args.clone())], ctx)
                    .await
                    .map_err(|e| e.at(&format!("tool '{}'", self.schema.name)))?;
                Ok(plain(&v))
            }
            ToolImpl::Http {
                method,
                url,
                headers,
                client,
            } => {
                let mut rest = args.as_object().cloned().unwrap_or_default();
                let mut target = url.clone();
                for (k, v) in args.as_object().into_iter().flatten() {
                    let hole = format!("{{{k}}}");
                    if target.contains(&hole) {
                        target = target.replace(&hole, &encode(&plain(v)));
                        rest.remove(k);
                    }
                }
                let mut req = client.request(method.clone(), &target);
                for (k, v) in headers {
                    req = req.header(k, v);
                }
                req = if matches!(*method, reqwest::Method::GET | reqwest::Method::DELETE) {
                    let q: Vec<(String, String)> =
                        rest.iter().map(|(k, v)| (k.clone(), plain(v))).collect();
                    req.query(&q)
                } else {
                    req.json(&Value::Object(rest))
                };
                let fail = |m: String| NodeError::new("ToolException", m);
                let resp = tokio::select! {
                    _ = ctx.cancel_token().cancelled() => return Err(NodeError::Cancelled),
                    r = req.send() => r.map_err(|e| fail(format!("request failed: {e}")))?,
                };
                let status = resp.status();
                if !status.is_success() {
                    let text = resp.text().await.map_err(|e| fail(e.to_string()))?;
                    return Err(fail(format!("HTTP {status}: {text}")));
                }
                read_body(resp, ctx, deltas).await
            }
            ToolImpl::Graph {
                graph,
                input,
                output,
            } => {
                let at = |e: NodeError| e.at(&format!("tool '{}'", self.schema.name));
                let graph_input = match input {
                    Some(script) => script
                        .eval(&[("args", args.clone())], ctx)
                        .await
                        .map_err(at)?,
                    None => args.clone(),
                };
                let call = format!(
                    "{}:{}",
                    self.schema.name,
                    call_id.map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string)
                );
                let result = crate::pregel::run_graph_call(graph, graph_input, ctx, &call)
                    .await
                    .map_err(at)?;
                match output {
                    Some(script) => {
                        let vars = [("result", result), ("args", args.clone())];
                        Ok(plain(&script.eval(&vars, ctx).await.map_err(at)?))
                    }
                    None => Ok(graph_answer(&result)),
                }
            }
        }
    }
}

/// What a graph tool answers by default: the text of the last message it wrote under
/// `messages`, else its values as JSON.
fn graph_answer(values: &Value) -> String {
    match values
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
    {
        Some(last) => crate::messages::message_text(last),
        None => values.to_string(),
    }
}

/// A successful response's body as text, read as it arrives: each part is streamed as a
/// `tool-output-delta` of the call `deltas` names, if any.
async fn read_body(
    mut resp: reqwest::Response,
    ctx: &TaskContext,
    deltas: Option<&str>,
) -> Result<String, NodeError> {
    let mut text = String::new();
    let mut pending = Vec::new();
    loop {
        let chunk = tokio::select! {
            _ = ctx.cancel_token().cancelled() => return Err(NodeError::Cancelled),
            c = resp.chunk() => c.map_err(|e| NodeError::new("ToolException", e.to_string()))?,
        };
        let Some(chunk) = chunk else { break };
        pending.extend_from_slice(&chunk);
        let delta = complete_text(&mut pending);
        if delta.is_empty() {
            continue;
        }
        if let Some(call_id) = deltas {
            let event = json!({"event": "tool-output-delta", "tool_call_id": call_id,
                               "delta": delta});
            ctx.run.emit(&ctx.graph_ns, StreamMode::Tools, event).await;
        }
        text.push_str(&delta);
    }
    // Bytes of a character the body never completed.
    text.push_str(&String::from_utf8_lossy(&pending));
    Ok(text)
}

/// Takes the text `bytes` start with, leaving a character split at their end for the next
/// part to complete. Bytes that are not UTF-8 become U+FFFD.
fn complete_text(bytes: &mut Vec<u8>) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            let text = text.to_owned();
            bytes.clear();
            text
        }
        Err(e) if e.error_len().is_none() => {
            let rest = bytes.split_off(e.valid_up_to());
            let text = String::from_utf8_lossy(bytes).into_owned();
            *bytes = rest;
            text
        }
        Err(_) => {
            let text = String::from_utf8_lossy(bytes).into_owned();
            bytes.clear();
            text
        }
    }
}

/// Call a tool, announced in the `tools` stream mode as it starts, as its output arrives (when
/// it arrives in parts) and as it ends, and shown in
/// `events` as a tool run below the node. Returns the tool message.
pub(crate) async fn announced_call(
    tool: &Tool,
    args: &Value,
    call_id: &str,
    ctx: &TaskContext,
) -> Result<Value, NodeError> {
    let ns = &ctx.graph_ns;
    let announce = ctx.run.wants(StreamMode::Tools, ns);
    if announce {
        let started = json!({"event": "tool-started", "tool_call_id": call_id,
                             "tool_name": tool.schema.name, "input": args});
        ctx.run.emit(ns, StreamMode::Tools, started).await;
    }
    let result = traced_call(tool, args, call_id, announce, ctx).await;
    let ended = match &result {
        Ok(message) => Some(json!({"event": "tool-finished", "tool_call_id": call_id,
                                   "output": message})),
        // The exception's text, as the reference sends `str(error)`.
        Err(NodeError::Failed { message, .. }) => Some(json!({"event": "tool-error",
            "tool_call_id": call_id, "message": message})),
        // Cancelled or interrupted: the tool did not end, it runs again on resume.
        Err(_) => None,
    };
    if let (true, Some(ended)) = (announce, ended) {
        ctx.run.emit(ns, StreamMode::Tools, ended).await;
    }
    result
}

/// Call a tool, shown in `events` as a tool run below the node (`on_tool_start`, then
/// `on_tool_end` with the tool message, or `on_tool_error`). Returns the tool message.
async fn traced_call(
    tool: &Tool,
    args: &Value,
    call_id: &str,
    announce: bool,
    ctx: &TaskContext,
) -> Result<Value, NodeError> {
    let name = tool.schema.name.as_str();
    let deltas = announce.then_some(call_id);
    let Some(trace) = ctx.child_trace(name, "seq:step:1", || ctx.inner_metadata()) else {
        let content = tool.call_as(args, ctx, deltas, Some(call_id)).await?;
        return Ok(success_message(content, call_id, name));
    };
    trace
        .emit(&ctx.run, "on_tool_start", json!({ "input": args }))
        .await;
    match tool.call_as(args, ctx, deltas, Some(call_id)).await {
        Ok(content) => {
            let msg = success_message(content, call_id, name);
            trace
                .end(&ctx.run, "on_tool_end", msg.clone(), args.clone())
                .await;
            Ok(msg)
        }
        Err(err) => {
            if let NodeError::Failed { class, message, .. } = &err {
                let data = json!({
                    "error": {"error": class, "message": message},
                    "input": args,
                    "tool_call_id": call_id,
                });
                trace.emit(&ctx.run, "on_tool_error", data).await;
            }
            Err(err)
        }
    }
}

/// A tool's answer as a tool message. Its id is set here, so `on_tool_end` shows the same
/// message the node returns.
fn success_message(content: String, call_id: &str, name: &str) -> Value {
    let mut msg = crate::messages::tool_message(content, call_id, name, false);
    msg["id"] = json!(crate::messages::new_message_id());
    msg
}

/// Run the tool calls of an AI message concurrently; each becomes a tool message, failures
/// included (as error tool messages), so one bad call does not crash the run.
pub async fn run_tool_calls(
    tools: &[Arc<Tool>],
    calls: &[Value],
    ctx: &TaskContext,
) -> Result<Vec<Value>, NodeError> {
    let futs = calls.iter().map(|call| async move {
        let name = call.get("name").and_then(Value::as_str).unwrap_or_default();
        let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
        let args = call.get("args").cloned().unwrap_or(json!({}));
        let result = match tools.iter().find(|t| t.schema.name == name) {
            None => Err(NodeError::new(
                "ToolException",
                format!(
                    "{name} is not a valid tool, try one of [{}].",
                    tools
                        .iter()
                        .map(|t| t.schema.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
            Some(tool) => announced_call(tool, &args, id, ctx).await,
        };
        match result {
            Ok(msg) => Ok(msg),
            Err(NodeError::Failed { class, message, .. }) => Ok(crate::messages::tool_message(
                format!("Error: {class}('{message}')\n Please fix your mistakes."),
                id,
                name,
                true,
            )),
            Err(other) => Err(other),
        }
    });
    futures::future::join_all(futs).await.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::complete_text;

    #[test]
    fn a_character_split_between_parts_waits_for_its_end() {
        let e_acute = "é".as_bytes();
        let mut pending = [b"caf".as_slice(), &e_acute[..1]].concat();
        assert_eq!(complete_text(&mut pending), "caf");
        assert_eq!(pending, &e_acute[..1]);
        pending.extend_from_slice(&e_acute[1..]);
        pending.extend_from_slice(b"!");
        assert_eq!(complete_text(&mut pending), "é!");
        assert!(pending.is_empty());
        let mut invalid = vec![b'a', 0xFF, b'b'];
        assert_eq!(complete_text(&mut invalid), "a\u{FFFD}b");
        assert!(invalid.is_empty());
    }
}
