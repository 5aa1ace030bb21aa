//! Nodes of a graph file, by kind: script, model, tools, interrupt, subgraph, agent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::compile::{compile_doc, node_set};
use super::read::{check_keys, obj, required, script, string, string_list, Ctx};
use super::resources::pick_tools;
use super::SpecError;
use crate::builder::NodeOptions;
use crate::graph::Graph;
use crate::node::{Node, RetryPolicy};
use crate::nodes::{
    InterruptNode, ModelNode, NodeModel, ScriptNode, SubgraphNode, ThenNode, ToolsNode,
};
use crate::prompt;
use crate::script::ScriptResources;
use crate::tools::Tool;

fn retry_policy(cx: &Ctx, v: &Value, place: &str) -> Result<RetryPolicy, SpecError> {
    let m = obj(cx, v, place)?;
    check_keys(
        cx,
        m,
        place,
        &[
            "max_attempts",
            "initial_interval_ms",
            "backoff_factor",
            "max_interval_ms",
            "retry_on",
        ],
    )?;
    let mut p = RetryPolicy::default();
    if let Some(v) = m.get("max_attempts") {
        p.max_attempts = v.as_u64().filter(|n| *n >= 1).ok_or_else(|| {
            cx.err(
                format!("{place}.max_attempts"),
                "expected a whole number >= 1",
            )
        })? as u32;
    }
    if let Some(v) = m.get("initial_interval_ms") {
        p.initial_interval = Duration::from_millis(v.as_u64().ok_or_else(|| {
            cx.err(
                format!("{place}.initial_interval_ms"),
                "expected milliseconds",
            )
        })?);
    }
    if let Some(v) = m.get("max_interval_ms") {
        p.max_interval =
            Duration::from_millis(v.as_u64().ok_or_else(|| {
                cx.err(format!("{place}.max_interval_ms"), "expected milliseconds")
            })?);
    }
    if let Some(v) = m.get("backoff_factor") {
        p.backoff_factor = v
            .as_f64()
            .filter(|f| *f >= 1.0)
            .ok_or_else(|| cx.err(format!("{place}.backoff_factor"), "expected a number >= 1"))?;
    }
    if let Some(v) = m.get("retry_on") {
        p.retry_on = string_list(cx, v, &format!("{place}.retry_on"))?;
    }
    Ok(p)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn compile_node(
    cx: &Ctx,
    doc: &Value,
    place: &str,
    resources: &ScriptResources,
    tools: &HashMap<String, Arc<Tool>>,
    graphs: &HashMap<String, Arc<Graph>>,
    default_messages: &str,
    channels: &[String],
) -> Result<(Arc<dyn Node>, NodeOptions), SpecError> {
    let m = obj(cx, doc, place)?;
    let kind = required(cx, m, "kind", place)?;
    let mut options = NodeOptions::default();
    if let Some(r) = m.get("retry") {
        options.retry = Some(retry_policy(cx, r, &format!("{place}.retry"))?);
    }
    if let Some(d) = m.get("destinations") {
        options.destinations = string_list(cx, d, &format!("{place}.destinations"))?;
    }
    let messages_key = string(cx, m, "messages_key", place)?
        .unwrap_or(default_messages)
        .to_string();
    // `model: "{key}"` lets each run choose among the declared models (`context.key`).
    let get_model = |m: &Map<String, Value>| -> Result<NodeModel, SpecError> {
        let name = required(cx, m, "model", place)?;
        let registry = resources.models.as_ref().filter(|r| !r.names().is_empty());
        if let Some(key) = prompt::sole_placeholder(name) {
            let models = registry.cloned().ok_or_else(|| {
                cx.err(
                    format!("{place}.model"),
                    format!(
                        "`{name}` chooses a model per run, and none is declared under `models`"
                    ),
                )
            })?;
            return Ok(NodeModel::PerRun {
                key: key.to_string(),
                models,
            });
        }
        registry
            .and_then(|r| r.get(name))
            .map(NodeModel::Fixed)
            .ok_or_else(|| {
                cx.err(
                    format!("{place}.model"),
                    format!("unknown model `{name}`; declare it under `models`"),
                )
            })
    };
    let need_messages = |what: &str| -> Result<(), SpecError> {
        if channels.iter().any(|c| c == &messages_key) {
            Ok(())
        } else {
            Err(cx.err(place, format!("a {what} node needs a `{messages_key}` state key (declare `{messages_key}: messages` under `state`, or set `messages_key`)")))
        }
    };
    fn allow(extra: &[&'static str]) -> Vec<&'static str> {
        ["kind", "retry", "description", "destinations", "then"]
            .iter()
            .chain(extra.iter())
            .copied()
            .collect()
    }
    let reply_key = messages_key.clone();
    let runner: Arc<dyn Node> = match kind {
        "script" => {
            // A script does what `then` would itself.
            check_keys(cx, m, place, &["kind", "retry", "description", "destinations", "code"])?;
            Arc::new(ScriptNode(script(cx, required(cx, m, "code", place)?, &format!("{place}.code"), resources)?))
        }
        "model" => {
            check_keys(cx, m, place, &allow(&["model", "tools", "system", "stream", "messages_key"]))?;
            need_messages("model")?;
            let picked = pick_tools(cx, m, place, tools)?;
            Arc::new(ModelNode {
                model: get_model(m)?,
                tools: picked.iter().map(|t| t.schema.clone()).collect(),
                system: string(cx, m, "system", place)?.map(str::to_string),
                stream: m.get("stream").and_then(Value::as_bool).unwrap_or(true),
                messages_key,
            })
        }
        "tools" => {
            check_keys(cx, m, place, &allow(&["tools", "messages_key"]))?;
            need_messages("tools")?;
            Arc::new(ToolsNode { tools: pick_tools(cx, m, place, tools)?, messages_key })
        }
        "interrupt" => {
            check_keys(cx, m, place, &allow(&["payload", "write_to"]))?;
            let write_to = string(cx, m, "write_to", place)?.map(str::to_string);
            if let Some(w) = &write_to {
                if !channels.contains(w) {
                    return Err(cx.err(format!("{place}.write_to"), format!("`{w}` is not a state key")));
                }
            }
            Arc::new(InterruptNode { payload: m.get("payload").cloned().unwrap_or(Value::Null), write_to })
        }
        "subgraph" => {
            check_keys(cx, m, place, &allow(&["graph", "input", "output", "interrupt_before", "interrupt_after"]))?;
            let g = match m.get("graph") {
                Some(Value::String(name)) => graphs.get(name).cloned().ok_or_else(|| cx.err(format!("{place}.graph"), format!("unknown graph `{name}`; declare it under `graphs`")))?,
                Some(inline @ Value::Object(_)) => Arc::new(compile_doc(cx, inline, &format!("{place}.graph"), "subgraph", graphs)?),
                _ => return Err(cx.err(place, "a subgraph node needs `graph`: a name under `graphs` or an inline graph")),
            };
            let g = if m.contains_key("interrupt_before") || m.contains_key("interrupt_after") {
                let names: Vec<String> = g.node_names().map(str::to_string).collect();
                let before = m.get("interrupt_before").map(|v| node_set(cx, v, &format!("{place}.interrupt_before"), &names)).transpose()?;
                let after = m.get("interrupt_after").map(|v| node_set(cx, v, &format!("{place}.interrupt_after"), &names)).transpose()?;
                Arc::new(g.with_interrupts(before, after))
            } else {
                g
            };
            let map = |key: &str, own: &[String], other: Vec<String>| -> Result<Option<Vec<(String, String)>>, SpecError> {
                let Some(v) = m.get(key) else { return Ok(None) };
                let p = format!("{place}.{key}");
                let mm = obj(cx, v, &p)?;
                let mut out = Vec::new();
                for (to, from) in mm {
                    let from = from.as_str().ok_or_else(|| cx.err(format!("{p}.{to}"), "expected a state key name"))?;
                    let (tk, fk) = if key == "input" { (&other, own) } else { (&own.to_vec(), &other[..]) };
                    if !tk.contains(to) || !fk.iter().any(|x| x == from) {
                        return Err(cx.err(format!("{p}.{to}"), format!("`{to}: {from}` must map a {} key to a {} key", if key == "input" { "subgraph" } else { "parent" }, if key == "input" { "parent" } else { "subgraph" })));
                    }
                    out.push((to.clone(), from.to_string()));
                }
                Ok(Some(out))
            };
            let child_keys: Vec<String> = g.channels().iter().map(|c| c.name.clone()).collect();
            let input_map = map("input", channels, child_keys.clone())?;
            let output_map = map("output", channels, child_keys)?;
            options.subgraph = Some(g.clone());
            Arc::new(SubgraphNode { graph: g, input_map, output_map })
        }
        "agent" => {
            check_keys(cx, m, place, &allow(&["model", "tools", "system", "stream", "messages_key"]))?;
            need_messages("agent")?;
            let picked = pick_tools(cx, m, place, tools)?;
            let g = crate::prebuilt::agent_graph(
                "agent",
                get_model(m)?,
                picked,
                string(cx, m, "system", place)?.map(str::to_string),
                m.get("stream").and_then(Value::as_bool).unwrap_or(true),
            )
            .map_err(|e| cx.err(place, e.to_string()))?;
            let g = Arc::new(g);
            options.subgraph = Some(g.clone());
            let io = Some(vec![("messages".to_string(), messages_key.clone())]);
            let out = Some(vec![(messages_key, "messages".to_string())]);
            Arc::new(SubgraphNode { graph: g, input_map: io, output_map: out })
        }
        other => {
            return Err(cx.err(format!("{place}.kind"), format!("unknown node kind `{other}`; expected script, model, tools, interrupt, subgraph or agent")))
        }
    };
    let runner = match string(cx, m, "then", place)? {
        Some(code) => Arc::new(ThenNode {
            inner: runner,
            then: script(cx, code, &format!("{place}.then"), resources)?,
            reply_from: matches!(kind, "model" | "agent").then_some(reply_key),
        }),
        None => runner,
    };
    Ok((runner, options))
}
