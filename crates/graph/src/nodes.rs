//! The node kinds of graph files: `script`, `model`, `tools`, `interrupt`, `subgraph`, and
//! the routers of conditional edges.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Map, Value};

use crate::context::TaskContext;
use crate::graph::{Graph, END};
use crate::messages::coerce_message;
use crate::model::{ChatModel, ToolSchema};
use crate::node::{Command, Goto, Node, NodeError, Router};
use crate::script::{to_command, to_gotos, Script};
use crate::tools::{run_tool_calls, Tool};

/// A node whose body is a script.
pub struct ScriptNode(pub Arc<Script>);

#[async_trait]
impl Node for ScriptNode {
    async fn run(&self, input: Value, ctx: &TaskContext) -> Result<Command, NodeError> {
        let v = self.0.eval(&[("state", input)], ctx).await?;
        to_command(v)
    }
}

/// A conditional edge decided by a script.
pub struct ScriptRouter(pub Arc<Script>);

#[async_trait]
impl Router for ScriptRouter {
    async fn route(&self, state: &Value, ctx: &TaskContext) -> Result<Vec<Goto>, NodeError> {
        let v = self.0.eval(&[("state", state.clone())], ctx).await?;
        to_gotos(v)
    }
}

/// LangGraph's `tools_condition`: to `tools` when the last message has tool calls, else end.
pub struct ToolsCondition {
    /// The state key of the conversation.
    pub messages_key: String,
    /// The node that runs tools.
    pub tools_node: String,
}

#[async_trait]
impl Router for ToolsCondition {
    async fn route(&self, state: &Value, _ctx: &TaskContext) -> Result<Vec<Goto>, NodeError> {
        let has_calls = state
            .get(&self.messages_key)
            .and_then(Value::as_array)
            .and_then(|m| m.last())
            .and_then(|m| m.get("tool_calls"))
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty());
        Ok(vec![Goto::Node(if has_calls {
            self.tools_node.clone()
        } else {
            END.to_string()
        })])
    }

    fn name(&self) -> &str {
        "tools_condition"
    }
}

/// A chat model call over the conversation in `messages_key`.
pub struct ModelNode {
    /// The model.
    pub model: NodeModel,
    /// Tools offered to the model.
    pub tools: Vec<ToolSchema>,
    /// A system prompt put first; its `{name}` placeholders are filled per run
    /// ([`crate::prompt`]).
    pub system: Option<String>,
    /// Stream tokens as `messages` events.
    pub stream: bool,
    /// The state key of the conversation.
    pub messages_key: String,
}

/// Which model a model node calls.
pub enum NodeModel {
    /// Always this one.
    Fixed(Arc<dyn ChatModel>),
    /// The one of `models` the run names under `key` (its context, else its
    /// `config.configurable`): LangGraph templates' `context.model`.
    PerRun {
        /// Where the run names it.
        key: String,
        /// The models it may name.
        models: Arc<crate::model::ModelRegistry>,
    },
}

impl NodeModel {
    /// The model this run calls.
    fn for_run(&self, ctx: &TaskContext) -> Result<Arc<dyn ChatModel>, NodeError> {
        let (key, models) = match self {
            NodeModel::Fixed(model) => return Ok(model.clone()),
            NodeModel::PerRun { key, models } => (key, models),
        };
        let name = crate::prompt::value(key, ctx)?;
        models.get(&name).ok_or_else(|| {
            NodeError::new(
                "ValueError",
                format!(
                    "the run chose the model `{name}` (its `{key}`), which the graph does not \
                     declare; declared: {}",
                    models.names().join(", ")
                ),
            )
        })
    }
}

#[async_trait]
impl Node for ModelNode {
    async fn run(&self, input: Value, ctx: &TaskContext) -> Result<Command, NodeError> {
        let mut messages: Vec<Value> = Vec::new();
        if let Some(system) = &self.system {
            let system = crate::prompt::fill(system, ctx)?;
            messages.push(
                coerce_message(&json!({"type": "system", "content": system}))
                    .map_err(|e| NodeError::new("ValueError", e.0))?,
            );
        }
        if let Some(list) = input.get(&self.messages_key).and_then(Value::as_array) {
            messages.extend(list.iter().cloned());
        }
        let streaming = if self.stream { Some(ctx) } else { None };
        let model = self.model.for_run(ctx)?;
        let reply = traced_invoke(&model, &messages, &self.tools, streaming, ctx).await?;
        let mut update = Map::new();
        update.insert(self.messages_key.clone(), json!([reply]));
        Ok(Command::update(Value::Object(update)))
    }
}

