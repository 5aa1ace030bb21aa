//! Graph documents (already parsed) to compiled graphs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::locate::line_of;
use super::SpecError;
use crate::builder::{GraphBuilder, NodeOptions};
use crate::channels::{ChannelKind, ChannelSpec, CustomReducer};
use crate::graph::{Graph, NodeSet, END, START};
use crate::model::{ChatModel, Chunking, ModelRegistry, OpenAiModel, ScriptedModel, ToolSchema};
use crate::node::{Node, RetryPolicy, Router};
use crate::nodes::{
    InterruptNode, ModelNode, ScriptNode, ScriptRouter, SubgraphNode, ToolsCondition, ToolsNode,
};
use crate::script::{from_dyn, Script, ScriptLimits};
use crate::tools::{Tool, ToolImpl};

/// Router answers mapped to node names.
type PathMap = Vec<(String, String)>;

struct Ctx<'a> {
    file: &'a str,
    source: &'a str,
}

impl Ctx<'_> {
    fn err(&self, place: impl Into<String>, message: impl Into<String>) -> SpecError {
        let place = place.into();
        SpecError {
            file: self.file.to_string(),
            line: if place.is_empty() {
                None
            } else {
                line_of(self.source, &place)
            },
            place,
            message: message.into(),
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn obj<'v>(cx: &Ctx, v: &'v Value, place: &str) -> Result<&'v Map<String, Value>, SpecError> {
    v.as_object()
        .ok_or_else(|| cx.err(place, format!("expected a mapping, found {}", kind_of(v))))
}

fn check_keys(
    cx: &Ctx,
    m: &Map<String, Value>,
    place: &str,
    allowed: &[&str],
) -> Result<(), SpecError> {
    for k in m.keys() {
        if !allowed.contains(&k.as_str()) {
            let at = if place.is_empty() {
                k.clone()
            } else {
                format!("{place}.{k}")
            };
            return Err(cx.err(
                at,
                format!("unknown key `{k}`; expected one of: {}", allowed.join(", ")),
            ));
        }
    }
    Ok(())
}

fn string<'v>(
    cx: &Ctx,
    m: &'v Map<String, Value>,
    key: &str,
    place: &str,
) -> Result<Option<&'v str>, SpecError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(cx.err(
            format!("{place}.{key}"),
            format!("expected a string, found {}", kind_of(other)),
        )),
    }
}

fn required<'v>(
    cx: &Ctx,
    m: &'v Map<String, Value>,
    key: &str,
    place: &str,
) -> Result<&'v str, SpecError> {
    string(cx, m, key, place)?.ok_or_else(|| cx.err(place, format!("`{key}` is required")))
}

fn string_list(cx: &Ctx, v: &Value, place: &str) -> Result<Vec<String>, SpecError> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str().map(str::to_string).ok_or_else(|| {
                    cx.err(
                        format!("{place}[{i}]"),
                        format!("expected a name, found {}", kind_of(x)),
                    )
                })
            })
            .collect(),
        other => Err(cx.err(
            place,
            format!(
                "expected a name or a list of names, found {}",
                kind_of(other)
            ),
        )),
    }
}

fn node_ref(name: &str) -> String {
    match name {
        "START" | "__start__" => START.to_string(),
        "END" | "__end__" => END.to_string(),
        other => other.to_string(),
    }
}

fn script(
    cx: &Ctx,
    code: &str,
    place: &str,
    models: &Option<Arc<ModelRegistry>>,
) -> Result<Arc<Script>, SpecError> {
    Script::compile(code, ScriptLimits::default(), models.clone())
        .map(Arc::new)
        .map_err(|e| {
            let mut err = cx.err(place, format!("script does not compile: {}", e.message));
            if let (Some(base), Some(l)) = (err.line, e.line) {
                // A block scalar (`code: |`) starts on the next line.
                let block =
                    cx.source.lines().nth(base - 1).is_some_and(|t| {
                        t.trim_end().ends_with('|') || t.trim_end().ends_with('>')
                    });
                err.line = Some(base + l - usize::from(!block));
            }
            err
        })
}

