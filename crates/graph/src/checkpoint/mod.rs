//! Checkpoints: the saved state of a thread after each super-step, and the [`Checkpointer`]
//! trait the server implements over its database.
//!
//! Why channel versions and blobs: a thread with a long message history must not rewrite the
//! whole history at every step. A checkpoint records only each channel's *version*; values live
//! in blobs keyed by `(channel, version)`, and a step writes blobs only for the channels it
//! changed. List channels store a delta (the appended or merged items) on top of an earlier
//! version, with a full copy every [`blob::FULL_EVERY`] versions to bound the replay on load.
//!
//! Implementing [`Checkpointer`] over a database:
//! - keep the checkpoint (serialised [`Checkpoint`], `channel_values` empty), its metadata and
//!   parent id per `(thread_id, checkpoint_ns, checkpoint_id)`; ids sort by time;
//! - keep blobs per `(thread_id, checkpoint_ns, channel, version)` as serialised [`BlobValue`];
//!   a version is never rewritten with other content, so inserts can ignore conflicts;
//! - keep pending writes per `(thread_id, checkpoint_ns, checkpoint_id)` in order;
//! - on load, rebuild each channel in `channel_versions` with [`blob::materialize`], skipping
//!   trigger channels ([`is_trigger_channel`]) which have versions but no blobs;
//! - prove it with [`conformance::check`].

pub mod blob;
pub mod conformance;
pub mod memory;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use blob::{BlobValue, ChannelBlob};
pub use memory::InMemoryCheckpointer;

/// A channel version. Monotonic per channel within a thread and namespace.
pub type ChannelVersion = u64;

/// The saved state of one graph (one namespace) of a thread after a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version.
    pub v: u32,
    /// Checkpoint id: a time-ordered UUID (v6), so ids sort by creation time as in LangGraph.
    pub id: String,
    /// Creation time, RFC 3339.
    pub ts: String,
    /// Channel values, materialised. Not serialised by savers: values live in blobs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub channel_values: BTreeMap<String, Value>,
    /// Current version of each channel that has a value.
    pub channel_versions: BTreeMap<String, ChannelVersion>,
    /// For each node, the versions of its trigger channels it has already seen.
    pub versions_seen: BTreeMap<String, BTreeMap<String, ChannelVersion>>,
    /// Channels updated by the step that produced this checkpoint.
    #[serde(default)]
    pub updated_channels: Vec<String>,
    /// For list channels stored as deltas: how many deltas lead to the current version, so
    /// the next run knows when a full copy is due.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub delta_depths: BTreeMap<String, u32>,
}

/// Where a checkpoint lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CheckpointRef {
    /// Thread id.
    pub thread_id: String,
    /// `""` for the root graph, `node:task_id[|...]` for subgraphs.
    pub checkpoint_ns: String,
    /// The checkpoint id.
    pub checkpoint_id: String,
}

/// A write a task produced in a step that has not finished everywhere yet. Saved as soon as
/// the task finishes so a resumed run does not run it again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingWrite {
    /// The task that wrote.
    pub task_id: String,
    /// Channel name, or a special channel (`__error__`, `__interrupt__`, `__resume__`).
    pub channel: String,
    /// The written value.
    pub value: Value,
}

/// A checkpoint with everything needed to resume from it.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointTuple {
    /// Where it is.
    pub at: CheckpointRef,
    /// The checkpoint, values materialised.
    pub checkpoint: Checkpoint,
    /// `{source, step, writes, parents, ...run metadata}`.
    pub metadata: Value,
    /// The previous checkpoint's id in the same namespace.
    pub parent_id: Option<String>,
    /// Writes saved against this checkpoint by tasks of the next step.
    pub pending_writes: Vec<PendingWrite>,
}

/// Filters of [`Checkpointer::list`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListFilter {
    /// Only checkpoints older than this id.
    pub before: Option<String>,
    /// At most this many, newest first.
    pub limit: Option<usize>,
    /// Only checkpoints whose metadata contains every key of this object with equal value.
    pub metadata: Option<Value>,
}

/// A checkpointer failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CheckpointError {
    /// A blob needed to materialise a channel is missing.
    #[error("checkpoint data is missing: {0}")]
    Missing(String),
    /// The backend failed.
    #[error("checkpointer backend failed: {0}")]
    Backend(String),
}

/// A save the engine does not wait for (`Durability::Async`): owned, so it can wait in a
/// queue while the run goes on.
#[derive(Debug, Clone, PartialEq)]
pub enum QueuedWrite {
    /// [`Checkpointer::put`]'s arguments.
    Checkpoint {
        thread_id: String,
        checkpoint_ns: String,
        /// Boxed, so that both variants are of a size.
        checkpoint: Box<Checkpoint>,
        metadata: Value,
        parent_id: Option<String>,
        blobs: Vec<ChannelBlob>,
    },
    /// [`Checkpointer::put_writes`]'s arguments.
    Writes {
        thread_id: String,
        checkpoint_ns: String,
        checkpoint_id: String,
        writes: Vec<PendingWrite>,
    },
}

