//! Chat model providers: an OpenAI-compatible streaming client and `scripted`, a
//! deterministic model for tests and offline demos.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::context::TaskContext;
use crate::messages::{coerce_message, message_text};
use crate::node::NodeError;

/// A tool as a model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSchema {
    /// Tool name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

/// A chat model.
#[async_trait]
pub trait ChatModel: Send + Sync {
    /// Answer with one AI message (LangChain dict). When `ctx` is given and streams messages,
    /// token chunks are written to it as they arrive.
    async fn invoke(
        &self,
        messages: &[Value],
        tools: &[ToolSchema],
        ctx: Option<&TaskContext>,
        cancel: &CancellationToken,
    ) -> Result<Value, NodeError>;

    /// How the model shows in the `events` stream mode.
    fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            class: "BaseChatModel",
            provider: "unknown",
            model: None,
        }
    }
}

/// A chat model as LangChain names it in events and run metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelIdentity {
    /// The LangChain class it stands for (`ChatOpenAI`); the run's `name`.
    pub class: &'static str,
    /// `ls_provider`.
    pub provider: &'static str,
    /// `ls_model_name`.
    pub model: Option<String>,
}

/// The models a graph file declares, by name.
#[derive(Default)]
pub struct ModelRegistry {
    models: HashMap<String, Arc<dyn ChatModel>>,
}

impl ModelRegistry {
    /// Register a model.
    pub fn insert(&mut self, name: impl Into<String>, model: Arc<dyn ChatModel>) {
        self.models.insert(name.into(), model);
    }

    /// A model by name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn ChatModel>> {
        self.models.get(name).cloned()
    }

    /// The declared names, sorted (for messages that list them).
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.models.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

/// How a scripted model cuts its reply into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunking {
    /// One chunk per character.
    Char,
    /// One chunk per word and one per whitespace character between words.
    Word,
    /// The whole text in one chunk.
    Whole,
}

/// A deterministic model: reply `n` is picked by the number of AI messages already in the
/// conversation, so a resumed or forked thread replays the same way.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    /// Replies: `{content, tool_calls?, id?}` objects.
    pub responses: Vec<Value>,
    /// Chunking of streamed text.
    pub chunking: Chunking,
    /// Pause between chunks.
    pub delay: Duration,
}

/// An `AIMessageChunk` as LangChain serialises it; `last` marks the final chunk of a reply
/// (`chunk_position: "last"`).
fn chunk_message(id: &str, content: &str, tool_call_chunks: Vec<Value>, last: bool) -> Value {
    json!({
        "content": content,
        "additional_kwargs": {},
        "response_metadata": {},
        "type": "AIMessageChunk",
        "name": null,
        "id": id,
        "tool_calls": [],
        "invalid_tool_calls": [],
        "usage_metadata": null,
        "tool_call_chunks": tool_call_chunks,
        "chunk_position": if last { json!("last") } else { Value::Null },
    })
}

fn split_text(text: &str, chunking: Chunking) -> Vec<String> {
    match chunking {
        Chunking::Whole => vec![text.to_string()],
        Chunking::Char => text.chars().map(String::from).collect(),
        // Words and the whitespace between them are separate chunks, as LangChain's
        // GenericFakeChatModel streams them (`re.split(r"(\s)", text)`).
        Chunking::Word => {
            let mut out = Vec::new();
            let mut cur = String::new();
            for c in text.chars() {
                if c.is_whitespace() {
                    if !cur.is_empty() {
                        out.push(std::mem::take(&mut cur));
                    }
                    out.push(c.to_string());
                } else {
                    cur.push(c);
                }
            }
            if !cur.is_empty() {
                out.push(cur);
            }
            out
        }
    }
}

