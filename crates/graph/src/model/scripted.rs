//! `scripted`: a deterministic model for tests and offline demos.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{chunk_message, ChatModel, ModelIdentity, ToolSchema};
use crate::context::TaskContext;
use crate::messages::{coerce_message, message_text};
use crate::node::NodeError;

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
    /// The model it stands for, when said: its replies' `response_metadata.model_name` and
    /// its runs' `ls_model_name`, as a real provider's are. Unsaid, replies carry no
    /// metadata, as LangChain's fake chat models' do.
    pub model_name: Option<String>,
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
            model: self.model_name.clone(),
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
        let streamed_to = ctx.filter(|c| c.streams_tokens());
        if streamed_to.is_none() && !self.delay.is_zero() {
            // A stand-in for a real model takes its time whether or not anyone streams it:
            // as long as its chunks would have taken.
            let chunks = split_text(&text, self.chunking).len().max(1) as u32;
            tokio::select! {
                _ = cancel.cancelled() => return Err(NodeError::Cancelled),
                _ = tokio::time::sleep(self.delay * chunks) => {}
            }
        }
        if let Some(ctx) = streamed_to {
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
                let chunk = chunk_message(&id, &piece, vec![], last);
                ctx.write_model_chunk(chunk, "scripted", self.model_name.as_deref())
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
                ctx.write_model_chunk(chunk, "scripted", self.model_name.as_deref())
                    .await;
            }
        }
        let mut msg = json!({"type": "ai", "content": text, "id": id, "tool_calls": tool_calls});
        if let Some(name) = &self.model_name {
            msg["response_metadata"] = json!({"model_name": name});
        }
        let msg = coerce_message(&msg).map_err(|e| NodeError::new("ValueError", e.0))?;
        Ok(msg)
    }
}
