//! The compiled graph: channels, nodes, edges and branches, plus what the assistants
//! endpoints show of it (schemas, drawable graph, subgraphs).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::channels::{ChannelKind, ChannelSpec};
use crate::node::{Node, RetryPolicy, Router};

/// The virtual entry node.
pub const START: &str = "__start__";
/// The virtual exit node.
pub const END: &str = "__end__";

/// Nodes before/after which a run stops (`interrupt_before`/`interrupt_after`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodeSet {
    /// None.
    #[default]
    None,
    /// Every node (`"*"`).
    All,
    /// These nodes.
    Some(Vec<String>),
}

impl NodeSet {
    /// Whether the set holds a node.
    pub fn contains(&self, node: &str) -> bool {
        match self {
            NodeSet::None => false,
            NodeSet::All => true,
            NodeSet::Some(list) => list.iter().any(|n| n == node),
        }
    }

    /// Read `"*"` or a list of names.
    pub fn from_value(v: &Value) -> Option<NodeSet> {
        match v {
            Value::Null => Some(NodeSet::None),
            Value::String(s) if s == "*" => Some(NodeSet::All),
            Value::Array(items) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(NodeSet::Some),
            _ => None,
        }
    }
}

/// How `drawable` shows subgraphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XRay {
    /// Subgraphs are single nodes.
    #[default]
    Off,
    /// Expand subgraphs this many levels deep.
    Depth(u32),
    /// Expand every level.
    All,
}

impl XRay {
    /// Read the `xray` query parameter (`true`, `false` or a depth).
    pub fn parse(s: &str) -> XRay {
        match s {
            "true" | "True" => XRay::All,
            "false" | "False" | "0" | "" => XRay::Off,
            n => n.parse::<u32>().map(XRay::Depth).unwrap_or(XRay::Off),
        }
    }

    fn deeper(self) -> Option<XRay> {
        match self {
            XRay::Off | XRay::Depth(0) => None,
            XRay::Depth(n) => Some(XRay::Depth(n - 1)),
            XRay::All => Some(XRay::All),
        }
    }
}

/// A node of a compiled graph.
#[derive(Clone)]
pub struct NodeDef {
    pub(crate) name: String,
    pub(crate) runner: Arc<dyn Node>,
    pub(crate) retry: Option<RetryPolicy>,
    pub(crate) subgraph: Option<Arc<Graph>>,
    /// Where a `Command` from it may go, for drawing ([`crate::NodeOptions::destinations`]).
    pub(crate) destinations: Vec<String>,
}

/// A conditional edge.
#[derive(Clone)]
pub struct Branch {
    pub(crate) source: String,
    pub(crate) router: Arc<dyn Router>,
    /// Maps the router's answers to node names; `None` takes answers as node names.
    pub(crate) path_map: Option<Vec<(String, String)>>,
    /// Possible targets, for drawing; `None` means any node.
    pub(crate) targets: Option<Vec<String>>,
}

/// A join: `target` runs once every source has run since its last run (LangGraph's
/// `add_edge([a, b], c)`). Which sources have run is kept in a hidden channel.
#[derive(Clone, Debug)]
pub struct Join {
    pub(crate) sources: Vec<String>,
    pub(crate) target: String,
    /// Index of the hidden channel in `Graph::channels`.
    pub(crate) channel: usize,
}

/// JSON Schemas of a graph, as `/assistants/{id}/schemas` returns them.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphSchemas {
    /// Schema of the run input.
    pub input_schema: Value,
    /// Schema of the run output.
    pub output_schema: Value,
    /// Schema of the whole state.
    pub state_schema: Value,
    /// Schema of `config.configurable`.
    pub config_schema: Value,
    /// Schema of the run `context`.
    pub context_schema: Value,
}

/// Graphs one graph id runs, each run choosing by name: LangGraph's graph factories, for
/// graph files, whose shape can then depend on the run's config. Every variant has the same
/// state keys (checked when loaded), so a thread's state reads the same whichever ran.
#[derive(Debug)]
pub struct Variants {
    /// Where the run names its choice: its context, else its `config.configurable`.
    pub key: String,
    /// The variant of a run that names none.
    pub default: String,
    /// The variants by name.
    pub graphs: BTreeMap<String, Arc<Graph>>,
}

