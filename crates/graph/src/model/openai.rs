//! `openai` / `openai_compatible`: a streaming `/chat/completions` client (OpenAI, Azure
//! OpenAI, Ollama, vLLM, LM Studio, llama.cpp's server).

use async_trait::async_trait;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::sse::{self, SseStream};
use super::{
    message_type, tool_call_chunk, usage, ChatModel, HttpSettings, ModelIdentity, Reply, ToolSchema,
};
use crate::context::TaskContext;
use crate::node::NodeError;

/// A chat model behind an OpenAI-compatible `{base_url}/chat/completions` endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiModel {
    /// Base URL, model, key, params.
    pub http: HttpSettings,
    /// The header that carries the key: `None` for `Authorization: Bearer <key>`, or a name
    /// whose value is the bare key (`api-key` for Azure OpenAI).
    pub api_key_header: Option<String>,
    /// Query parameters added to the URL (`api-version` for Azure OpenAI).
    pub query: Vec<(String, String)>,
}

/// A message in OpenAI's format.
fn to_openai(m: &Value) -> Value {
    let role = match message_type(m) {
        "ai" => "assistant",
        "system" => "system",
        "tool" => "tool",
        _ => "user",
    };
    let mut out = json!({"role": role, "content": m.get("content").cloned().unwrap_or(json!(""))});
    let calls = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty());
    if let (Some(calls), "assistant") = (calls, role) {
        out["tool_calls"] = calls
            .iter()
            .map(|c| json!({"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"].to_string()}}))
            .collect();
    }
    if role == "tool" {
        out["tool_call_id"] = m.get("tool_call_id").cloned().unwrap_or(json!(""));
    }
    out
}

fn to_openai_tool(t: &ToolSchema) -> Value {
    json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}})
}

impl OpenAiModel {
    fn request(&self, url: &str, body: &Value) -> reqwest::RequestBuilder {
        let mut req = self.http.client.post(url).query(&self.query).json(body);
        if let Some(key) = &self.http.api_key {
            req = match &self.api_key_header {
                Some(header) => req.header(header.as_str(), key),
                None => req.bearer_auth(key),
            };
        }
        req
    }

    /// Fold the events into `reply`; gives the finish reason and the usage, when reported.
    async fn read(
        &self,
        events: &mut SseStream,
        reply: &mut Reply<'_>,
        cancel: &CancellationToken,
    ) -> Result<(Value, Option<Value>), NodeError> {
        let mut finish = Value::Null;
        let mut reported = None;
        while let Some(event) = events.next(cancel).await? {
            if event.data == "[DONE]" {
                break;
            }
            let Ok(event) = serde_json::from_str::<Value>(&event.data) else {
                continue;
            };
            // Sent last when `stream_options.include_usage` is on, with no choices.
            if let Some(u) = event.get("usage").filter(|u| u.is_object()) {
                let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
                reported = Some(usage(n("prompt_tokens"), n("completion_tokens")));
            }
            let Some(choice) = event.pointer("/choices/0") else {
                continue;
            };
            if let Some(f) = choice.get("finish_reason").filter(|f| !f.is_null()) {
                finish = f.clone();
            }
            self.read_delta(&choice["delta"], reply).await;
        }
        Ok((finish, reported))
    }

    async fn read_delta(&self, delta: &Value, reply: &mut Reply<'_>) {
        let text = delta.get("content").and_then(Value::as_str).unwrap_or("");
        reply.content.push_str(text);
        let mut chunks = Vec::new();
        for c in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = c.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
            let id = c.get("id").and_then(Value::as_str);
            let name = c.pointer("/function/name").and_then(Value::as_str);
            let args = c
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("");
            let call = reply.call(index);
            call.id.push_str(id.unwrap_or(""));
            call.name.push_str(name.unwrap_or(""));
            call.args.push_str(args);
            chunks.push(tool_call_chunk(name, args, id, index));
        }
        reply.stream(text, chunks).await;
    }
}

#[async_trait]
impl ChatModel for OpenAiModel {
    fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            class: "ChatOpenAI",
            provider: "openai",
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
        let mut fields = Map::new();
        fields.insert("model".into(), json!(self.http.model));
        fields.insert("messages".into(), messages.iter().map(to_openai).collect());
        fields.insert("stream".into(), json!(true));
        if !tools.is_empty() {
            fields.insert("tools".into(), tools.iter().map(to_openai_tool).collect());
        }
        let url = self.http.url("/chat/completions");
        let mut events =
            sse::open(self.request(&url, &self.http.body(fields)), &url, cancel).await?;
        let mut reply = Reply::new(ctx, "openai", &self.http.model);
        let (finish, usage) = self.read(&mut events, &mut reply, cancel).await?;
        let meta = json!({"finish_reason": finish, "model_name": self.http.model});
        reply.finish(meta, usage).await
    }
}
