//! What a thread's row holds after a run or a state edit, and deleting a thread whole.

use serde_json::{Map, Value};
use spindle_graph::pregel::StateSnapshot;
use spindle_storage::{
    ResourceId, Scope, Storage, StorageResult, ThreadStateColumns, ThreadStatus,
};

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

/// The thread's columns that follow its latest checkpoint, as a run's end and a state
/// edit set them:
/// `interrupted` when something is next, else `idle`.
pub fn state_columns(snapshot: &StateSnapshot) -> ThreadStateColumns {
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
