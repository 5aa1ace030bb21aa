//! `gemini` / `google_genai`: Google's Gemini API,
//! `POST {base_url}/v1beta/models/{model}:streamGenerateContent?alt=sse`.

use async_trait::async_trait;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::sse::{self, SseStream};
use super::{
    api_error, merge_turns, message_type, tool_call_chunk, usage, ChatModel, HttpSettings,
    ModelIdentity, Reply, ToolSchema,
};
use crate::context::TaskContext;
use crate::messages::message_text;
use crate::node::NodeError;

/// A chat model behind the Gemini API.
#[derive(Debug, Clone)]
pub struct GeminiModel {
    /// Base URL (`https://generativelanguage.googleapis.com`), model, key, params.
    pub http: HttpSettings,
}

/// The name of the call a tool message answers: Gemini matches a functionResponse to its
/// functionCall by name, while LangChain's tool message holds only the call's id.
fn answered_name<'a>(earlier: &'a [Value], tool_call_id: &str) -> Option<&'a str> {
    earlier
        .iter()
        .rev()
        .filter(|m| message_type(m) == "ai")
        .flat_map(|m| {
            m.get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .find(|c| c["id"].as_str() == Some(tool_call_id))
        .and_then(|c| c["name"].as_str())
}

/// Message `i` of `messages` as a Gemini turn; system messages are taken out before.
fn to_turn(messages: &[Value], i: usize) -> (&'static str, Vec<Value>) {
    let m = &messages[i];
    let text = message_text(m);
    match message_type(m) {
        "ai" => {
            let mut parts = Vec::new();
            if !text.is_empty() {
                parts.push(json!({"text": text}));
            }
            for c in m
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                parts.push(json!({"functionCall": {"name": c["name"], "args": c["args"]}}));
            }
            ("model", parts)
        }
        "tool" => {
            let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
            let name = answered_name(&messages[..i], id)
                .or_else(|| m.get("name").and_then(Value::as_str))
                .unwrap_or("");
            let part = json!({"functionResponse": {"name": name, "response": {"output": text}}});
            ("user", vec![part])
        }
        _ => ("user", vec![json!({"text": text})]),
    }
}

/// The request body's `systemInstruction` and `contents`.
fn conversation(messages: &[Value]) -> (Option<Value>, Vec<Value>) {
    let system: Vec<Value> = messages
        .iter()
        .filter(|m| message_type(m) == "system")
        .map(|m| json!({"text": message_text(m)}))
        .collect();
    let system = (!system.is_empty()).then(|| json!({"parts": system}));
    let turns = (0..messages.len())
        .filter(|&i| message_type(&messages[i]) != "system")
        .map(|i| to_turn(messages, i));
    let contents = merge_turns(turns)
        .into_iter()
        .map(|(role, parts)| json!({"role": role, "parts": parts}))
        .collect();
    (system, contents)
}

fn to_declaration(t: &ToolSchema) -> Value {
    json!({"name": t.name, "description": t.description, "parameters": t.parameters})
}

/// What the responses tell besides the text and tool calls.
#[derive(Default)]
struct Meta {
    finish_reason: Value,
    model_version: Option<String>,
    usage: Option<Value>,
}

impl GeminiModel {
    fn url(&self) -> String {
        // Google's own examples name models both as `gemini-x` and as `models/gemini-x`.
        let model = self.http.model.trim_start_matches("models/");
        let path = format!("/v1beta/models/{model}:streamGenerateContent");
        self.http.url(&path)
    }

    fn body(&self, messages: &[Value], tools: &[ToolSchema]) -> Value {
        let (system, contents) = conversation(messages);
        let mut fields = Map::new();
        if let Some(system) = system {
            fields.insert("systemInstruction".into(), system);
        }
        fields.insert("contents".into(), Value::Array(contents));
        if !tools.is_empty() {
            let decls: Vec<Value> = tools.iter().map(to_declaration).collect();
            fields.insert("tools".into(), json!([{"functionDeclarations": decls}]));
        }
        self.http.body(fields)
    }

    /// Each event is a whole GenerateContentResponse holding the reply's next parts.
    async fn read(
        &self,
        url: &str,
        events: &mut SseStream,
        reply: &mut Reply<'_>,
        cancel: &CancellationToken,
    ) -> Result<Meta, NodeError> {
        let mut meta = Meta::default();
        while let Some(event) = events.next(cancel).await? {
            let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
                continue;
            };
            if let Some(e) = data.get("error") {
                return Err(api_error(format!("{url} failed mid-stream: {e}")));
            }
            if let Some(v) = data["modelVersion"].as_str() {
                meta.model_version = Some(v.to_string());
            }
            if let Some(u) = data.get("usageMetadata") {
                let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
                meta.usage = Some(usage(n("promptTokenCount"), n("candidatesTokenCount")));
            }
            let candidate = &data["candidates"][0];
            if let Some(f) = candidate.get("finishReason") {
                meta.finish_reason = f.clone();
            }
            let parts = candidate
                .pointer("/content/parts")
                .and_then(Value::as_array);
            for part in parts.into_iter().flatten() {
                read_part(part, reply).await;
            }
        }
        Ok(meta)
    }
}

/// A text part, or a function call, which Gemini sends whole and without an id.
async fn read_part(part: &Value, reply: &mut Reply<'_>) {
    // Thought summaries are not part of the answer.
    if part["thought"] == json!(true) {
        return;
    }
    if let Some(text) = part["text"].as_str() {
        reply.text(text).await;
    }
    if let Some(call) = part.get("functionCall") {
        let index = reply.calls.len();
        // Stable per reply, so the tool message answering it can be matched back.
        let id = format!("{}-call-{index}", reply.id);
        let name = call["name"].as_str().unwrap_or("");
        let args = call.get("args").cloned().unwrap_or(json!({})).to_string();
        let p = reply.call(index);
        p.id = id.clone();
        p.name = name.to_string();
        p.args = args.clone();
        let chunk = tool_call_chunk(Some(name), &args, Some(&id), index);
        reply.stream("", vec![chunk]).await;
    }
}

#[async_trait]
impl ChatModel for GeminiModel {
    fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            class: "ChatGoogleGenerativeAI",
            provider: "google_genai",
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
        let url = self.url();
        let mut req = self
            .http
            .client
            .post(&url)
            .query(&[("alt", "sse")])
            .json(&self.body(messages, tools));
        if let Some(key) = &self.http.api_key {
            req = req.header("x-goog-api-key", key);
        }
        let mut events = sse::open(req, &url, cancel).await?;
        let mut reply = Reply::new(ctx, "google_genai", &self.http.model);
        let meta = self.read(&url, &mut events, &mut reply, cancel).await?;
        let response_metadata = json!({
            "model_name": self.http.model,
            "model_version": meta.model_version,
            "finish_reason": meta.finish_reason,
        });
        reply.finish(response_metadata, meta.usage).await
    }
}
