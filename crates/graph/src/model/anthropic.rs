//! `anthropic`: Anthropic's streaming Messages API (`POST {base_url}/v1/messages`).

use async_trait::async_trait;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::sse::{self, SseEvent, SseStream};
use super::{
    api_error, merge_turns, message_type, tool_call_chunk, usage, ChatModel, HttpSettings,
    ModelIdentity, Reply, ToolSchema,
};
use crate::context::TaskContext;
use crate::messages::message_text;
use crate::node::NodeError;

/// The API version the request and event shapes below follow.
const API_VERSION: &str = "2023-06-01";

/// The API requires `max_tokens`; `params.max_tokens` overrides this.
const DEFAULT_MAX_TOKENS: u64 = 1024;

/// A chat model behind Anthropic's Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicModel {
    /// Base URL (`https://api.anthropic.com`), model, key, params.
    pub http: HttpSettings,
}

/// Content blocks of a user or assistant message: a string becomes one text block; empty
/// text is dropped because the API rejects empty text blocks.
fn text_blocks(m: &Value) -> Vec<Value> {
    let blocks: Vec<Value> = match m.get("content") {
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p {
                Value::String(s) => json!({"type": "text", "text": s}),
                other => other.clone(),
            })
            // An AI message's tool_use blocks are rebuilt from its tool_calls below.
            .filter(|b| b["type"] != "tool_use")
            .collect(),
        _ => vec![json!({"type": "text", "text": message_text(m)})],
    };
    blocks
        .into_iter()
        .filter(|b| b["type"] != "text" || b["text"].as_str().is_some_and(|t| !t.is_empty()))
        .collect()
}