#[async_trait]
impl ChatModel for ScriptedModel {
    fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            class: "ScriptedChatModel",
            provider: "scripted",
            model: None,
        }
    }

    async fn invoke(
        &self,
        messages: &[Value],
        _tools: &[ToolSchema],
        ctx: Option<&TaskContext>,
        cancel: &CancellationToken,
    ) -> Result<Value, NodeError> {
        let n = messages
            .iter()
            .filter(|m| {
                matches!(
                    m.get("type").and_then(Value::as_str),
                    Some("ai" | "assistant")
                ) || m.get("role").and_then(Value::as_str) == Some("assistant")
            })
            .count();
        // Cycling makes a second turn on the same thread replay the script from the top.
        let Some(reply) =
            (!self.responses.is_empty()).then(|| &self.responses[n % self.responses.len()])
        else {
            return Err(NodeError::new(
                "ValueError",
                "the scripted model has no responses",
            ));
        };
        let reply = match reply {
            Value::String(s) => json!({"content": s}),
            other => other.clone(),
        };
        let id = reply
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("lc_run--{}", uuid::Uuid::new_v4()));
        let text = message_text(&reply);
        let tool_calls: Vec<Value> = reply
            .get("tool_calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|mut c| {
                if let Value::Object(o) = &mut c {
                    o.entry("args").or_insert(json!({}));
                    o.entry("id")
                        .or_insert(json!(format!("call_{}", uuid::Uuid::new_v4().simple())));
                    o.insert("type".into(), json!("tool_call"));
                }
                c
            })
            .collect();
        if let Some(ctx) = ctx.filter(|c| c.streams_tokens()) {
            let pieces = split_text(&text, self.chunking);
            let n = pieces.len();
            for (i, piece) in pieces.into_iter().enumerate() {
                if cancel.is_cancelled() {
                    return Err(NodeError::Cancelled);
                }
                if !self.delay.is_zero() {
                    ctx.sleep(self.delay).await?;
                }
                let last = i + 1 == n && tool_calls.is_empty();
                ctx.write_model_chunk(chunk_message(&id, &piece, vec![], last), "scripted", None)
                    .await;
            }
            if !tool_calls.is_empty() {
                let chunks = tool_calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        json!({"name": c["name"], "args": c["args"].to_string(), "id": c["id"], "index": i, "type": "tool_call_chunk"})
                    })
                    .collect();
                let mut chunk = chunk_message(&id, "", chunks, true);
                chunk["tool_calls"] = Value::Array(tool_calls.clone());
                ctx.write_model_chunk(chunk, "scripted", None).await;
            }
        }
        let msg = coerce_message(&json!({
            "type": "ai", "content": text, "id": id, "tool_calls": tool_calls,
        }))
        .map_err(|e| NodeError::new("ValueError", e.0))?;
        Ok(msg)
    }
}

/// A chat model behind an OpenAI-compatible `/chat/completions` endpoint (OpenAI, Ollama,
/// vLLM, llama.cpp's server).
#[derive(Debug, Clone)]
pub struct OpenAiModel {
    /// Base URL, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// API key, read from the environment when the graph is loaded.
    pub api_key: Option<String>,
    /// Extra body fields (temperature, ...).
    pub params: Map<String, Value>,
    /// HTTP client.
    pub client: reqwest::Client,
}

/// A message in OpenAI's format.
fn to_openai(m: &Value) -> Value {
    let kind = m.get("type").and_then(Value::as_str).unwrap_or("human");
    let role = match kind {
        "ai" | "AIMessageChunk" => "assistant",
        "system" => "system",
        "tool" => "tool",
        _ => "user",
    };
    let mut out = json!({"role": role, "content": m.get("content").cloned().unwrap_or(json!(""))});
    if role == "assistant" {
        if let Some(calls) = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .filter(|c| !c.is_empty())
        {
            out["tool_calls"] = Value::Array(
                calls
                    .iter()
                    .map(|c| {
                        json!({"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"].to_string()}})
                    })
                    .collect(),
            );
        }
    }
    if role == "tool" {
        out["tool_call_id"] = m.get("tool_call_id").cloned().unwrap_or(json!(""));
    }
    out
}

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    args: String,
}

