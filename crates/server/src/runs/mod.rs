//! Run execution: workers that claim and execute runs, the live event hub, and the mapping
//! from a stored run to the engine's inputs.

pub mod event_pump;
pub mod execute;
pub mod hub;
mod logged_saves;
pub mod retention;
pub mod stream;
pub mod trace;
pub mod worker;

use serde_json::{Map, Value};
use spindle_graph::pregel::StateSnapshot;
use spindle_storage::ResourceId;
use spindle_storage::{
    JsonObject, Scope, Storage, StorageResult, ThreadStateColumns, ThreadStatus,
};

pub use hub::{EndedRun, EventHub, HubMessage};
pub use worker::{RunWorkers, WorkerConfig};

/// Deletes a thread with its checkpoints. Checkpoints are keyed by thread id alone, so a
/// failure to remove them leaves unreachable rows, not a visible thread: it is logged.
pub async fn delete_thread(
    storage: &dyn Storage,
    scope: &Scope,
    thread_id: ResourceId,
) -> StorageResult<()> {
    storage.delete_thread(scope, thread_id).await?;
    if let Err(err) = storage
        .checkpointer()
        .delete_thread(thread_id.as_str())
        .await
    {
        tracing::warn!(%thread_id, error = %err, "cannot delete the thread's checkpoints");
    }
    Ok(())
}

/// What `wait` and `join` answer for an ended run: the thread's values, with `__interrupt__`
/// when it stopped at an interrupt and `__error__` when it failed.
pub(crate) fn final_values(
    thread_values: Option<&Value>,
    thread_interrupts: &JsonObject,
    error: Option<&Value>,
) -> Value {
    let mut values = match thread_values {
        Some(Value::Object(map)) => map.clone(),
        _ => Map::new(),
    };
    let interrupts: Vec<Value> = thread_interrupts
        .values()
        .filter_map(Value::as_array)
        .flatten()
        .cloned()
        .collect();
    if !interrupts.is_empty() {
        values.insert("__interrupt__".into(), Value::Array(interrupts));
    }
    if let Some(error) = error {
        values.insert("__error__".into(), error.clone());
    }
    Value::Object(values)
}

/// The thread's columns that follow its latest checkpoint, as a run's end and a state
/// edit set them:
/// `interrupted` when something is next, else `idle`.
pub(crate) fn state_columns(snapshot: &StateSnapshot) -> ThreadStateColumns {
    let mut interrupts = Map::new();
    for task in snapshot.tasks.iter().filter(|t| !t.interrupts.is_empty()) {
        let list = task.interrupts.iter().map(|i| i.to_state_json()).collect();
        interrupts.insert(task.id.clone(), Value::Array(list));
    }
    ThreadStateColumns {
        status: if snapshot.next.is_empty() {
            ThreadStatus::Idle
        } else {
            ThreadStatus::Interrupted
        },
        values: Some(snapshot.values.clone()),
        interrupts,
    }
}
