//! Build graphs in Rust. Graph files compile to the same calls.
//!
//! A chain of nodes:
//!
//! ```
//! use serde_json::json;
//! use spindle_graph::builder::{node_fn, GraphBuilder};
//! use spindle_graph::channels::{ChannelKind, ChannelSpec};
//! use spindle_graph::node::Command;
//! use spindle_graph::{END, START};
//!
//! let graph = GraphBuilder::new("chain")
//!     .channel(ChannelSpec::new("n", ChannelKind::LastValue).with_schema(json!({"type": "integer"})))
//!     .node("a", node_fn(|state| Ok(Command::update(json!({"n": state["n"].as_i64().unwrap_or(0) + 1})))))
//!     .edge(START, "a")
//!     .edge("a", END)
//!     .compile()
//!     .expect("valid graph");
//! assert_eq!(graph.name(), "chain");
//! ```
//!
//! Map-reduce with `Send` and a conditional edge, then a run with the in-memory
//! checkpointer:
//!
//! ```
//! use std::sync::Arc;
//! use serde_json::json;
//! use spindle_graph::builder::{node_fn, router_fn, GraphBuilder};
//! use spindle_graph::channels::{ChannelKind, ChannelSpec};
//! use spindle_graph::checkpoint::InMemoryCheckpointer;
//! use spindle_graph::node::{Command, Goto};
//! use spindle_graph::{RunConfig, RunEnv, RunInput, END, START};
//!
//! let graph = Arc::new(
//!     GraphBuilder::new("fanout")
//!         .channel(ChannelSpec::new("items", ChannelKind::LastValue))
//!         .channel(ChannelSpec::new("results", ChannelKind::Append))
//!         .node("work", node_fn(|arg| {
//!             let item = arg["item"].as_str().unwrap_or_default().to_uppercase();
//!             Ok(Command::update(json!({"results": [item]})))
//!         }))
//!         .branch(
//!             START,
//!             router_fn(|state| {
//!                 let items = state["items"].as_array().cloned().unwrap_or_default();
//!                 Ok(items
//!                     .into_iter()
//!                     .map(|item| Goto::Send { node: "work".into(), arg: json!({"item": item}) })
//!                     .collect())
//!             }),
//!             None,
//!             Some(vec!["work".into()]),
//!         )
//!         .edge("work", END)
//!         .compile()
//!         .expect("valid graph"),
//! );
//! let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! let out = rt.block_on(spindle_graph::pregel::run(
//!     &graph,
//!     RunInput::Values(json!({"items": ["a", "b"]})),
//!     RunConfig { thread_id: Some("thread-1".into()), ..Default::default() },
//!     RunEnv { checkpointer: Some(Arc::new(InMemoryCheckpointer::new())), ..Default::default() },
//! ));
//! assert_eq!(out.unwrap().values["results"], json!(["A", "B"]));
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::channels::{ChannelKind, ChannelSpec};
use crate::context::TaskContext;
use crate::graph::{Branch, Graph, Join, NodeDef, NodeSet, END, START};
use crate::node::{Command, Goto, Node, NodeError, RetryPolicy, Router};

/// A graph that does not hold together, with the part at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{place}: {message}")]
pub struct BuildError {
    /// Where: `nodes.respond`, `edges[2].to`, ...
    pub place: String,
    /// What is wrong.
    pub message: String,
}

fn err(place: impl Into<String>, message: impl Into<String>) -> BuildError {
    BuildError {
        place: place.into(),
        message: message.into(),
    }
}

/// A node from a synchronous function of its input.
pub fn node_fn<F>(f: F) -> Arc<dyn Node>
where
    F: Fn(Value) -> Result<Command, NodeError> + Send + Sync + 'static,
{
    struct FnNode<F>(F);
    #[async_trait]
    impl<F> Node for FnNode<F>
    where
        F: Fn(Value) -> Result<Command, NodeError> + Send + Sync + 'static,
    {
        async fn run(&self, input: Value, _ctx: &TaskContext) -> Result<Command, NodeError> {
            (self.0)(input)
        }
    }
    Arc::new(FnNode(f))
}

/// A router from a synchronous function of the state.
pub fn router_fn<F>(f: F) -> Arc<dyn Router>
where
    F: Fn(&Value) -> Result<Vec<Goto>, NodeError> + Send + Sync + 'static,
{
    struct FnRouter<F>(F);
    #[async_trait]
    impl<F> Router for FnRouter<F>
    where
        F: Fn(&Value) -> Result<Vec<Goto>, NodeError> + Send + Sync + 'static,
    {
        async fn route(&self, state: &Value, _ctx: &TaskContext) -> Result<Vec<Goto>, NodeError> {
            (self.0)(state)
        }
    }
    Arc::new(FnRouter(f))
}

/// Options of one node.
#[derive(Clone, Default)]
pub struct NodeOptions {
    /// Retry policy.
    pub retry: Option<RetryPolicy>,
    /// The graph this node runs, shown by `/subgraphs` and `drawable(xray)`.
    pub subgraph: Option<Arc<Graph>>,
    /// Where the node may go by a `Command`'s goto (LangGraph's `destinations`): drawn as
    /// its conditional edges. Only drawn: a goto elsewhere still goes there, as in LangGraph.
    pub destinations: Vec<String>,
}

