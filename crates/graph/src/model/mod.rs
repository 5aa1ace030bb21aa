//! Chat models: the [`ChatModel`] trait, the registry a graph file fills, and the providers
//! (`scripted`, OpenAI-compatible, Anthropic, Gemini). The HTTP providers share the SSE
//! reader in [`sse`] and the reply assembly below, so each file holds only its wire format.

mod anthropic;
mod gemini;
mod openai;
mod scripted;
mod sse;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::context::TaskContext;
use crate::messages::coerce_message;
use crate::node::NodeError;

pub use anthropic::AnthropicModel;
pub use gemini::GeminiModel;
pub use openai::OpenAiModel;
pub use scripted::{Chunking, ScriptedModel};

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

/// Settings every HTTP provider reads from its graph-file declaration.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Base URL without the API path, e.g. `https://api.anthropic.com`.
    pub base_url: String,
    /// Model name (for Azure OpenAI, the deployment's model).
    pub model: String,
    /// API key, read from the environment when the graph is loaded.
    pub api_key: Option<String>,
    /// Extra body fields (temperature, ...), put over the provider's own.
    pub params: Map<String, Value>,
    /// HTTP client.
    pub client: reqwest::Client,
}

impl HttpSettings {
    /// `base_url` joined with an API path.
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url.trim_end_matches('/'))
    }

    /// A request body: the provider's fields, then `params` over them.
    fn body(&self, fields: Map<String, Value>) -> Value {
        let mut body = fields;
        for (k, v) in &self.params {
            body.insert(k.clone(), v.clone());
        }
        Value::Object(body)
    }
}

/// The error of a failed model call, as LangChain's clients raise it.
fn api_error(message: String) -> NodeError {
    NodeError::new("APIError", message)
}

/// A tool call being assembled from streamed pieces.
#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    /// The JSON text of the arguments, as far as it arrived.
    args: String,
}

impl PartialCall {
    /// The finished call; arguments that are not a JSON object (a cut-off stream) become `{}`
    /// so the tools node still answers the call.
    fn into_tool_call(self) -> Value {
        let args = serde_json::from_str::<Value>(&self.args)
            .ok()
            .filter(Value::is_object)
            .unwrap_or(json!({}));
        json!({"name": self.name, "args": args, "id": self.id, "type": "tool_call"})
    }
}

/// A `tool_call_chunk` as LangChain streams it; `None` fields are still to come.
fn tool_call_chunk(name: Option<&str>, args: &str, id: Option<&str>, index: usize) -> Value {
    json!({"name": name, "args": args, "id": id, "index": index, "type": "tool_call_chunk"})
}

/// One reply of an HTTP provider: streamed to the task as it arrives, then returned whole.
struct Reply<'a> {
    id: String,
    content: String,
    calls: Vec<PartialCall>,
    /// The task to stream to, when it streams tokens.
    ctx: Option<&'a TaskContext>,
    provider: &'static str,
    model: &'a str,
}

impl<'a> Reply<'a> {
    fn new(ctx: Option<&'a TaskContext>, provider: &'static str, model: &'a str) -> Self {
        Reply {
            id: format!("lc_run--{}", uuid::Uuid::new_v4()),
            content: String::new(),
            calls: Vec::new(),
            ctx: ctx.filter(|c| c.streams_tokens()),
            provider,
            model,
        }
    }

    /// Stream a piece of text and tool call chunks (nothing when both are empty).
    async fn stream(&self, text: &str, call_chunks: Vec<Value>) {
        let Some(ctx) = self.ctx else { return };
        if text.is_empty() && call_chunks.is_empty() {
            return;
        }
        let chunk = chunk_message(&self.id, text, call_chunks, false);
        ctx.write_model_chunk(chunk, self.provider, Some(self.model))
            .await;
    }

    /// Add text to the reply and stream it.
    async fn text(&mut self, text: &str) {
        self.content.push_str(text);
        self.stream(text, Vec::new()).await;
    }

    /// The call at `index`, made when first seen.
    fn call(&mut self, index: usize) -> &mut PartialCall {
        if self.calls.len() <= index {
            self.calls.resize_with(index + 1, PartialCall::default);
        }
        &mut self.calls[index]
    }

    /// Close the stream with an empty chunk carrying the metadata, as LangChain does, and
    /// give the whole AI message.
    async fn finish(
        self,
        response_metadata: Value,
        usage: Option<Value>,
    ) -> Result<Value, NodeError> {
        if let Some(ctx) = self.ctx {
            let mut last = chunk_message(&self.id, "", Vec::new(), true);
            last["response_metadata"] = response_metadata.clone();
            last["usage_metadata"] = usage.clone().unwrap_or(Value::Null);
            ctx.write_model_chunk(last, self.provider, Some(self.model))
                .await;
        }
        let tool_calls: Vec<Value> = self
            .calls
            .into_iter()
            .filter(|c| !c.name.is_empty())
            .map(PartialCall::into_tool_call)
            .collect();
        coerce_message(&json!({
            "type": "ai", "content": self.content, "id": self.id, "tool_calls": tool_calls,
            "response_metadata": response_metadata, "usage_metadata": usage,
        }))
        .map_err(|e| api_error(e.0))
    }
}

/// LangChain's `usage_metadata`.
fn usage(input: u64, output: u64) -> Value {
    json!({"input_tokens": input, "output_tokens": output, "total_tokens": input + output})
}

/// The LangChain message type (`human`, `ai`, `system`, `tool`); role-style dicts map too.
fn message_type(m: &Value) -> &str {
    match m
        .get("type")
        .or_else(|| m.get("role"))
        .and_then(Value::as_str)
    {
        Some("ai" | "assistant" | "AIMessageChunk") => "ai",
        Some("system" | "developer") => "system",
        Some("tool") => "tool",
        _ => "human",
    }
}

/// Turns `(role, blocks)` with consecutive same-role turns joined: Anthropic and Gemini
/// require roles to alternate, while LangChain histories hold e.g. several tool results in
/// a row.
fn merge_turns(
    turns: impl IntoIterator<Item = (&'static str, Vec<Value>)>,
) -> Vec<(&'static str, Vec<Value>)> {
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (role, blocks) in turns {
        match out.last_mut() {
            Some((last, prev)) if *last == role => prev.extend(blocks),
            _ => out.push((role, blocks)),
        }
    }
    out
}
