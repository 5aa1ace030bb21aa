//! The graphs this server can run, by graph id, and the assistant ids derived from them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use spindle_graph::Graph;
use spindle_storage::ResourceId;
use uuid::Uuid;

/// Namespace of the default assistants' ids: `uuid5(NAMESPACE, graph_id)`, as LangGraph
/// Platform computes them, so clients that hard-code those ids keep working.
pub const ASSISTANT_NAMESPACE: Uuid = Uuid::from_u128(0x6ba7b821_9dad_11d1_80b4_00c04fd430c8);

/// The id of the assistant created for `graph_id` at start-up.
pub fn default_assistant_id(graph_id: &str) -> ResourceId {
    Uuid::new_v5(&ASSISTANT_NAMESPACE, graph_id.as_bytes()).into()
}

/// A graph this server runs: a graph file, run by Spindle's engine, or a LangGraph Python
/// graph, run by the Python workers.
#[derive(Clone)]
pub enum LoadedGraph {
    Engine(Arc<Graph>),
    Python(PythonGraph),
}

/// A Python graph as the workers loaded it.
#[derive(Debug, Clone, PartialEq)]
pub struct PythonGraph {
    /// `./path/file.py:name` or `package.module:name`.
    pub spec: String,
    /// What the spec named (`compiled`, `state_graph`, `factory`); `None` when it failed to
    /// load.
    pub kind: Option<String>,
    /// Why it failed to load (`ExceptionClass: message`): its runs fail with this.
    pub error: Option<String>,
    /// The compiled graph's own name, which names its default assistant.
    pub name: Option<String>,
}

/// The graphs by id. Shared by the server and the run executors; `spindle dev` swaps a graph
/// file's graph in when its file changes, so lookups hand out owned handles (`Arc`s): a run
/// keeps the graph it started with to its end.
#[derive(Default)]
pub struct GraphRegistry {
    graphs: RwLock<BTreeMap<String, LoadedGraph>>,
}

impl GraphRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, graph_id: impl Into<String>, graph: Graph) {
        self.map_mut()
            .insert(graph_id.into(), LoadedGraph::Engine(Arc::new(graph)));
    }

    pub fn insert_python(&mut self, graph_id: impl Into<String>, graph: PythonGraph) {
        self.map_mut()
            .insert(graph_id.into(), LoadedGraph::Python(graph));
    }

    /// Puts a graph file's new version in place of the old (a reload); runs started before
    /// keep the old one. An id that is not a graph file's is left as it is.
    pub fn replace(&self, graph_id: &str, graph: Graph) {
        let mut graphs = self.graphs.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot @ LoadedGraph::Engine(_)) = graphs.get_mut(graph_id) {
            *slot = LoadedGraph::Engine(Arc::new(graph));
        }
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, LoadedGraph>> {
        self.graphs.read().unwrap_or_else(|e| e.into_inner())
    }

    fn map_mut(&mut self) -> &mut BTreeMap<String, LoadedGraph> {
        self.graphs.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// The graph, whichever runs it.
    pub fn loaded(&self, graph_id: &str) -> Option<LoadedGraph> {
        self.map().get(graph_id).cloned()
    }

    /// A graph file's graph (`None` for a Python graph).
    pub fn get(&self, graph_id: &str) -> Option<Arc<Graph>> {
        match self.map().get(graph_id)? {
            LoadedGraph::Engine(graph) => Some(graph.clone()),
            LoadedGraph::Python(_) => None,
        }
    }

    /// A Python graph (`None` for a graph file's).
    pub fn python(&self, graph_id: &str) -> Option<PythonGraph> {
        match self.map().get(graph_id)? {
            LoadedGraph::Python(graph) => Some(graph.clone()),
            LoadedGraph::Engine(_) => None,
        }
    }

    pub fn contains(&self, graph_id: &str) -> bool {
        self.map().contains_key(graph_id)
    }

    /// Whether any graph runs on Python workers.
    pub fn has_python(&self) -> bool {
        self.map()
            .values()
            .any(|g| matches!(g, LoadedGraph::Python(_)))
    }

    /// Graph ids in a stable (sorted) order.
    pub fn ids(&self) -> Vec<String> {
        self.map().keys().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    /// The assistant id a path or body names: a graph id maps to the graph's default
    /// assistant, any other id is the assistant's own (a UUID, or an id its creator chose).
    /// `None` for a string that can be no id.
    pub fn resolve_assistant_id(&self, id: &str) -> Option<ResourceId> {
        if self.contains(id) {
            return Some(default_assistant_id(id));
        }
        ResourceId::parse(id).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_assistant_ids_match_langgraph_platform() {
        // Ids the reference server gives its default assistants.
        assert_eq!(
            default_assistant_id("echo").to_string(),
            "046b5dc7-2108-582c-9c6c-31d556d138f0"
        );
        assert_eq!(
            default_assistant_id("agent").to_string(),
            "fe096781-5601-53d2-b2f6-0d3403f7e9ca"
        );
    }
}