/// A compiled graph. Cheap to share as `Arc<Graph>`; immutable once built.
#[derive(Clone)]
pub struct Graph {
    pub(crate) name: String,
    pub(crate) description: Option<String>,
    pub(crate) channels: Vec<ChannelSpec>,
    pub(crate) channel_index: HashMap<String, usize>,
    pub(crate) nodes: Vec<NodeDef>,
    pub(crate) node_index: HashMap<String, usize>,
    /// Fixed edges `(source, target)`; source may be `START`, target may be `END`.
    pub(crate) edges: Vec<(String, String)>,
    pub(crate) branches: Vec<Branch>,
    pub(crate) joins: Vec<Join>,
    /// Per node (and `START`): the joins it is a source of.
    pub(crate) out_joins: Vec<Vec<usize>>,
    /// Per node (and `START` at index `nodes.len()`): fixed targets and branch indices.
    pub(crate) out_edges: Vec<Vec<String>>,
    pub(crate) out_branches: Vec<Vec<usize>>,
    /// `branch:to:<node>` per node, made once instead of at every checkpoint.
    pub(crate) trigger_names: Vec<String>,
    pub(crate) interrupt_before: NodeSet,
    pub(crate) interrupt_after: NodeSet,
    pub(crate) input_keys: Vec<String>,
    pub(crate) output_keys: Vec<String>,
    pub(crate) config_schema: Value,
    pub(crate) context_schema: Value,
    pub(crate) default_config: Value,
    pub(crate) default_context: Value,
    /// What a run may choose instead of this graph (which is their default).
    pub(crate) variants: Option<Arc<Variants>>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("name", &self.name)
            .field(
                "nodes",
                &self
                    .nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("edges", &self.edges)
            .finish_non_exhaustive()
    }
}

/// Bookkeeping channels (joins) are not part of the state users see.
pub(crate) fn is_hidden(channel: &str) -> bool {
    channel.starts_with("__")
}

