//! Graph documents (already parsed) to compiled graphs: the top level, edges and routes.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Value};

use super::node_kinds::compile_node;
use super::read::{
    check_keys, kind_of, node_ref, obj, required, script, string, string_list, Ctx, PathMap,
};
use super::resources::{compile_models, compile_tools};
use super::state::compile_channel;
use super::SpecError;
use crate::builder::GraphBuilder;
use crate::channels::ChannelKind;
use crate::graph::{Graph, NodeSet, END, START};
use crate::node::Router;
use crate::nodes::{ScriptRouter, ToolsCondition};
use crate::script::{from_dyn, Script, ScriptResources};

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

pub(super) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

pub(super) fn compile_doc(
    cx: &Ctx,
    doc: &Value,
    prefix: &str,
    default_name: &str,
    outer_graphs: &HashMap<String, Arc<Graph>>,
) -> Result<Graph, SpecError> {
    let m = obj(cx, doc, prefix)?;
    if m.contains_key("variants") {
        return compile_variants(cx, m, prefix, default_name, outer_graphs);
    }
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

    // Models, graphs and tools first: nodes refer to them (and tools to graphs).
    let models = compile_models(cx, m.get("models"), &join(prefix, "models"))?;
    let models = Some(Arc::new(models));

    let mut graphs = outer_graphs.clone();
    if let Some(gs) = m.get("graphs") {
        let place = join(prefix, "graphs");
        for (gname, gdoc) in obj(cx, gs, &place)? {
            let gplace = format!("{place}.{gname}");
            let g = match gdoc {
                Value::String(file) => super::import::import(cx, file, gname, &gplace)?,
                _ => compile_doc(cx, gdoc, &gplace, gname, &graphs)?,
            };
            graphs.insert(gname.clone(), Arc::new(g));
        }
    }
    let tools = compile_tools(
        cx,
        m.get("tools"),
        &join(prefix, "tools"),
        &ScriptResources {
            models: models.clone(),
            tools: None,
        },
        &graphs,
    )?;
    let resources = ScriptResources {
        models,
        tools: Some(Arc::new(tools.clone())),
    };

    let state_place = join(prefix, "state");
    let mut channel_names = Vec::new();
    let mut message_keys = Vec::new();
    if let Some(state) = m.get("state") {
        for (key, spec) in obj(cx, state, &state_place)? {
            let place = format!("{state_place}.{key}");
            let ch = compile_channel(cx, key, spec, &place, &resources)?;
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
            &resources,
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
        match node_names.iter().find(|x| looks_like(x, n)) {
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
        if froms.is_empty() {
            return Err(cx.err(format!("{place}.from"), "an edge needs at least one source"));
        }
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
                if targets.is_empty() {
                    return Err(cx.err(format!("{place}.to"), "an edge needs at least one target"));
                }
                if em.contains_key("path_map") {
                    return Err(cx.err(format!("{place}.path_map"), "`path_map` needs a `route`"));
                }
                // Several sources make a join, as `add_edge([a, b], c)` does in LangGraph:
                // the target runs once all of them have run.
                for t in &targets {
                    if froms.len() > 1 {
                        b = b.join(froms.clone(), t.clone());
                    } else {
                        b = b.edge(froms.first().cloned().unwrap_or_default(), t.clone());
                    }
                }
            }
            Some(route) => {
                let (router, path_map) = compile_route(
                    cx,
                    route,
                    em.get("path_map"),
                    &place,
                    &resources,
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

/// Whether `typed` is probably a misspelling of `name`: another case, a prefix either way, or
/// a typo or two (swapped, missing or extra letters).
fn looks_like(name: &str, typed: &str) -> bool {
    let typos = (name.chars().count() / 3).max(1);
    name.eq_ignore_ascii_case(typed)
        || name.starts_with(typed)
        || typed.starts_with(name)
        || strsim::damerau_levenshtein(name, typed) <= typos
}

pub(super) fn node_set(
    cx: &Ctx,
    v: &Value,
    place: &str,
    names: &[String],
) -> Result<NodeSet, SpecError> {
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

/// A graph whose shape the run chooses (`variants:`): each variant a graph file or an inline
/// graph, all with the same state keys; the default's shape is what the graph shows.
fn compile_variants(
    cx: &Ctx,
    m: &serde_json::Map<String, Value>,
    prefix: &str,
    default_name: &str,
    outer_graphs: &HashMap<String, Arc<Graph>>,
) -> Result<Graph, SpecError> {
    check_keys(cx, m, prefix, &["name", "description", "variants"])?;
    let place = join(prefix, "variants");
    let v = obj(cx, &m["variants"], &place)?;
    check_keys(cx, v, &place, &["by", "default", "graphs"])?;
    let key = required(cx, v, "by", &place)?.to_string();
    let gplace = format!("{place}.graphs");
    let Some(docs) = v.get("graphs") else {
        return Err(cx.err(&place, "`variants` needs `graphs`: the variants by name"));
    };
    let name = string(cx, m, "name", prefix)?.unwrap_or(default_name);
    let mut graphs = std::collections::BTreeMap::new();
    for (vname, vdoc) in obj(cx, docs, &gplace)? {
        let vplace = format!("{gplace}.{vname}");
        let g = match vdoc {
            Value::String(file) => super::import::import(cx, file, name, &vplace)?,
            _ => compile_doc(cx, vdoc, &vplace, name, outer_graphs)?,
        };
        graphs.insert(vname.clone(), Arc::new(g));
    }
    let names: Vec<&str> = graphs.keys().map(String::as_str).collect();
    let default = match string(cx, v, "default", &place)? {
        Some(d) if graphs.contains_key(d) => d.to_string(),
        Some(d) => {
            return Err(cx.err(
                format!("{place}.default"),
                format!("`{d}` is not one of the variants ({})", names.join(", ")),
            ))
        }
        None => {
            return Err(cx.err(
                &place,
                "`variants` needs `default`: the variant of a run that names none",
            ))
        }
    };
    let keys = |g: &Graph| -> Vec<String> { g.channels().iter().map(|c| c.name.clone()).collect() };
    let expected = keys(&graphs[&default]);
    for (vname, g) in &graphs {
        if keys(g) != expected {
            return Err(cx.err(
                format!("{gplace}.{vname}"),
                format!(
                    "every variant needs the same state keys, so a thread reads the same whichever ran: `{vname}` has {}, `{default}` has {}",
                    keys(g).join(", "),
                    expected.join(", ")
                ),
            ));
        }
    }
    let default_graph = graphs[&default].clone();
    let mut top = default_graph.with_variants(crate::graph::Variants {
        key,
        default,
        graphs,
    });
    top.name = name.to_string();
    if let Some(d) = string(cx, m, "description", prefix)? {
        top.description = Some(d.to_string());
    }
    Ok(top)
}

pub(super) fn compile_route(
    cx: &Ctx,
    route: &Value,
    path_map: Option<&Value>,
    place: &str,
    resources: &ScriptResources,
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
            Arc::new(ScriptRouter(script(cx, code, &rplace, resources)?)),
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
                    resources,
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