impl QueuedWrite {
    /// Saves it through the checkpointer's awaited methods.
    pub async fn apply(&self, saver: &dyn Checkpointer) -> Result<(), CheckpointError> {
        match self {
            QueuedWrite::Checkpoint {
                thread_id,
                checkpoint_ns,
                checkpoint,
                metadata,
                parent_id,
                blobs,
            } => {
                saver
                    .put(
                        thread_id,
                        checkpoint_ns,
                        checkpoint,
                        metadata,
                        parent_id.as_deref(),
                        blobs,
                    )
                    .await
            }
            QueuedWrite::Writes {
                thread_id,
                checkpoint_ns,
                checkpoint_id,
                writes,
            } => {
                saver
                    .put_writes(thread_id, checkpoint_ns, checkpoint_id, writes)
                    .await
            }
        }
    }
}

/// Resolves when a queued save is done (or failed). `Sync` because the engine's loop, which
/// holds it, is shared by reference with the tasks of a step.
pub type WriteReceipt =
    Pin<Box<dyn Future<Output = Result<(), CheckpointError>> + Send + Sync + 'static>>;

/// Saves and loads checkpoints. All methods are scoped by thread id and namespace.
#[async_trait]
pub trait Checkpointer: Send + Sync {
    /// Save a checkpoint with its metadata and the blobs of the channels that changed.
    /// `checkpoint.channel_values` may be ignored: values travel in `blobs`.
    async fn put(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint: &Checkpoint,
        metadata: &Value,
        parent_id: Option<&str>,
        blobs: &[ChannelBlob],
    ) -> Result<(), CheckpointError>;

    /// Save writes of finished tasks against the checkpoint their step started from.
    async fn put_writes(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        writes: &[PendingWrite],
    ) -> Result<(), CheckpointError>;

    /// The checkpoint with this id, or the latest when `checkpoint_id` is `None`.
    async fn get_tuple(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<CheckpointTuple>, CheckpointError>;

    /// Checkpoints newest first. `checkpoint_ns: None` lists every namespace.
    async fn list(
        &self,
        thread_id: &str,
        checkpoint_ns: Option<&str>,
        filter: &ListFilter,
    ) -> Result<Vec<CheckpointTuple>, CheckpointError>;

    /// Forget a thread.
    async fn delete_thread(&self, thread_id: &str) -> Result<(), CheckpointError>;

    /// Copy every checkpoint, blob and write of a thread to another thread id.
    async fn copy_thread(&self, from: &str, to: &str) -> Result<(), CheckpointError>;

    /// Queues a save without waiting for it, when the backend applies its writes in the order
    /// they are queued (one writer draining one queue): the save is queued before this
    /// returns, and the receipt resolves once it is done. A run's saves then wait together
    /// and share commits instead of each costing one. `Err` hands the write back: this
    /// backend has no such queue (the default), and the engine orders the saves itself.
    fn queue(&self, write: QueuedWrite) -> Result<WriteReceipt, Box<QueuedWrite>> {
        Err(Box::new(write))
    }
}

/// Trigger channels (`branch:to:<node>`) have versions but no value and no blobs.
pub fn is_trigger_channel(channel: &str) -> bool {
    channel.starts_with("branch:to:")
}

/// Whether checkpoint metadata matches a filter object (every key equal).
pub fn metadata_matches(metadata: &Value, filter: Option<&Value>) -> bool {
    match filter.and_then(Value::as_object) {
        None => true,
        Some(f) => f.iter().all(|(k, v)| metadata.get(k) == Some(v)),
    }
}

/// A new checkpoint id: UUID v6 sorts by time, as LangGraph's ids do.
pub fn new_checkpoint_id() -> String {
    use std::sync::atomic::{AtomicU16, Ordering};
    static COUNTER: AtomicU16 = AtomicU16::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let ts = uuid::Timestamp::from_unix(uuid::NoContext, now.as_secs(), now.subsec_nanos());
    // The node id part carries a counter so two ids made in the same tick still differ and
    // still sort in creation order.
    let c = COUNTER.fetch_add(1, Ordering::Relaxed);
    let node = [0, 0, 0, 0, (c >> 8) as u8, c as u8];
    uuid::Uuid::new_v6(ts, &node).to_string()
}

/// Now, RFC 3339 with microseconds and `+00:00`, as LangGraph writes timestamps.
pub fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format_rfc3339(now.as_secs() as i64, now.subsec_micros())
}

fn format_rfc3339(secs: i64, micros: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm); avoids a date crate for one format.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}+00:00",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instant() {
        assert_eq!(format_rfc3339(0, 0), "1970-01-01T00:00:00.000000+00:00");
        assert_eq!(
            format_rfc3339(1_795_238_700, 91),
            "2026-11-21T05:25:00.000091+00:00"
        );
    }

    #[test]
    fn checkpoint_ids_sort_by_creation() {
        let ids: Vec<String> = (0..100).map(|_| new_checkpoint_id()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
    }
}