fn title_case(key: &str) -> String {
    key.split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(first) => first.to_uppercase().collect::<String>() + c.as_str(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn sorted_object(map: Map<String, Value>) -> Value {
    let mut entries: Vec<(String, Value)> = map.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Value::Object(entries.into_iter().collect())
}

impl Graph {
    /// The graph's name (its graph id when loaded from a file).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The description from the graph file, if any.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// Node names in declaration order.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.name.as_str())
    }

    /// State channels in declaration order (hidden bookkeeping channels excluded).
    pub fn channels(&self) -> &[ChannelSpec] {
        let user = self
            .channels
            .iter()
            .take_while(|c| !is_hidden(&c.name))
            .count();
        &self.channels[..user]
    }

    /// Static interrupts compiled into the graph.
    pub fn interrupts(&self) -> (&NodeSet, &NodeSet) {
        (&self.interrupt_before, &self.interrupt_after)
    }

    /// A copy with other static interrupts (a subgraph node's own `interrupt_before`/`after`).
    pub fn with_interrupts(&self, before: Option<NodeSet>, after: Option<NodeSet>) -> Graph {
        let mut g = self.clone();
        if let Some(before) = before {
            g.interrupt_before = before;
        }
        if let Some(after) = after {
            g.interrupt_after = after;
        }
        g
    }

    /// The graph a run with this config and context runs: the variant it chooses when this
    /// graph has variants (see [`Variants`]), else this one. Fails naming the choices when
    /// the run names one the graph does not have.
    pub fn for_run(
        self: &Arc<Self>,
        config: &Value,
        context: &Value,
    ) -> Result<Arc<Graph>, String> {
        let Some(v) = &self.variants else {
            return Ok(self.clone());
        };
        let name = match crate::prompt::run_setting(&v.key, config, context) {
            None => return Ok(v.graphs[&v.default].clone()),
            Some(Value::String(name)) => name,
            Some(other) => {
                return Err(format!(
                    "`{}` chooses the graph's variant by name, got {other}",
                    v.key
                ))
            }
        };
        v.graphs.get(name).cloned().ok_or_else(|| {
            let names: Vec<&str> = v.graphs.keys().map(String::as_str).collect();
            format!(
                "the run chose the variant `{name}` (its `{}`), which the graph does not have; it has: {}",
                v.key,
                names.join(", ")
            )
        })
    }

    /// This graph as the default of `variants`: it runs whichever the run chooses.
    pub fn with_variants(&self, variants: Variants) -> Graph {
        let mut g = self.clone();
        g.variants = Some(Arc::new(variants));
        g
    }

    /// Default assistant config (`{"configurable": {...}}` or `{}`).
    pub fn default_config(&self) -> Value {
        self.default_config.clone()
    }

    /// Default run context.
    pub fn default_context(&self) -> Value {
        self.default_context.clone()
    }

    fn keys_schema(&self, keys: &[String], title: String) -> Value {
        let mut props = Map::new();
        for key in keys {
            let Some(&i) = self.channel_index.get(key) else {
                continue;
            };
            let ch = &self.channels[i];
            let mut s = match &ch.schema {
                Value::Object(m) => m.clone(),
                _ => Map::new(),
            };
            s.insert("default".into(), ch.default.clone().unwrap_or(Value::Null));
            s.insert("title".into(), json!(title_case(key)));
            if matches!(ch.kind, ChannelKind::Messages) {
                // Chat UIs look for this mark to find the conversation in the state.
                s.insert("langgraph_type".into(), json!("messages"));
            }
            props.insert(key.clone(), sorted_object(s));
        }
        json!({"properties": props, "title": title, "type": "object"})
    }

    /// JSON Schemas of the input, output, state, config and context.
    pub fn schemas(&self) -> GraphSchemas {
        let all: Vec<String> = self.channels().iter().map(|c| c.name.clone()).collect();
        GraphSchemas {
            input_schema: self.keys_schema(&self.input_keys, format!("{}_input", self.name)),
            output_schema: self.keys_schema(&self.output_keys, format!("{}_output", self.name)),
            state_schema: self.keys_schema(&all, format!("{}_state", self.name)),
            config_schema: self.config_schema.clone(),
            context_schema: self.context_schema.clone(),
        }
    }

    /// The immediate subgraphs, by namespace (the node name).
    pub fn subgraphs(&self) -> Vec<(String, Arc<Graph>)> {
        self.nodes
            .iter()
            .filter_map(|n| n.subgraph.as_ref().map(|g| (n.name.clone(), g.clone())))
            .collect()
    }

    /// LangGraph's `get_subgraphs(namespace, recurse)`: without a namespace, the immediate
    /// subgraphs, and with `recurse` theirs too (`parent|child`), each after its parent; with
    /// a namespace, only the subgraph at exactly that namespace, which must be immediate
    /// unless `recurse`.
    pub fn subgraphs_at(
        &self,
        namespace: Option<&str>,
        recurse: bool,
    ) -> Vec<(String, Arc<Graph>)> {
        let mut out = Vec::new();
        for (name, sub) in self.subgraphs() {
            let below = match namespace {
                None => {
                    out.push((name.clone(), sub.clone()));
                    None
                }
                Some(ns) if ns == name => return vec![(name, sub)],
                Some(ns) => match ns
                    .strip_prefix(name.as_str())
                    .and_then(|r| r.strip_prefix('|'))
                {
                    Some(rest) => Some(rest),
                    None => continue,
                },
            };
            if recurse {
                let nested = sub.subgraphs_at(below, true);
                out.extend(
                    nested
                        .into_iter()
                        .map(|(ns, g)| (format!("{name}|{ns}"), g)),
                );
            }
        }
        out
    }

    /// Targets a branch may route to, for drawing.
    fn branch_targets(&self, b: &Branch) -> Vec<String> {
        let mut t: Vec<String> = match (&b.path_map, &b.targets) {
            (Some(map), _) => map.iter().map(|(_, v)| v.clone()).collect(),
            (None, Some(t)) => t.clone(),
            (None, None) => {
                let mut all: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
                all.push(END.to_string());
                all
            }
        };
        t.sort();
        t.dedup();
        t
    }

    /// LangGraph's drawable graph: `{"nodes": [{id, type, data}], "edges": [{source, target,
    /// conditional?}]}`, with `__start__` and `__end__`.
    pub fn drawable(&self, xray: XRay) -> Value {
        let (nodes, edges) = self.draw(xray);
        json!({"nodes": nodes, "edges": edges})
    }

    fn draw(&self, xray: XRay) -> (Vec<Value>, Vec<Value>) {
        let runnable = |id: &str| json!({"id": id, "type": "runnable", "data": {"name": id}});
        // LangGraph lists edges by source, in node order (`__start__` first): fixed edges as
        // added, then each branch's targets sorted.
        let mut edges: Vec<(String, String, bool)> = Vec::new();
        let sources = std::iter::once(START).chain(self.nodes.iter().map(|n| n.name.as_str()));
        for src in sources {
            for (s, t) in self.edges.iter().filter(|(s, _)| s == src) {
                edges.push((s.clone(), t.clone(), false));
            }
            for j in self
                .joins
                .iter()
                .filter(|j| j.sources.iter().any(|x| x == src))
            {
                edges.push((src.to_string(), j.target.clone(), false));
            }
            for b in self.branches.iter().filter(|b| b.source == src) {
                for t in self.branch_targets(b) {
                    if !edges.iter().any(|(s, x, _)| s == src && *x == t) {
                        edges.push((b.source.clone(), t, true));
                    }
                }
            }
            // A node's declared destinations, drawn as LangGraph draws a `Command`'s targets:
            // conditional and sorted; a fixed edge to one of them becomes conditional too (the
            // `Command` may go there or not).
            let mut destinations: Vec<&String> = match self.node_index.get(src) {
                Some(&i) => self.nodes[i].destinations.iter().collect(),
                None => Vec::new(),
            };
            destinations.sort();
            for t in destinations {
                match edges.iter_mut().find(|(s, x, _)| s == src && x == t) {
                    Some(edge) => edge.2 = true,
                    None => edges.push((src.to_string(), t.clone(), true)),
                }
            }
        }
        let termini = termini(&edges);
        edges.extend(termini.into_iter().map(|t| (t, END.to_string(), false)));

        let mut nodes = vec![runnable(START)];
        let mut sub_nodes = Vec::new();
        let mut sub_edges = Vec::new();
        for n in &self.nodes {
            let expand = n.subgraph.as_ref().zip(xray.deeper());
            let Some((sub, deeper)) = expand else {
                nodes.push(runnable(&n.name));
                continue;
            };
            let (snodes, sedges) = sub.draw(deeper);
            let prefix = |id: &str| format!("{}:{}", n.name, id);
            let firsts: Vec<String> = sedges
                .iter()
                .filter(|e| e["source"] == START)
                .filter_map(|e| e["target"].as_str().map(prefix))
                .collect();
            let lasts: Vec<(String, bool)> = sedges
                .iter()
                .filter(|e| e["target"] == END)
                .filter_map(|e| {
                    e["source"]
                        .as_str()
                        .map(|s| (prefix(s), e.get("conditional").is_some()))
                })
                .collect();
            for sn in snodes {
                let id = sn["id"].as_str().unwrap_or_default();
                if id != START && id != END {
                    sub_nodes.push(runnable(&prefix(id)));
                }
            }
            for se in sedges {
                let (Some(s), Some(t)) = (se["source"].as_str(), se["target"].as_str()) else {
                    continue;
                };
                if s != START && t != END {
                    sub_edges.push((prefix(s), prefix(t), se.get("conditional").is_some()));
                }
            }
            // Re-wire the parent's edges through the subgraph's entry and exit nodes.
            let mut rewired = Vec::new();
            for (s, t, c) in edges.drain(..) {
                if t == n.name {
                    for f in &firsts {
                        rewired.push((s.clone(), f.clone(), c));
                    }
                } else if s == n.name {
                    for (l, lc) in &lasts {
                        rewired.push((l.clone(), t.clone(), c || *lc));
                    }
                } else {
                    rewired.push((s, t, c));
                }
            }
            edges = rewired;
        }
        nodes.push(json!({"id": END}));
        nodes.extend(sub_nodes);
        edges.extend(sub_edges);
        let edges = edges
            .into_iter()
            .map(|(s, t, c)| {
                if c {
                    json!({"source": s, "target": t, "conditional": true})
                } else {
                    json!({"source": s, "target": t})
                }
            })
            .collect();
        (nodes, edges)
    }
}

/// The nodes an edge enters that no edge leaves: they end the run, and LangGraph draws their
/// edges to `__end__` after the others, by name.
fn termini(edges: &[(String, String, bool)]) -> Vec<String> {
    let mut termini: Vec<String> = edges
        .iter()
        .map(|(_, t, _)| t)
        .filter(|t| *t != END && !edges.iter().any(|(s, _, _)| s == *t))
        .cloned()
        .collect();
    termini.sort();
    termini.dedup();
    termini
}
