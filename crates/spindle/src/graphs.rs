//! Loads the graphs a server offers: the config file's, or the built-in examples.

use anyhow::{Context, Result};
use serde_json::Value;
use spindle_execution::{default_assistant_id, GraphRegistry};
use spindle_storage::{AssistantFields, IfExists, JsonObject, NewAssistant, Owner, Storage};

use crate::config::LoadedConfig;

/// The graphs of the config file; the example graphs when the file names none.
pub fn load(config: &LoadedConfig) -> Result<GraphRegistry> {
    let mut registry = GraphRegistry::new();
    if config.file.graphs.is_empty() {
        for (id, graph) in spindle_graph::examples::all() {
            registry.insert(id, graph);
        }
        return Ok(registry);
    }
    for (id, source) in &config.file.graphs {
        // LangGraph's format points at Python code (`./graphs/agent.py:graph`); those graphs
        // need a Python worker, which Spindle does not have yet.
        if is_python_graph(source) {
            tracing::warn!(graph_id = %id, source = %source, "skipping a Python graph: Spindle runs YAML and JSON graph files");
            continue;
        }
        let path = config.resolve(source);
        let graph = spindle_graph::spec::load_file(&path)
            .with_context(|| format!("cannot load graph '{id}'"))?;
        registry.insert(id.clone(), graph);
    }
    Ok(registry)
}

fn is_python_graph(source: &str) -> bool {
    let file = source.rsplit_once(':').map_or(source, |(file, _)| file);
    file.ends_with(".py") || file.ends_with(".ipynb")
}

/// Creates each graph's default assistant unless it exists (ids as LangGraph Platform derives
/// them, so clients that hard-code them keep working).
pub async fn ensure_default_assistants(
    storage: &dyn Storage,
    registry: &GraphRegistry,
) -> Result<()> {
    for graph_id in registry.ids() {
        let graph = registry.get(graph_id).expect("id listed by the registry");
        let mut metadata = JsonObject::new();
        metadata.insert("created_by".into(), Value::from("system"));
        let new = NewAssistant {
            assistant_id: default_assistant_id(graph_id),
            fields: AssistantFields {
                graph_id: graph_id.to_owned(),
                name: graph_id.to_owned(),
                description: graph.description().map(str::to_owned),
                config: as_object(graph.default_config()),
                context: as_object(graph.default_context()),
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

fn as_object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_python_graph_references() {
        assert!(is_python_graph("./graphs/ref_graphs.py:echo"));
        assert!(is_python_graph("./agent.py"));
        assert!(!is_python_graph("./graphs/echo.yaml"));
        assert!(!is_python_graph("C:/graphs/echo.json"));
    }
}