/// Compile a parsed graph document.
pub fn compile_value(
    doc: &Value,
    file: &str,
    source: &str,
    default_name: &str,
) -> Result<Graph, SpecError> {
    let cx = Ctx { file, source };
    compile_doc(&cx, doc, "", default_name, &HashMap::new())
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn compile_doc(
    cx: &Ctx,
    doc: &Value,
    prefix: &str,
    default_name: &str,
    outer_graphs: &HashMap<String, Arc<Graph>>,
) -> Result<Graph, SpecError> {
    let m = obj(cx, doc, prefix)?;
    check_keys(
        cx,
        m,
        prefix,
        &[
            "name",
            "description",
            "state",
            "input",
            "output",
            "config",
            "context",
            "models",
            "tools",
            "graphs",
            "nodes",
            "edges",
            "interrupt_before",
            "interrupt_after",
        ],
    )?;
    let name = string(cx, m, "name", prefix)?
        .unwrap_or(default_name)
        .to_string();
    let mut b = GraphBuilder::new(name.clone());
    if let Some(d) = string(cx, m, "description", prefix)? {
        b = b.description(d);
    }

    // Models and tools first: nodes refer to them.
    let models = compile_models(cx, m.get("models"), &join(prefix, "models"))?;
    let models = Some(Arc::new(models));
    let tools = compile_tools(cx, m.get("tools"), &join(prefix, "tools"), &models)?;

    let mut graphs = outer_graphs.clone();
    if let Some(gs) = m.get("graphs") {
        let place = join(prefix, "graphs");
        for (gname, gdoc) in obj(cx, gs, &place)? {
            let g = compile_doc(cx, gdoc, &format!("{place}.{gname}"), gname, &graphs)?;
            graphs.insert(gname.clone(), Arc::new(g));
        }
    }

    let state_place = join(prefix, "state");
    let mut channel_names = Vec::new();
    let mut message_keys = Vec::new();
    if let Some(state) = m.get("state") {
        for (key, spec) in obj(cx, state, &state_place)? {
            let place = format!("{state_place}.{key}");
            let ch = compile_channel(cx, key, spec, &place, &models)?;
            if matches!(ch.kind, ChannelKind::Messages) {
                message_keys.push(key.clone());
            }
            channel_names.push(key.clone());
            b = b.channel(ch);
        }
    }
    for (key, setter) in [("input", true), ("output", false)] {
        if let Some(v) = m.get(key) {
            let place = join(prefix, key);
            let keys = string_list(cx, v, &place)?;
            for (i, k) in keys.iter().enumerate() {
                if !channel_names.contains(k) {
                    return Err(cx.err(
                        format!("{place}[{i}]"),
                        format!("`{k}` is not a state key; declare it under `state`"),
                    ));
                }
            }
            b = if setter {
                b.input_keys(keys)
            } else {
                b.output_keys(keys)
            };
        }
    }
    for key in ["config", "context"] {
        if let Some(v) = m.get(key) {
            let place = join(prefix, key);
            let c = obj(cx, v, &place)?;
            check_keys(cx, c, &place, &["schema", "default"])?;
            let schema = c.get("schema").cloned().unwrap_or(json!({}));
            let default = c.get("default").cloned().unwrap_or(json!({}));
            if !default.is_object() {
                return Err(cx.err(format!("{place}.default"), "expected a mapping"));
            }
            b = if key == "config" {
                b.config(schema, json!({"configurable": default}))
            } else {
                b.context(schema, default)
            };
        }
    }

    let nodes_place = join(prefix, "nodes");
    let Some(nodes) = m.get("nodes") else {
        return Err(cx.err(prefix, "a graph needs `nodes`"));
    };
    let nodes = obj(cx, nodes, &nodes_place)?;
    if nodes.is_empty() {
        return Err(cx.err(&nodes_place, "a graph needs at least one node"));
    }
    let default_messages = message_keys
        .first()
        .cloned()
        .unwrap_or_else(|| "messages".into());
    let node_names: Vec<String> = nodes.keys().cloned().collect();
    for (nname, ndoc) in nodes {
        let place = format!("{nodes_place}.{nname}");
        if channel_names.contains(nname) {
            return Err(cx.err(
                &place,
                format!("`{nname}` is also a state key; give the node another name"),
            ));
        }
        let (runner, options) = compile_node(
            cx,
            ndoc,
            &place,
            &models,
            &tools,
            &graphs,
            &default_messages,
            &channel_names,
        )?;
        b = b.node_with(nname.clone(), runner, options);
    }

    let edges_place = join(prefix, "edges");
    let Some(edges) = m.get("edges") else {
        return Err(cx.err(
            prefix,
            "a graph needs `edges` (at least one from `__start__`)",
        ));
    };
    let Value::Array(edges) = edges else {
        return Err(cx.err(
            &edges_place,
            format!("expected a list of edges, found {}", kind_of(edges)),
        ));
    };
    let known = |n: &str| n == START || n == END || node_names.iter().any(|x| x == n);
    let suggest = |n: &str| -> String {
        let close: Vec<&String> = node_names
            .iter()
            .filter(|x| x.eq_ignore_ascii_case(n) || x.starts_with(n) || n.starts_with(x.as_str()))
            .collect();
        match close.first() {
            Some(c) => format!(" (did you mean `{c}`?)"),
            None => format!("; nodes are: {}", node_names.join(", ")),
        }
    };
    for (i, e) in edges.iter().enumerate() {
        let place = format!("{edges_place}[{i}]");
        let em = obj(cx, e, &place)?;
        check_keys(cx, em, &place, &["from", "to", "route", "path_map"])?;
        let from_v = em
            .get("from")
            .ok_or_else(|| cx.err(&place, "an edge needs `from`"))?;
        let froms: Vec<String> = string_list(cx, from_v, &format!("{place}.from"))?
            .iter()
            .map(|s| node_ref(s))
            .collect();
        for f in &froms {
            if !known(f) || f == END {
                return Err(cx.err(
                    format!("{place}.from"),
                    format!("unknown node `{f}`{}", suggest(f)),
                ));
            }
        }
        let targets: Option<Vec<String>> = match em.get("to") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                string_list(cx, v, &format!("{place}.to"))?
                    .iter()
                    .map(|s| node_ref(s))
                    .collect(),
            ),
        };
        for t in targets.iter().flatten() {
            if !known(t) || t == START {
                return Err(cx.err(
                    format!("{place}.to"),
                    format!("unknown node `{t}`{}", suggest(t)),
                ));
            }
        }
        match em.get("route") {
            None => {
                let targets = targets.ok_or_else(|| {
                    cx.err(
                        &place,
                        "an edge needs `to` (or `route` for a conditional edge)",
                    )
                })?;
                if em.contains_key("path_map") {
                    return Err(cx.err(format!("{place}.path_map"), "`path_map` needs a `route`"));
                }
                for f in &froms {
                    for t in &targets {
                        b = b.edge(f.clone(), t.clone());
                    }
                }
            }
            Some(route) => {
                let (router, path_map) = compile_route(
                    cx,
                    route,
                    em.get("path_map"),
                    &place,
                    &models,
                    &default_messages,
                    &node_names,
                )?;
                if let Some(pm) = &path_map {
                    for (k, t) in pm {
                        if !known(t) {
                            return Err(cx.err(
                                format!("{place}.path_map.{k}"),
                                format!("unknown node `{t}`{}", suggest(t)),
                            ));
                        }
                    }
                }
                for f in &froms {
                    b = b.branch(f.clone(), router.clone(), path_map.clone(), targets.clone());
                }
            }
        }
    }
    for key in ["interrupt_before", "interrupt_after"] {
        if let Some(v) = m.get(key) {
            let place = join(prefix, key);
            let set = node_set(cx, v, &place, &node_names)?;
            b = if key == "interrupt_before" {
                b.interrupt_before(set)
            } else {
                b.interrupt_after(set)
            };
        }
    }
    b.compile().map_err(|e| {
        let place = if e.place.starts_with("edges")
            || e.place.starts_with("nodes")
            || e.place.starts_with("state")
        {
            join(prefix, &e.place)
        } else {
            prefix.to_string()
        };
        cx.err(place, e.message)
    })
}