#[async_trait]
impl ChatModel for OpenAiModel {
    fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            class: "ChatOpenAI",
            provider: "openai",
            model: Some(self.model.clone()),
        }
    }

    async fn invoke(
        &self,
        messages: &[Value],
        tools: &[ToolSchema],
        ctx: Option<&TaskContext>,
        cancel: &CancellationToken,
    ) -> Result<Value, NodeError> {
        let fail = |m: String| NodeError::new("APIError", m);
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        body.insert(
            "messages".into(),
            Value::Array(messages.iter().map(to_openai).collect()),
        );
        body.insert("stream".into(), json!(true));
        if !tools.is_empty() {
            body.insert(
                "tools".into(),
                Value::Array(
                    tools
                        .iter()
                        .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                        .collect(),
                ),
            );
        }
        for (k, v) in &self.params {
            body.insert(k.clone(), v.clone());
        }
        let url = format!("{}/chat/completions", self.base_url.trim_end_matches('/'));
        let mut req = self.client.post(&url).json(&Value::Object(body));
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let resp = tokio::select! {
            _ = cancel.cancelled() => return Err(NodeError::Cancelled),
            r = req.send() => r.map_err(|e| fail(format!("request to {url} failed: {e}")))?,
        };
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(fail(format!("{url} answered {status}: {text}")));
        }
        let id = format!("lc_run--{}", uuid::Uuid::new_v4());
        let mut content = String::new();
        let mut calls: Vec<PartialCall> = Vec::new();
        let mut finish = Value::Null;
        let mut buf = Vec::<u8>::new();
        let mut stream = resp.bytes_stream();
        let stream_to = ctx.filter(|c| c.streams_tokens());
        'read: loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return Err(NodeError::Cancelled),
                n = stream.next() => n,
            };
            let Some(bytes) = next else { break };
            let bytes = bytes.map_err(|e| fail(format!("stream from {url} failed: {e}")))?;
            buf.extend_from_slice(&bytes);
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&line);
                let Some(data) = line.trim().strip_prefix("data:") else {
                    continue;
                };
                let data = data.trim();
                if data == "[DONE]" {
                    break 'read;
                }
                let Ok(event) = serde_json::from_str::<Value>(data) else {
                    continue;
                };
                let Some(choice) = event.pointer("/choices/0") else {
                    continue;
                };
                if let Some(f) = choice.get("finish_reason").filter(|f| !f.is_null()) {
                    finish = f.clone();
                }
                let delta = &choice["delta"];
                let mut piece = String::new();
                if let Some(t) = delta.get("content").and_then(Value::as_str) {
                    piece.push_str(t);
                    content.push_str(t);
                }
                let mut call_chunks = Vec::new();
                for c in delta
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let i = c.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                    while calls.len() <= i {
                        calls.push(PartialCall::default());
                    }
                    let p = &mut calls[i];
                    if let Some(v) = c.get("id").and_then(Value::as_str) {
                        p.id.push_str(v);
                    }
                    if let Some(v) = c.pointer("/function/name").and_then(Value::as_str) {
                        p.name.push_str(v);
                    }
                    let args = c
                        .pointer("/function/arguments")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    p.args.push_str(args);
                    call_chunks.push(json!({
                        "name": c.pointer("/function/name"), "args": args,
                        "id": c.get("id"), "index": i, "type": "tool_call_chunk",
                    }));
                }
                if let Some(ctx) = stream_to {
                    if !piece.is_empty() || !call_chunks.is_empty() {
                        let chunk = chunk_message(&id, &piece, call_chunks, false);
                        ctx.write_model_chunk(chunk, "openai", Some(&self.model))
                            .await;
                    }
                }
            }
        }
        if let Some(ctx) = stream_to {
            // LangChain closes a streamed reply with an empty chunk carrying the finish reason.
            let mut last = chunk_message(&id, "", Vec::new(), true);
            last["response_metadata"] = json!({"finish_reason": finish, "model_name": self.model});
            ctx.write_model_chunk(last, "openai", Some(&self.model))
                .await;
        }
        let tool_calls: Vec<Value> = calls
            .into_iter()
            .map(|c| {
                let args = if c.args.trim().is_empty() {
                    json!({})
                } else {
                    serde_json::from_str(&c.args).unwrap_or(json!({}))
                };
                json!({"name": c.name, "args": args, "id": c.id, "type": "tool_call"})
            })
            .collect();
        coerce_message(&json!({
            "type": "ai", "content": content, "id": id, "tool_calls": tool_calls,
            "response_metadata": {"finish_reason": finish, "model_name": self.model},
        }))
        .map_err(|e| fail(e.0))
    }
}
