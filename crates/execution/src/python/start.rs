//! From a stored run to a worker's `run.start`: the same settings the Rust engine gets
//! (`execute::run_config`), as LangGraph's `RunnableConfig`.

use serde_json::{json, Map, Value};
use spindle_graph::Durability;
use spindle_storage::{Assistant, Run};

use super::executor::StartRun;
use crate::execute::{keys, requested_stream_modes, run_config, Resumed};

/// The `run.start` of `run`'s attempt. A later attempt whose run already saved a checkpoint
/// goes on from it (no input, no fork); one that did not starts over with its input.
pub fn start_run(run: &Run, assistant: &Assistant, resumed: Resumed) -> StartRun {
    let kwargs = &run.kwargs;
    let settings = run_config(run, assistant);
    let mut config = match settings.config {
        Value::Object(config) => config,
        _ => Map::new(),
    };
    config.insert("recursion_limit".into(), json!(settings.recursion_limit));
    if run.attempt <= 1 {
        // LangGraph names the run's root trace after it; a later attempt must not reuse it.
        config.insert("run_id".into(), json!(run.run_id.to_string()));
    }
    let continues = resumed == Resumed::FromItsCheckpoint;
    if let (Some(id), false) = (&settings.checkpoint_id, continues) {
        if let Some(Value::Object(configurable)) = config.get_mut("configurable") {
            configurable.insert("checkpoint_id".into(), json!(id));
        }
    }
    let given = |key: &str| kwargs.get(key).filter(|v| !v.is_null()).cloned();
    let (input, command) = if continues {
        (None, None)
    } else {
        (given(keys::INPUT), given(keys::COMMAND))
    };
    StartRun {
        graph_id: assistant.fields.graph_id.clone(),
        input,
        command,
        config: Value::Object(config),
        context: settings.context,
        stream_mode: requested_stream_modes(kwargs),
        subgraphs: settings.stream_subgraphs,
        interrupt_before: given(keys::INTERRUPT_BEFORE),
        interrupt_after: given(keys::INTERRUPT_AFTER),
        durability: match settings.durability {
            Durability::Sync => "sync",
            Durability::Async => "async",
            Durability::Exit => "exit",
        }
        .to_owned(),
        checkpointer: true,
    }
}