fn node_set(cx: &Ctx, v: &Value, place: &str, names: &[String]) -> Result<NodeSet, SpecError> {
    let set = NodeSet::from_value(v)
        .ok_or_else(|| cx.err(place, "expected \"*\" or a list of node names"))?;
    if let NodeSet::Some(list) = &set {
        for (i, n) in list.iter().enumerate() {
            if !names.contains(n) {
                return Err(cx.err(format!("{place}[{i}]"), format!("unknown node `{n}`")));
            }
        }
    }
    Ok(set)
}

#[derive(Debug)]
struct ScriptReducer(Arc<Script>);

impl CustomReducer for ScriptReducer {
    fn reduce(&self, current: Value, update: Value) -> Result<Value, String> {
        self.0
            .eval_pure(&[("current", current), ("update", update)])
    }
}

fn type_schema(t: &str) -> Option<Value> {
    Some(match t {
        "string" | "integer" | "number" | "boolean" | "object" | "array" | "null" => {
            json!({"type": t})
        }
        "any" => json!({}),
        _ => return None,
    })
}

fn default_fits(schema: &Value, v: &Value) -> bool {
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        _ => true,
    }
}

fn compile_channel(
    cx: &Ctx,
    key: &str,
    spec: &Value,
    place: &str,
    models: &Option<Arc<ModelRegistry>>,
) -> Result<ChannelSpec, SpecError> {
    let reducers = "last_value, messages, append, add, ephemeral, topic, script";
    let by_reducer = |r: &str| -> Option<ChannelKind> {
        Some(match r {
            "last_value" => ChannelKind::LastValue,
            "messages" | "add_messages" => ChannelKind::Messages,
            "append" => ChannelKind::Append,
            "add" => ChannelKind::Add,
            "ephemeral" => ChannelKind::Ephemeral,
            "topic" => ChannelKind::Topic { accumulate: false },
            _ => return None,
        })
    };
    match spec {
        Value::String(s) => {
            if let Some(kind) = by_reducer(s) {
                return Ok(ChannelSpec::new(key, kind));
            }
            if let Some(schema) = type_schema(s) {
                return Ok(ChannelSpec::new(key, ChannelKind::LastValue).with_schema(schema));
            }
            Err(cx.err(place, format!("`{s}` is neither a reducer ({reducers}) nor a type (string, integer, number, boolean, object, array, any)")))
        }
        Value::Null => Ok(ChannelSpec::new(key, ChannelKind::LastValue)),
        Value::Object(m) => {
            check_keys(
                cx,
                m,
                place,
                &[
                    "type",
                    "reducer",
                    "default",
                    "description",
                    "enum",
                    "items",
                    "accumulate",
                    "code",
                    "schema",
                ],
            )?;
            let kind = match string(cx, m, "reducer", place)? {
                None => ChannelKind::LastValue,
                Some("script") => {
                    let code = required(cx, m, "code", place)?;
                    ChannelKind::Custom(Arc::new(ScriptReducer(script(
                        cx,
                        code,
                        &format!("{place}.code"),
                        models,
                    )?)))
                }
                Some("topic") => ChannelKind::Topic {
                    accumulate: m
                        .get("accumulate")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                },
                Some(r) => by_reducer(r).ok_or_else(|| {
                    cx.err(
                        format!("{place}.reducer"),
                        format!("unknown reducer `{r}`; expected one of: {reducers}"),
                    )
                })?,
            };
            let mut ch = ChannelSpec::new(key, kind);
            let mut schema = match m.get("schema") {
                Some(Value::Object(s)) => s.clone(),
                Some(other) => {
                    return Err(cx.err(
                        format!("{place}.schema"),
                        format!("expected a JSON Schema mapping, found {}", kind_of(other)),
                    ))
                }
                None => ch.schema.as_object().cloned().unwrap_or_default(),
            };
            if let Some(t) = string(cx, m, "type", place)? {
                let ts = type_schema(t).ok_or_else(|| cx.err(format!("{place}.type"), format!("unknown type `{t}`; expected string, integer, number, boolean, object, array or any")))?;
                schema.remove("type");
                if let Value::Object(o) = ts {
                    schema.extend(o);
                }
            }
            for k in ["enum", "items", "description"] {
                if let Some(v) = m.get(k) {
                    schema.insert(k.into(), v.clone());
                }
            }
            ch = ch.with_schema(Value::Object(schema));
            if let Some(d) = m.get("default") {
                if !default_fits(&ch.schema, d) {
                    return Err(cx.err(
                        format!("{place}.default"),
                        format!(
                            "the default {d} does not match the type `{}`",
                            ch.schema["type"].as_str().unwrap_or("?")
                        ),
                    ));
                }
                if matches!(ch.kind, ChannelKind::Messages | ChannelKind::Append) && !d.is_array() {
                    return Err(cx.err(
                        format!("{place}.default"),
                        "a list channel's default must be a list",
                    ));
                }
                if let (Some(Value::Array(allowed)), false) = (ch.schema.get("enum"), d.is_null()) {
                    if !allowed.contains(d) {
                        return Err(cx.err(
                            format!("{place}.default"),
                            format!("the default {d} is not one of the `enum` values"),
                        ));
                    }
                }
                ch = ch.with_default(d.clone());
            }
            Ok(ch)
        }
        other => Err(cx.err(
            place,
            format!(
                "expected a reducer name, a type or a mapping, found {}",
                kind_of(other)
            ),
        )),
    }
}