/// Collects a graph's parts and checks them in [`GraphBuilder::compile`].
pub struct GraphBuilder {
    name: String,
    description: Option<String>,
    channels: Vec<ChannelSpec>,
    nodes: Vec<NodeDef>,
    edges: Vec<(String, String)>,
    branches: Vec<Branch>,
    joins: Vec<(Vec<String>, String)>,
    interrupt_before: NodeSet,
    interrupt_after: NodeSet,
    input_keys: Option<Vec<String>>,
    output_keys: Option<Vec<String>>,
    config_schema: Value,
    context_schema: Value,
    default_config: Value,
    default_context: Value,
}

impl GraphBuilder {
    /// Start a graph.
    pub fn new(name: impl Into<String>) -> Self {
        GraphBuilder {
            name: name.into(),
            description: None,
            channels: Vec::new(),
            nodes: Vec::new(),
            edges: Vec::new(),
            branches: Vec::new(),
            joins: Vec::new(),
            interrupt_before: NodeSet::None,
            interrupt_after: NodeSet::None,
            input_keys: None,
            output_keys: None,
            config_schema: json!({}),
            context_schema: Value::Null,
            default_config: json!({}),
            default_context: json!({}),
        }
    }

    /// Describe the graph.
    pub fn description(mut self, d: impl Into<String>) -> Self {
        self.description = Some(d.into());
        self
    }

    /// Add a state key.
    pub fn channel(mut self, spec: ChannelSpec) -> Self {
        self.channels.push(spec);
        self
    }

    /// Add a node.
    pub fn node(self, name: impl Into<String>, runner: Arc<dyn Node>) -> Self {
        self.node_with(name, runner, NodeOptions::default())
    }

    /// Add a node with options.
    pub fn node_with(
        mut self,
        name: impl Into<String>,
        runner: Arc<dyn Node>,
        options: NodeOptions,
    ) -> Self {
        self.nodes.push(NodeDef {
            name: name.into(),
            runner,
            retry: options.retry,
            subgraph: options.subgraph,
            destinations: options.destinations,
        });
        self
    }

    /// Add a fixed edge.
    pub fn edge(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        self.edges.push((from.into(), to.into()));
        self
    }

    /// Run `to` once every node in `from` has run (a fan-in; LangGraph's
    /// `add_edge([a, b], c)`).
    pub fn join(mut self, from: Vec<String>, to: impl Into<String>) -> Self {
        self.joins.push((from, to.into()));
        self
    }

    /// Add a conditional edge. `path_map` maps router answers to nodes; `targets` lists the
    /// possible targets for drawing when there is no map.
    pub fn branch(
        mut self,
        from: impl Into<String>,
        router: Arc<dyn Router>,
        path_map: Option<Vec<(String, String)>>,
        targets: Option<Vec<String>>,
    ) -> Self {
        self.branches.push(Branch {
            source: from.into(),
            router,
            path_map,
            targets,
        });
        self
    }

    /// Stop before these nodes.
    pub fn interrupt_before(mut self, nodes: NodeSet) -> Self {
        self.interrupt_before = nodes;
        self
    }

    /// Stop after these nodes.
    pub fn interrupt_after(mut self, nodes: NodeSet) -> Self {
        self.interrupt_after = nodes;
        self
    }

    /// Keys accepted as input (default: every key).
    pub fn input_keys(mut self, keys: Vec<String>) -> Self {
        self.input_keys = Some(keys);
        self
    }

    /// Keys returned as output (default: every key).
    pub fn output_keys(mut self, keys: Vec<String>) -> Self {
        self.output_keys = Some(keys);
        self
    }

    /// Schema of `config.configurable` and the default assistant config.
    pub fn config(mut self, schema: Value, default: Value) -> Self {
        self.config_schema = schema;
        self.default_config = default;
        self
    }

    /// Schema and default of the run context.
    pub fn context(mut self, schema: Value, default: Value) -> Self {
        self.context_schema = schema;
        self.default_context = default;
        self
    }