/// Call a model for a node (a model node, or a script's `call_model`), shown in `events` as a
/// chat model run below the node: start, a stream event per token chunk (when it streams),
/// end.
pub(crate) async fn traced_invoke(
    model: &Arc<dyn ChatModel>,
    messages: &[Value],
    tools: &[ToolSchema],
    streaming: Option<&TaskContext>,
    ctx: &TaskContext,
) -> Result<Value, NodeError> {
    // The model's identity is only asked for when someone listens.
    let trace = ctx.traces().then(|| model.identity()).and_then(|who| {
        ctx.child_trace(who.class, "seq:step:1", || {
            ctx.model_metadata(who.provider, who.model.as_deref())
        })
    });
    let Some(trace) = trace else {
        return model
            .invoke(messages, tools, streaming, ctx.cancel_token())
            .await;
    };
    // LangChain shows a chat model's input as a batch of one conversation.
    let input = json!({ "messages": [messages] });
    trace
        .emit(&ctx.run, "on_chat_model_start", json!({ "input": input }))
        .await;
    ctx.set_model_call(Some(trace.clone()));
    let reply = model
        .invoke(messages, tools, streaming, ctx.cancel_token())
        .await;
    ctx.set_model_call(None);
    let reply = reply?;
    trace
        .end(&ctx.run, "on_chat_model_end", reply.clone(), input)
        .await;
    Ok(reply)
}

/// Runs the tool calls of the last AI message.
pub struct ToolsNode {
    /// Available tools.
    pub tools: Vec<Arc<Tool>>,
    /// The state key of the conversation.
    pub messages_key: String,
}

#[async_trait]
impl Node for ToolsNode {
    async fn run(&self, input: Value, ctx: &TaskContext) -> Result<Command, NodeError> {
        let last = input
            .get(&self.messages_key)
            .and_then(Value::as_array)
            .and_then(|m| {
                m.iter()
                    .rev()
                    .find(|m| m.get("type").and_then(Value::as_str) == Some("ai"))
            });
        let calls = last
            .and_then(|m| m.get("tool_calls"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let out = run_tool_calls(&self.tools, &calls, ctx).await?;
        let mut update = Map::new();
        update.insert(self.messages_key.clone(), Value::Array(out));
        Ok(Command::update(Value::Object(update)))
    }
}

/// Interrupts with a payload; on resume writes the value to a key (and optionally appends a
/// message built from it).
pub struct InterruptNode {
    /// What the client sees.
    pub payload: Value,
    /// Where the resume value goes.
    pub write_to: Option<String>,
}

#[async_trait]
impl Node for InterruptNode {
    async fn run(&self, _input: Value, ctx: &TaskContext) -> Result<Command, NodeError> {
        let value = ctx.interrupt(self.payload.clone())?;
        Ok(match &self.write_to {
            Some(key) => {
                let mut update = Map::new();
                update.insert(key.clone(), value);
                Command::update(Value::Object(update))
            }
            None => Command::none(),
        })
    }
}

/// A node of another kind followed by a script (`then:`), which sees the node's input as
/// `state` and what it would write as `update` (a model or agent node's reply also as
/// `reply`) and decides what the node writes: a map, `command(update, goto)`, or nothing
/// (`()`), which writes `update` as the script left it. So a model node can also write other keys, emit
/// custom events, interrupt on a condition or choose where to go, in the same step.
pub struct ThenNode {
    /// The node's own work.
    pub inner: Arc<dyn Node>,
    /// The script.
    pub then: Arc<Script>,
    /// A model or agent node's conversation key, whose last message the script sees as
    /// `reply`.
    pub reply_from: Option<String>,
}

#[async_trait]
impl Node for ThenNode {
    async fn run(&self, input: Value, ctx: &TaskContext) -> Result<Command, NodeError> {
        let done = self.inner.run(input.clone(), ctx).await?;
        let update = done.update.unwrap_or(Value::Null);
        let mut vars = vec![("state", input), ("update", update.clone())];
        if let Some(key) = &self.reply_from {
            let reply = update
                .get(key)
                .and_then(Value::as_array)
                .and_then(|m| m.last())
                .cloned()
                .unwrap_or(Value::Null);
            vars.push(("reply", reply));
        }
        let v = self.then.eval_keeping(&vars, Some("update"), ctx).await?;
        let mut cmd = to_command(v)?;
        cmd.goto.splice(0..0, done.goto);
        Ok(cmd)
    }
}

/// Runs another graph as one node, with its own checkpoints under `node:task_id`.
pub struct SubgraphNode {
    /// The graph.
    pub graph: Arc<Graph>,
    /// Child key <- parent key; `None` passes the keys both graphs share.
    pub input_map: Option<Vec<(String, String)>>,
    /// Parent key <- child key; `None` returns the keys both graphs share.
    pub output_map: Option<Vec<(String, String)>>,
}

fn project(src: &Value, map: &Option<Vec<(String, String)>>, keep: impl Fn(&str) -> bool) -> Value {
    let mut out = Map::new();
    match map {
        Some(pairs) => {
            for (to, from) in pairs {
                if let Some(v) = src.get(from) {
                    out.insert(to.clone(), v.clone());
                }
            }
        }
        None => {
            for (k, v) in src.as_object().into_iter().flatten() {
                if keep(k) {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
    }
    Value::Object(out)
}

#[async_trait]
impl Node for SubgraphNode {
    async fn run(&self, input: Value, ctx: &TaskContext) -> Result<Command, NodeError> {
        let child_input = project(&input, &self.input_map, |k| {
            self.graph.channel_index.contains_key(k)
        });
        let out = crate::pregel::run_subgraph(&self.graph, child_input, ctx).await?;
        // Without a map, every key of the child's output goes up; keys the parent does not
        // have are dropped by the engine.
        Ok(Command::update(project(&out, &self.output_map, |_| true)))
    }
}