fn compile_models(cx: &Ctx, v: Option<&Value>, place: &str) -> Result<ModelRegistry, SpecError> {
    let mut reg = ModelRegistry::default();
    let Some(v) = v else { return Ok(reg) };
    for (name, spec) in obj(cx, v, place)? {
        let p = format!("{place}.{name}");
        let m = obj(cx, spec, &p)?;
        let provider = required(cx, m, "provider", &p)?;
        let model: Arc<dyn ChatModel> = match provider {
            "scripted" => {
                check_keys(cx, m, &p, &["provider", "responses", "chunk", "delay_ms"])?;
                let responses = match m.get("responses") {
                    Some(Value::Array(r)) if !r.is_empty() => r.clone(),
                    _ => {
                        return Err(
                            cx.err(&p, "a scripted model needs a non-empty `responses` list")
                        )
                    }
                };
                for (i, r) in responses.iter().enumerate() {
                    let ok = r.is_string()
                        || r.as_object().is_some_and(|o| {
                            o.keys()
                                .all(|k| ["content", "tool_calls", "id"].contains(&k.as_str()))
                        });
                    if !ok {
                        return Err(cx.err(
                            format!("{p}.responses[{i}]"),
                            "a response is a text or a mapping of `content`, `tool_calls` and `id`",
                        ));
                    }
                    for (j, c) in r
                        .get("tool_calls")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .enumerate()
                    {
                        if c.get("name").and_then(Value::as_str).is_none() {
                            return Err(cx.err(
                                format!("{p}.responses[{i}].tool_calls[{j}]"),
                                "a tool call needs a `name`",
                            ));
                        }
                    }
                }
                let chunking = match string(cx, m, "chunk", &p)?.unwrap_or("word") {
                    "char" => Chunking::Char,
                    "word" => Chunking::Word,
                    "whole" | "none" => Chunking::Whole,
                    other => {
                        return Err(cx.err(
                            format!("{p}.chunk"),
                            format!("unknown chunking `{other}`; expected char, word or whole"),
                        ))
                    }
                };
                let delay = m.get("delay_ms").and_then(Value::as_u64).unwrap_or(0);
                Arc::new(ScriptedModel {
                    responses,
                    chunking,
                    delay: Duration::from_millis(delay),
                })
            }
            "openai" | "openai_compatible" => {
                check_keys(
                    cx,
                    m,
                    &p,
                    &[
                        "provider",
                        "base_url",
                        "base_url_env",
                        "model",
                        "model_env",
                        "api_key_env",
                        "params",
                    ],
                )?;
                let env = |key: &str| -> Result<Option<String>, SpecError> {
                    Ok(string(cx, m, key, &p)?
                        .and_then(|var| std::env::var(var).ok())
                        .filter(|s| !s.is_empty()))
                };
                let base_url = env("base_url_env")?
                    .or(string(cx, m, "base_url", &p)?.map(str::to_string))
                    .ok_or_else(|| cx.err(&p, "an openai model needs `base_url` (or `base_url_env` naming a set variable)"))?;
                let model = env("model_env")?
                    .or(string(cx, m, "model", &p)?.map(str::to_string))
                    .ok_or_else(|| {
                        cx.err(
                            &p,
                            "an openai model needs `model` (or `model_env` naming a set variable)",
                        )
                    })?;
                let params = match m.get("params") {
                    None => Map::new(),
                    Some(v) => obj(cx, v, &format!("{p}.params"))?.clone(),
                };
                Arc::new(OpenAiModel {
                    base_url,
                    model,
                    api_key: env("api_key_env")?,
                    params,
                    client: reqwest::Client::new(),
                })
            }
            other => {
                return Err(cx.err(
                    format!("{p}.provider"),
                    format!("unknown provider `{other}`; expected scripted or openai"),
                ))
            }
        };
        reg.insert(name.clone(), model);
    }
    Ok(reg)
}

