//! Loads the graphs a server offers: the config file's, or the built-in examples.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::Value;
use spindle_execution::graphs::LoadedGraph;
use spindle_execution::{default_assistant_id, GraphRegistry};
use spindle_storage::{AssistantFields, IfExists, JsonObject, NewAssistant, Owner, Storage};

use crate::config::LoadedConfig;

/// The graphs a server offers, as [`load`] found them.
pub struct Graphs {
    /// The graph files' graphs (the example graphs when the config file names no graph).
    pub registry: GraphRegistry,
    /// The Python graphs (graph id -> spec), which the Python workers load.
    pub python: BTreeMap<String, String>,
    /// The config file's graph files (what `spindle dev` watches to reload them); the
    /// example graphs served without a config have no file.
    pub files: Vec<GraphFile>,
}

/// A graph file of the config file, and the files its graph was compiled from.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphFile {
    /// The graph id.
    pub id: String,
    /// The file (canonical).
    pub path: PathBuf,
    /// The file and the graph files it imports, directly or not (canonical): a change to any
    /// of them can change the graph.
    pub files: Vec<PathBuf>,
}

/// The graph files of the config file (the example graphs when the file names no graph), and
/// its Python graphs, which the Python workers load.
pub fn load(config: &LoadedConfig) -> Result<Graphs> {
    let mut graphs = Graphs {
        registry: GraphRegistry::new(),
        python: BTreeMap::new(),
        files: Vec::new(),
    };
    if config.file.graphs.is_empty() {
        for (id, graph) in spindle_graph::examples::all() {
            graphs.registry.insert(id, graph);
        }
        return Ok(graphs);
    }
    for (id, source) in &config.file.graphs {
        if is_python_graph(source) {
            graphs.python.insert(id.clone(), source.clone());
            continue;
        }
        let path = config.resolve(source);
        let loaded = spindle_graph::spec::load_file_with_imports(&path);
        let graph = loaded
            .graph
            .with_context(|| format!("cannot load graph '{id}'"))?;
        graphs.registry.insert(id.clone(), graph);
        // The file loaded, so it has a canonical path: the first of the files read.
        if let Some(path) = loaded.files.first() {
            graphs.files.push(GraphFile {
                id: id.clone(),
                path: path.clone(),
                files: loaded.files.clone(),
            });
        }
    }
    Ok(graphs)
}

/// Whether a `graphs` entry names Python: `./path/file.py:name`, or `package.module:name`
/// (LangGraph's two forms), rather than a graph file.
pub fn is_python_graph(source: &str) -> bool {
    let Some((target, name)) = source.rsplit_once(':') else {
        return false;
    };
    let module_path = |t: &str| {
        !t.is_empty()
            && t.split('.').all(|part| {
                !part.is_empty() && part.chars().all(|c| c.is_alphanumeric() || c == '_')
            })
    };
    let identifier = !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_');
    identifier && (target.ends_with(".py") || module_path(target))
}

/// Creates each graph's default assistant unless it exists (ids as LangGraph Platform derives
/// them, so clients that hard-code them keep working).
pub async fn ensure_default_assistants(
    storage: &dyn Storage,
    registry: &GraphRegistry,
) -> Result<()> {
    for graph_id in &registry.ids() {
        // A Python graph's defaults are its own business (the worker applies them per run);
        // its compiled name, when it has one, names the assistant, as on LangGraph Platform.
        let (name, description, config, context) = match registry.loaded(graph_id) {
            Some(LoadedGraph::Engine(graph)) => (
                graph_id.to_owned(),
                graph.description().map(str::to_owned),
                as_object(graph.default_config()),
                as_object(graph.default_context()),
            ),
            Some(LoadedGraph::Python(graph)) => (
                graph.name.clone().unwrap_or_else(|| graph_id.to_owned()),
                None,
                JsonObject::new(),
                JsonObject::new(),
            ),
            None => continue,
        };
        let mut metadata = JsonObject::new();
        metadata.insert("created_by".into(), Value::from("system"));
        let new = NewAssistant {
            assistant_id: default_assistant_id(graph_id),
            fields: AssistantFields {
                graph_id: graph_id.to_owned(),
                name,
                description,
                config,
                context,
                metadata,
            },
            if_exists: IfExists::DoNothing,
        };
        storage
            .create_assistant(Owner::System, new)
            .await
            .with_context(|| {
                format!("cannot create the default assistant of graph '{graph_id}'")
            })?;
    }
    Ok(())
}

/// Each graph with its kind, for the banner.
pub fn described(registry: &GraphRegistry) -> Vec<String> {
    registry
        .ids()
        .into_iter()
        .map(|id| match registry.loaded(&id) {
            Some(LoadedGraph::Python(graph)) => match (&graph.kind, &graph.error) {
                (_, Some(error)) => format!("{id} (Python, failed to import: {error})"),
                (Some(kind), None) => format!("{id} (Python {kind}, {})", graph.spec),
                (None, None) => format!("{id} (Python, {})", graph.spec),
            },
            _ => format!("{id} (graph file)"),
        })
        .collect()
}

fn as_object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

#[cfg(test)]
mod tests {
    use spindle_execution::graphs::PythonGraph;

    use super::*;

    #[test]
    fn recognises_python_graph_references() {
        assert!(is_python_graph("./graphs/ref_graphs.py:echo"));
        assert!(is_python_graph("src/agent/graph.py:graph"));
        assert!(is_python_graph("agent.graph:make_graph"));
        assert!(is_python_graph("agent:graph"));
        assert!(!is_python_graph("./graphs/echo.yaml"));
        assert!(!is_python_graph("C:/graphs/echo.json"));
        assert!(!is_python_graph("./agent.py"));
    }

    /// The banner says what each graph is.
    #[test]
    fn graph_kinds_name_graph_files_and_python() {
        let mut registry = GraphRegistry::new();
        registry.insert(
            "echo",
            spindle_graph::examples::get("echo").unwrap().unwrap(),
        );
        registry.insert_python(
            "agent",
            PythonGraph {
                spec: "./src/agent/graph.py:graph".into(),
                kind: Some("compiled graph".into()),
                error: None,
                name: Some("Agent".into()),
            },
        );
        registry.insert_python(
            "broken",
            PythonGraph {
                spec: "./broken.py:graph".into(),
                kind: None,
                error: Some("ImportError: no module named x".into()),
                name: None,
            },
        );
        assert_eq!(
            described(&registry),
            vec![
                "agent (Python compiled graph, ./src/agent/graph.py:graph)".to_owned(),
                "broken (Python, failed to import: ImportError: no module named x)".to_owned(),
                "echo (graph file)".to_owned(),
            ]
        );
    }
}