/// One LangChain message as an Anthropic turn; system messages are taken out before.
fn to_turn(m: &Value) -> (&'static str, Vec<Value>) {
    match message_type(m) {
        "ai" => {
            let mut blocks = text_blocks(m);
            for c in m
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                blocks.push(json!({"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]}));
            }
            ("assistant", blocks)
        }
        "tool" => {
            let mut block = json!({
                "type": "tool_result",
                "tool_use_id": m.get("tool_call_id").cloned().unwrap_or(json!("")),
                "content": message_text(m),
            });
            if m.get("status").and_then(Value::as_str) == Some("error") {
                block["is_error"] = json!(true);
            }
            ("user", vec![block])
        }
        _ => ("user", text_blocks(m)),
    }
}

/// The request body's `system` and `messages`.
fn conversation(messages: &[Value]) -> (Option<String>, Vec<Value>) {
    let (system, rest): (Vec<&Value>, Vec<&Value>) =
        messages.iter().partition(|m| message_type(m) == "system");
    let system = (!system.is_empty()).then(|| {
        system
            .iter()
            .map(|m| message_text(m))
            .collect::<Vec<_>>()
            .join("\n\n")
    });
    let turns = merge_turns(rest.into_iter().map(to_turn))
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    (system, turns)
}

fn to_anthropic_tool(t: &ToolSchema) -> Value {
    json!({"name": t.name, "description": t.description, "input_schema": t.parameters})
}

/// What the events tell besides the text and tool calls.
#[derive(Default)]
struct Meta {
    id: Value,
    model: Option<String>,
    stop_reason: Value,
    stop_sequence: Value,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

impl AnthropicModel {
    fn body(&self, messages: &[Value], tools: &[ToolSchema]) -> Value {
        let (system, turns) = conversation(messages);
        let mut fields = Map::new();
        fields.insert("model".into(), json!(self.http.model));
        fields.insert("max_tokens".into(), json!(DEFAULT_MAX_TOKENS));
        if let Some(system) = system {
            fields.insert("system".into(), json!(system));
        }
        fields.insert("messages".into(), Value::Array(turns));
        if !tools.is_empty() {
            fields.insert(
                "tools".into(),
                tools.iter().map(to_anthropic_tool).collect(),
            );
        }
        fields.insert("stream".into(), json!(true));
        self.http.body(fields)
    }

    async fn read(
        &self,
        events: &mut SseStream,
        reply: &mut Reply<'_>,
        cancel: &CancellationToken,
    ) -> Result<Meta, NodeError> {
        let mut meta = Meta::default();
        while let Some(SseEvent { event, data }) = events.next(cancel).await? {
            let Ok(data) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            // The event name is repeated as the data's `type`; either will do.
            let kind = if event.is_empty() {
                data["type"].as_str().unwrap_or("")
            } else {
                &event
            };
            match kind {
                "message_start" => read_start(&data["message"], &mut meta),
                "content_block_start" => read_block_start(&data, reply).await,
                "content_block_delta" => read_block_delta(&data, reply).await,
                "message_delta" => {
                    meta.stop_reason = data["delta"]["stop_reason"].clone();
                    meta.stop_sequence = data["delta"]["stop_sequence"].clone();
                    if let Some(n) = data.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                        meta.output_tokens = Some(n);
                    }
                }
                "message_stop" => break,
                "error" => {
                    let e = &data["error"];
                    return Err(api_error(format!(
                        "{} failed mid-stream: {}: {}",
                        self.http.url("/v1/messages"),
                        e["type"].as_str().unwrap_or("error"),
                        e["message"].as_str().unwrap_or(""),
                    )));
                }
                _ => {}
            }
        }
        Ok(meta)
    }
}

fn read_start(message: &Value, meta: &mut Meta) {
    meta.id = message["id"].clone();
    meta.model = message["model"].as_str().map(str::to_string);
    let u = &message["usage"];
    // Cached prompt tokens are reported apart; LangChain counts them as input too.
    let cached = ["cache_creation_input_tokens", "cache_read_input_tokens"]
        .iter()
        .filter_map(|k| u[*k].as_u64())
        .sum::<u64>();
    meta.input_tokens = u["input_tokens"].as_u64().map(|n| n + cached);
    meta.output_tokens = message
        .pointer("/usage/output_tokens")
        .and_then(Value::as_u64);
}

/// A tool_use block opens with its id and name; its input follows as JSON pieces.
async fn read_block_start(data: &Value, reply: &mut Reply<'_>) {
    let index = data["index"].as_u64().unwrap_or(0) as usize;
    let block = &data["content_block"];
    match block["type"].as_str() {
        Some("tool_use") => {
            let id = block["id"].as_str().unwrap_or("");
            let name = block["name"].as_str().unwrap_or("");
            let call = reply.call(index);
            call.id = id.to_string();
            call.name = name.to_string();
            reply
                .stream("", vec![tool_call_chunk(Some(name), "", Some(id), index)])
                .await;
        }
        Some("text") => reply.text(block["text"].as_str().unwrap_or("")).await,
        _ => {}
    }
}

async fn read_block_delta(data: &Value, reply: &mut Reply<'_>) {
    let index = data["index"].as_u64().unwrap_or(0) as usize;
    let delta = &data["delta"];
    match delta["type"].as_str() {
        Some("text_delta") => reply.text(delta["text"].as_str().unwrap_or("")).await,
        Some("input_json_delta") => {
            let piece = delta["partial_json"].as_str().unwrap_or("");
            reply.call(index).args.push_str(piece);
            reply
                .stream("", vec![tool_call_chunk(None, piece, None, index)])
                .await;
        }
        _ => {}
    }
}

#[async_trait]
impl ChatModel for AnthropicModel {
    fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            class: "ChatAnthropic",
            provider: "anthropic",
            model: Some(self.http.model.clone()),
        }
    }

    async fn invoke(
        &self,
        messages: &[Value],
        tools: &[ToolSchema],
        ctx: Option<&TaskContext>,
        cancel: &CancellationToken,
    ) -> Result<Value, NodeError> {
        let url = self.http.url("/v1/messages");
        let mut req = self
            .http
            .client
            .post(&url)
            .header("anthropic-version", API_VERSION)
            .json(&self.body(messages, tools));
        if let Some(key) = &self.http.api_key {
            req = req.header("x-api-key", key);
        }
        let mut events = sse::open(req, &url, cancel).await?;
        let mut reply = Reply::new(ctx, "anthropic", &self.http.model);
        let meta = self.read(&mut events, &mut reply, cancel).await?;
        let model_name = meta.model.unwrap_or_else(|| self.http.model.clone());
        let response_metadata = json!({
            "id": meta.id, "model_name": model_name,
            "stop_reason": meta.stop_reason, "stop_sequence": meta.stop_sequence,
        });
        let usage = meta
            .input_tokens
            .map(|i| usage(i, meta.output_tokens.unwrap_or(0)));
        reply.finish(response_metadata, usage).await
    }
}