fn compile_tools(
    cx: &Ctx,
    v: Option<&Value>,
    place: &str,
    models: &Option<Arc<ModelRegistry>>,
) -> Result<HashMap<String, Arc<Tool>>, SpecError> {
    let mut out = HashMap::new();
    let Some(v) = v else { return Ok(out) };
    for (name, spec) in obj(cx, v, place)? {
        let p = format!("{place}.{name}");
        let m = obj(cx, spec, &p)?;
        let parameters = m
            .get("parameters")
            .cloned()
            .unwrap_or(json!({"type": "object", "properties": {}}));
        if !parameters.is_object() {
            return Err(cx.err(format!("{p}.parameters"), "expected a JSON Schema mapping"));
        }
        let schema = ToolSchema {
            name: name.clone(),
            description: string(cx, m, "description", &p)?
                .unwrap_or_default()
                .to_string(),
            parameters,
        };
        let imp = match required(cx, m, "kind", &p)? {
            "script" => {
                check_keys(cx, m, &p, &["kind", "description", "parameters", "code"])?;
                ToolImpl::Script(script(
                    cx,
                    required(cx, m, "code", &p)?,
                    &format!("{p}.code"),
                    models,
                )?)
            }
            "http" => {
                check_keys(
                    cx,
                    m,
                    &p,
                    &[
                        "kind",
                        "description",
                        "parameters",
                        "method",
                        "url",
                        "headers",
                    ],
                )?;
                let method = string(cx, m, "method", &p)?.unwrap_or("GET");
                let method = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
                    .map_err(|_| {
                        cx.err(
                            format!("{p}.method"),
                            format!("`{method}` is not an HTTP method"),
                        )
                    })?;
                let url = required(cx, m, "url", &p)?;
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(cx.err(
                        format!("{p}.url"),
                        "the URL must start with http:// or https://",
                    ));
                }
                let headers = match m.get("headers") {
                    None => Vec::new(),
                    Some(h) => obj(cx, h, &format!("{p}.headers"))?
                        .iter()
                        .map(|(k, v)| {
                            (
                                k.clone(),
                                v.as_str()
                                    .map(str::to_string)
                                    .unwrap_or_else(|| v.to_string()),
                            )
                        })
                        .collect(),
                };
                ToolImpl::Http {
                    method,
                    url: url.to_string(),
                    headers,
                    client: reqwest::Client::new(),
                }
            }
            other => {
                return Err(cx.err(
                    format!("{p}.kind"),
                    format!("unknown tool kind `{other}`; expected script or http"),
                ))
            }
        };
        out.insert(name.clone(), Arc::new(Tool { schema, imp }));
    }
    Ok(out)
}