    /// Check the parts and build the graph.
    pub fn compile(self) -> Result<Graph, BuildError> {
        let mut channel_index = HashMap::new();
        for (i, c) in self.channels.iter().enumerate() {
            if c.name.starts_with("__") {
                return Err(err(
                    format!("state.{}", c.name),
                    "names starting with `__` are reserved",
                ));
            }
            if channel_index.insert(c.name.clone(), i).is_some() {
                return Err(err(format!("state.{}", c.name), "declared twice"));
            }
        }
        let mut node_index = HashMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.name.is_empty()
                || n.name == START
                || n.name == END
                || n.name.contains('|')
                || n.name.contains(':')
            {
                return Err(err(
                    format!("nodes.{}", n.name),
                    "node names must be non-empty, not `__start__`/`__end__`, and hold no `|` or `:`",
                ));
            }
            if node_index.insert(n.name.clone(), i).is_some() {
                return Err(err(format!("nodes.{}", n.name), "declared twice"));
            }
            if channel_index.contains_key(&n.name) {
                return Err(err(
                    format!("nodes.{}", n.name),
                    "a node cannot have the name of a state key",
                ));
            }
        }
        let known = |n: &str| node_index.contains_key(n);
        for (i, (s, t)) in self.edges.iter().enumerate() {
            if s != START && !known(s) {
                return Err(err(
                    format!("edges[{i}].from"),
                    format!("unknown node `{s}`"),
                ));
            }
            if s == END {
                return Err(err(
                    format!("edges[{i}].from"),
                    "an edge cannot leave `__end__`",
                ));
            }
            if t != END && !known(t) {
                return Err(err(format!("edges[{i}].to"), format!("unknown node `{t}`")));
            }
            if t == START {
                return Err(err(
                    format!("edges[{i}].to"),
                    "an edge cannot enter `__start__`",
                ));
            }
        }
        for n in &self.nodes {
            for (i, t) in n.destinations.iter().enumerate() {
                if t != END && !known(t) {
                    return Err(err(
                        format!("nodes.{}.destinations[{i}]", n.name),
                        format!("unknown node `{t}`"),
                    ));
                }
            }
        }
        for (i, b) in self.branches.iter().enumerate() {
            if b.source != START && !known(&b.source) {
                return Err(err(
                    format!("branches[{i}].from"),
                    format!("unknown node `{}`", b.source),
                ));
            }
            let targets = b
                .path_map
                .iter()
                .flatten()
                .map(|(_, t)| t)
                .chain(b.targets.iter().flatten());
            for t in targets {
                if t != END && !known(t) {
                    return Err(err(
                        format!("branches[{i}].to"),
                        format!("unknown node `{t}`"),
                    ));
                }
            }
        }
        for (i, (sources, target)) in self.joins.iter().enumerate() {
            if sources.len() < 2 {
                return Err(err(
                    format!("joins[{i}].from"),
                    "a join needs at least two sources",
                ));
            }
            for s in sources {
                if s != START && !known(s) {
                    return Err(err(
                        format!("joins[{i}].from"),
                        format!("unknown node `{s}`"),
                    ));
                }
            }
            if target == END || !known(target) {
                return Err(err(
                    format!("joins[{i}].to"),
                    format!("unknown node `{target}`"),
                ));
            }
        }
        if !self.edges.iter().any(|(s, _)| s == START)
            && !self.branches.iter().any(|b| b.source == START)
        {
            return Err(err(
                "edges",
                "the graph has no entry point: add an edge from `__start__`",
            ));
        }
        for set in [&self.interrupt_before, &self.interrupt_after] {
            if let NodeSet::Some(list) = set {
                for n in list {
                    if !known(n) {
                        return Err(err("interrupt_before/after", format!("unknown node `{n}`")));
                    }
                }
            }
        }
        let all_keys: Vec<String> = self.channels.iter().map(|c| c.name.clone()).collect();
        for (place, keys) in [("input", &self.input_keys), ("output", &self.output_keys)] {
            for k in keys.iter().flatten() {
                if !channel_index.contains_key(k) {
                    return Err(err(place, format!("unknown state key `{k}`")));
                }
            }
        }
        // Index edges by source: node i at i, START at nodes.len().
        let slot = |n: &str| node_index.get(n).copied().unwrap_or(self.nodes.len());
        let mut out_edges = vec![Vec::new(); self.nodes.len() + 1];
        for (s, t) in &self.edges {
            out_edges[slot(s)].push(t.clone());
        }
        let mut out_branches = vec![Vec::new(); self.nodes.len() + 1];
        for (i, b) in self.branches.iter().enumerate() {
            out_branches[slot(&b.source)].push(i);
        }
        let trigger_names = self
            .nodes
            .iter()
            .map(|n| format!("branch:to:{}", n.name))
            .collect();
        // Each join keeps the sources that have run in a hidden channel after the user's.
        let mut channels = self.channels;
        let mut joins = Vec::new();
        let mut out_joins = vec![Vec::new(); self.nodes.len() + 1];
        for (sources, target) in self.joins {
            let name = format!("__join__:{}:{}", sources.join("+"), target);
            channel_index.insert(name.clone(), channels.len());
            channels.push(ChannelSpec::new(name, ChannelKind::Append));
            for s in &sources {
                out_joins[slot(s)].push(joins.len());
            }
            joins.push(Join {
                sources,
                target,
                channel: channels.len() - 1,
            });
        }
        Ok(Graph {
            trigger_names,
            name: self.name,
            description: self.description,
            input_keys: self.input_keys.unwrap_or_else(|| all_keys.clone()),
            output_keys: self.output_keys.unwrap_or(all_keys),
            channels,
            channel_index,
            joins,
            out_joins,
            nodes: self.nodes,
            node_index,
            edges: self.edges,
            branches: self.branches,
            out_edges,
            out_branches,
            interrupt_before: self.interrupt_before,
            interrupt_after: self.interrupt_after,
            config_schema: self.config_schema,
            context_schema: self.context_schema,
            default_config: self.default_config,
            default_context: self.default_context,
            variants: None,
        })
    }
}