fn pick_tools(
    cx: &Ctx,
    m: &Map<String, Value>,
    place: &str,
    tools: &HashMap<String, Arc<Tool>>,
) -> Result<Vec<Arc<Tool>>, SpecError> {
    let Some(v) = m.get("tools") else {
        return Ok(Vec::new());
    };
    let names = string_list(cx, v, &format!("{place}.tools"))?;
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            tools.get(n).cloned().ok_or_else(|| {
                let mut known: Vec<&String> = tools.keys().collect();
                known.sort();
                cx.err(
                    format!("{place}.tools[{i}]"),
                    format!(
                        "unknown tool `{n}`; declare it under `tools` (declared: {})",
                        known
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
        })
        .collect()
}

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
fn compile_node(
    cx: &Ctx,
    doc: &Value,
    place: &str,
    models: &Option<Arc<ModelRegistry>>,
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
    let messages_key = string(cx, m, "messages_key", place)?
        .unwrap_or(default_messages)
        .to_string();
    let get_model = |m: &Map<String, Value>| -> Result<Arc<dyn ChatModel>, SpecError> {
        let name = required(cx, m, "model", place)?;
        models.as_ref().and_then(|r| r.get(name)).ok_or_else(|| {
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
        ["kind", "retry", "description"]
            .iter()
            .chain(extra.iter())
            .copied()
            .collect()
    }
    let runner: Arc<dyn Node> = match kind {
        "script" => {
            check_keys(cx, m, place, &allow(&["code"]))?;
            Arc::new(ScriptNode(script(cx, required(cx, m, "code", place)?, &format!("{place}.code"), models)?))
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
    Ok((runner, options))
}

fn compile_route(
    cx: &Ctx,
    route: &Value,
    path_map: Option<&Value>,
    place: &str,
    models: &Option<Arc<ModelRegistry>>,
    default_messages: &str,
    node_names: &[String],
) -> Result<(Arc<dyn Router>, Option<PathMap>), SpecError> {
    let rplace = format!("{place}.route");
    let (router, inner_map): (Arc<dyn Router>, Option<&Value>) = match route {
        Value::String(s) if s == "tools_condition" => {
            if !node_names.iter().any(|n| n == "tools") {
                return Err(cx.err(
                    &rplace,
                    "`tools_condition` routes to a node named `tools`, and there is none",
                ));
            }
            (
                Arc::new(ToolsCondition {
                    messages_key: default_messages.to_string(),
                    tools_node: "tools".into(),
                }),
                None,
            )
        }
        Value::String(code) => (
            Arc::new(ScriptRouter(script(cx, code, &rplace, models)?)),
            None,
        ),
        Value::Object(m) => {
            check_keys(cx, m, &rplace, &["code", "path_map"])?;
            let code = required(cx, m, "code", &rplace)?;
            (
                Arc::new(ScriptRouter(script(
                    cx,
                    code,
                    &format!("{rplace}.code"),
                    models,
                )?)),
                m.get("path_map"),
            )
        }
        other => {
            return Err(cx.err(
                &rplace,
                format!(
                    "expected `tools_condition`, a script, or a mapping with `code`, found {}",
                    kind_of(other)
                ),
            ))
        }
    };
    let pm = match path_map.or(inner_map) {
        None => None,
        Some(v) => {
            let pp = format!("{place}.path_map");
            let mm = obj(cx, v, &pp)?;
            let mut out = Vec::new();
            for (k, t) in mm {
                let t = t
                    .as_str()
                    .ok_or_else(|| cx.err(format!("{pp}.{k}"), "expected a node name"))?;
                out.push((k.clone(), node_ref(t)));
            }
            Some(out)
        }
    };
    Ok((router, pm))
}

impl Script {
    /// Run a script that needs no task (custom reducers): no interrupts, store or stream.
    pub fn eval_pure(&self, vars: &[(&str, Value)]) -> Result<Value, String> {
        self.eval_detached(vars).map(|d| from_dyn(&d))
    }
}
