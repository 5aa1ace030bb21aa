//! The graph engine's [`Checkpointer`] over the database, one per backend.
//!
//! The model is the engine's (see [`spindle_graph::checkpoint`]): a checkpoint row holds the
//! channel *versions*; values live in blobs per `(channel, version)`, written once, and list
//! channels are stored as deltas on an earlier version. A step therefore writes one checkpoint
//! row plus the blobs of the channels it changed, whatever the length of the thread.
//!
//! Loading a checkpoint costs three queries whatever its number of channels: the checkpoint
//! rows, every blob their channels need (the delta chains are followed in SQL by a recursive
//! query over the `base` column), and the pending writes. [`Checkpointer::list`] loads a whole
//! page the same way, so a history page is three queries, not three per checkpoint.
//!
//! The code shared by both backends (encoding, turning rows into [`CheckpointTuple`]s) lives
//! here; the SQL is written per backend.
//!
//! [`Checkpointer`]: spindle_graph::checkpoint::Checkpointer
//! [`Checkpointer::list`]: spindle_graph::checkpoint::Checkpointer::list

mod postgres;
mod sqlite;

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;
use spindle_graph::checkpoint::blob::materialize;
use spindle_graph::checkpoint::{
    is_trigger_channel, BlobValue, ChannelBlob, ChannelVersion, Checkpoint, CheckpointError,
    CheckpointRef, CheckpointTuple, PendingWrite, QueuedWrite,
};
use sqlx::types::Json;

pub(crate) use postgres::copy_checkpoints as copy_checkpoints_pg;
pub(crate) use postgres::delete_run_checkpoints as delete_run_checkpoints_pg;
pub(crate) use postgres::delete_unreached_blobs as delete_unreached_blobs_pg;
pub(crate) use postgres::insert_checkpoint as insert_checkpoint_pg;
pub(crate) use postgres::store_logged as store_logged_pg;
pub use postgres::PostgresCheckpointer;
pub(crate) use postgres::{CheckpointArrays, PendingWriteArrays};
pub(crate) use sqlite::checkpoint_stored as checkpoint_stored_sqlite;
pub(crate) use sqlite::copy_checkpoints as copy_checkpoints_sqlite;
pub(crate) use sqlite::delete_checkpoints as delete_checkpoints_sqlite;
pub(crate) use sqlite::delete_run_checkpoints as delete_run_checkpoints_sqlite;
pub(crate) use sqlite::delete_unreached_blobs as delete_unreached_blobs_sqlite;
pub(crate) use sqlite::insert_checkpoint as insert_checkpoint_sqlite;
pub use sqlite::SqliteCheckpointer;

/// A save of a run (a checkpoint, or a step's pending writes) with the events the run emitted
/// before it and has not logged yet ([`crate::Storage::save_logged`]). Both are stored in
/// one transaction, the events first, so a step's checkpoint is never durable while the
/// events that told of that step are not: a run resumed from it after a crash does not run
/// that step again, and nothing else would ever log them.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedSave {
    pub write: spindle_graph::checkpoint::QueuedWrite,
    /// Appended as [`crate::RunStore::append_events`] does (the same seq rules); may be empty.
    pub events: Vec<crate::LoggedEvent>,
}

/// What [`Checkpointer::put`] saves, borrowed, for the backends' insert functions.
///
/// [`Checkpointer::put`]: spindle_graph::checkpoint::Checkpointer::put
pub(crate) struct Put<'a> {
    pub thread_id: &'a str,
    pub checkpoint_ns: &'a str,
    pub checkpoint: &'a Checkpoint,
    pub metadata: &'a Value,
    pub parent_id: Option<&'a str>,
    pub blobs: &'a [ChannelBlob],
}

/// The pending writes of a checkpoint, borrowed, for the backends' insert functions.
pub(crate) struct WritesOf<'a> {
    pub thread_id: &'a str,
    pub checkpoint_ns: &'a str,
    pub checkpoint_id: &'a str,
    pub writes: &'a [PendingWrite],
}

/// A queued save ([`QueuedWrite`]), borrowed as what the insert functions take.
pub(crate) enum Save<'a> {
    Checkpoint(Put<'a>),
    Writes(WritesOf<'a>),
}

impl<'a> Save<'a> {
    pub(crate) fn of(write: &'a QueuedWrite) -> Self {
        match write {
            QueuedWrite::Checkpoint {
                thread_id,
                checkpoint_ns,
                checkpoint,
                metadata,
                parent_id,
                blobs,
            } => Save::Checkpoint(Put {
                thread_id,
                checkpoint_ns,
                checkpoint,
                metadata,
                parent_id: parent_id.as_deref(),
                blobs,
            }),
            QueuedWrite::Writes {
                thread_id,
                checkpoint_ns,
                checkpoint_id,
                writes,
            } => Save::Writes(WritesOf {
                thread_id,
                checkpoint_ns,
                checkpoint_id,
                writes,
            }),
        }
    }

    /// The checkpoint saved, or written to: (thread, namespace, id).
    pub(crate) fn key(&self) -> (&'a str, &'a str, &'a str) {
        match self {
            Save::Checkpoint(put) => (put.thread_id, put.checkpoint_ns, put.checkpoint.id.as_str()),
            Save::Writes(of) => (of.thread_id, of.checkpoint_ns, of.checkpoint_id),
        }
    }
}

/// The columns a checkpoint row is read with, in [`CheckpointRow`]'s order.
const CHECKPOINT_COLUMNS: &str =
    "checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata";

/// A checkpoint as stored: no channel values, no writes.
#[derive(sqlx::FromRow)]
struct CheckpointRow {
    checkpoint_ns: String,
    checkpoint_id: String,
    parent_checkpoint_id: Option<String>,
    checkpoint: Json<Checkpoint>,
    metadata: Json<Value>,
}

impl CheckpointRow {
    fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        use crate::sqlite_values::RowExt;
        Ok(Self {
            checkpoint_ns: r.get("checkpoint_ns")?,
            checkpoint_id: r.get("checkpoint_id")?,
            parent_checkpoint_id: r.get("parent_checkpoint_id")?,
            checkpoint: Json(r.json("checkpoint")?),
            metadata: Json(r.json("metadata")?),
        })
    }
}

#[derive(sqlx::FromRow)]
struct BlobRow {
    checkpoint_ns: String,
    channel: String,
    version: i64,
    value: Vec<u8>,
}

impl BlobRow {
    fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            checkpoint_ns: r.get("checkpoint_ns")?,
            channel: r.get("channel")?,
            version: r.get("version")?,
            value: r.get("value")?,
        })
    }
}

#[derive(sqlx::FromRow)]
struct WriteRow {
    checkpoint_ns: String,
    checkpoint_id: String,
    task_id: String,
    channel: String,
    value: Vec<u8>,
}

impl WriteRow {
    fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            checkpoint_ns: r.get("checkpoint_ns")?,
            checkpoint_id: r.get("checkpoint_id")?,
            task_id: r.get("task_id")?,
            channel: r.get("channel")?,
            value: r.get("value")?,
        })
    }
}

/// A blob ready to insert.
struct EncodedBlob {
    channel: String,
    version: i64,
    /// The version a delta applies to; `None` for full and empty values.
    base: Option<i64>,
    value: Vec<u8>,
}

/// The run a checkpoint the engine saves belongs to: its metadata's `run_id`, when it names
/// one. A run's saves are refused once that run is gone (see `require_live_run` per backend).
fn saved_by(metadata: &Value) -> Option<uuid::Uuid> {
    metadata.get("run_id")?.as_str()?.parse().ok()
}

/// The refusal of a checkpoint whose run was deleted (rolled back) while it still ran.
fn run_gone(run_id: impl std::fmt::Display, checkpoint_id: &str) -> CheckpointError {
    CheckpointError::Backend(format!(
        "run {run_id} was deleted (rolled back); its checkpoint {checkpoint_id} is not saved"
    ))
}

fn backend(error: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Backend(error.to_string())
}

/// A write that did not commit, as the engine's error.
impl From<crate::StorageError> for CheckpointError {
    fn from(error: crate::StorageError) -> Self {
        match error {
            // A checkpoint's own failure, passed through a write queue: told once, as it was.
            crate::StorageError::Checkpoint(message) => CheckpointError::Backend(message),
            error => backend(error),
        }
    }
}

/// A checkpoint's failure as the storage's error, with its message as it was (see the
/// conversion back above).
pub(crate) fn as_storage_error(error: CheckpointError) -> crate::StorageError {
    match error {
        CheckpointError::Backend(message) => crate::StorageError::Checkpoint(message),
        error => crate::StorageError::Checkpoint(error.to_string()),
    }
}

fn corrupt(what: &str, error: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Backend(format!("stored {what} is corrupt: {error}"))
}

fn encode_error(what: &str, error: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Backend(format!("cannot encode {what}: {error}"))
}

/// Versions are `u64` in the engine and `BIGINT` in the database.
fn version_to_db(version: ChannelVersion) -> Result<i64, CheckpointError> {
    i64::try_from(version)
        .map_err(|_| CheckpointError::Backend(format!("channel version {version} is too large")))
}

fn encode_blobs(blobs: &[ChannelBlob]) -> Result<Vec<EncodedBlob>, CheckpointError> {
    blobs
        .iter()
        .map(|b| {
            let base = match &b.value {
                BlobValue::Append { base, .. } | BlobValue::Upsert { base, .. } => {
                    Some(version_to_db(*base)?)
                }
                BlobValue::Full { .. } | BlobValue::Empty => None,
            };
            Ok(EncodedBlob {
                channel: b.channel.clone(),
                version: version_to_db(b.version)?,
                base,
                value: serde_json::to_vec(&b.value).map_err(|e| encode_error("blob", e))?,
            })
        })
        .collect()
}

/// The checkpoint as stored: its values travel in blobs.
fn stored_checkpoint(checkpoint: &Checkpoint) -> Checkpoint {
    Checkpoint {
        channel_values: Default::default(),
        ..checkpoint.clone()
    }
}

/// The writes to insert, in order, and the `(task_id, channel)` pairs whose earlier writes
/// they replace.
///
/// As in the engine's in-memory saver: a task's write to a special channel (`__error__`,
/// `__interrupt__`, ...) replaces its earlier write to that channel (a retried task saves it
/// again) and goes last; other writes are appended.
struct WritePlan<'a> {
    insert: Vec<&'a PendingWrite>,
    replace: Vec<(&'a str, &'a str)>,
}

fn plan_writes(writes: &[PendingWrite]) -> WritePlan<'_> {
    let special = |w: &PendingWrite| w.channel.starts_with("__");
    let mut insert = Vec::with_capacity(writes.len());
    let mut replace = Vec::new();
    for (i, w) in writes.iter().enumerate() {
        if special(w) {
            let key = (w.task_id.as_str(), w.channel.as_str());
            if !replace.contains(&key) {
                replace.push(key);
            }
            // A later write of the same batch replaces this one.
            let replaced_later = writes[i + 1..]
                .iter()
                .any(|x| x.task_id == w.task_id && x.channel == w.channel);
            if replaced_later {
                continue;
            }
        }
        insert.push(w);
    }
    WritePlan { insert, replace }
}

fn encode_write(w: &PendingWrite) -> Result<Vec<u8>, CheckpointError> {
    serde_json::to_vec(&w.value).map_err(|e| encode_error("pending write", e))
}

/// The `(namespace, channel, version)` blobs the rows' channels start from. Trigger channels
/// are looked for too: Spindle's engine stores none for them, but LangGraph's Python engine
/// (a Python worker's saves) does, and needs them back to know which nodes are triggered.
fn wanted_blobs(rows: &[CheckpointRow]) -> Result<BTreeSet<(&str, &str, i64)>, CheckpointError> {
    let mut wanted = BTreeSet::new();
    for row in rows {
        for (channel, version) in &row.checkpoint.0.channel_versions {
            wanted.insert((
                row.checkpoint_ns.as_str(),
                channel.as_str(),
                version_to_db(*version)?,
            ));
        }
    }
    Ok(wanted)
}

/// Decoded blobs by namespace, channel and version.
#[derive(Default)]
struct Blobs(HashMap<String, HashMap<String, HashMap<ChannelVersion, BlobValue>>>);

impl Blobs {
    fn decode(rows: Vec<BlobRow>) -> Result<Self, CheckpointError> {
        let mut blobs = Blobs::default();
        for row in rows {
            let value: BlobValue =
                serde_json::from_slice(&row.value).map_err(|e| corrupt("blob", e))?;
            let version =
                ChannelVersion::try_from(row.version).map_err(|e| corrupt("blob version", e))?;
            blobs
                .0
                .entry(row.checkpoint_ns)
                .or_default()
                .entry(row.channel)
                .or_default()
                .insert(version, value);
        }
        Ok(blobs)
    }
}

/// Turns stored rows into tuples: channel values rebuilt from `blobs`, writes attached.
/// `writes` must be ordered by checkpoint and then by `idx`.
///
/// With `shared_blobs` false (one checkpoint) each blob is moved into the value it builds;
/// with it true (a page of history, whose checkpoints share most blobs) blobs are cloned.
fn assemble(
    thread_id: &str,
    rows: Vec<CheckpointRow>,
    mut blobs: Blobs,
    writes: Vec<WriteRow>,
    shared_blobs: bool,
) -> Result<Vec<CheckpointTuple>, CheckpointError> {
    let mut by_checkpoint: HashMap<(String, String), Vec<PendingWrite>> = HashMap::new();
    for w in writes {
        let value = serde_json::from_slice(&w.value).map_err(|e| corrupt("pending write", e))?;
        by_checkpoint
            .entry((w.checkpoint_ns, w.checkpoint_id))
            .or_default()
            .push(PendingWrite {
                task_id: w.task_id,
                channel: w.channel,
                value,
            });
    }
    let mut tuples = Vec::with_capacity(rows.len());
    for row in rows {
        let mut checkpoint = row.checkpoint.0;
        checkpoint.channel_values.clear();
        let mut ns_blobs = blobs.0.get_mut(&row.checkpoint_ns);
        for (channel, &version) in &checkpoint.channel_versions {
            let mut chain = ns_blobs.as_mut().and_then(|ns| ns.get_mut(channel));
            // A trigger channel has a value only when a Python worker stored one.
            if is_trigger_channel(channel)
                && !chain.as_ref().is_some_and(|c| c.contains_key(&version))
            {
                continue;
            }
            let value = materialize(channel, version, |v| {
                let chain = chain.as_mut()?;
                if shared_blobs {
                    chain.get(&v).cloned()
                } else {
                    chain.remove(&v)
                }
            })?;
            if let Some(value) = value {
                checkpoint.channel_values.insert(channel.clone(), value);
            }
        }
        let pending_writes = by_checkpoint
            .remove(&(row.checkpoint_ns.clone(), row.checkpoint_id.clone()))
            .unwrap_or_default();
        tuples.push(CheckpointTuple {
            at: CheckpointRef {
                thread_id: thread_id.to_owned(),
                checkpoint_ns: row.checkpoint_ns,
                checkpoint_id: row.checkpoint_id,
            },
            checkpoint,
            metadata: row.metadata.0,
            parent_id: row.parent_checkpoint_id,
            pending_writes,
        });
    }
    Ok(tuples)
}

/// A metadata filter as the engine means it: only an object filters.
fn metadata_filter(filter: Option<&Value>) -> Option<&Value> {
    filter.filter(|f| f.is_object())
}

fn limit_to_db(limit: Option<usize>) -> i64 {
    limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write(task: &str, channel: &str, value: Value) -> PendingWrite {
        PendingWrite {
            task_id: task.into(),
            channel: channel.into(),
            value,
        }
    }

    #[test]
    fn a_later_special_write_of_the_same_task_replaces_an_earlier_one() {
        let writes = vec![
            write("t", "__error__", json!(1)),
            write("t", "n", json!(1)),
            write("u", "__error__", json!(2)),
            write("t", "__error__", json!(3)),
            write("t", "n", json!(4)),
        ];
        let plan = plan_writes(&writes);
        let kept: Vec<&Value> = plan.insert.iter().map(|w| &w.value).collect();
        assert_eq!(kept, [&json!(1), &json!(2), &json!(3), &json!(4)]);
        assert_eq!(plan.replace, [("t", "__error__"), ("u", "__error__")]);
    }

    #[test]
    fn deltas_record_their_base() {
        let blobs = vec![
            ChannelBlob {
                channel: "m".into(),
                version: 7,
                value: BlobValue::Append {
                    base: 5,
                    depth: 1,
                    items: vec![],
                },
            },
            ChannelBlob {
                channel: "n".into(),
                version: 2,
                value: BlobValue::Empty,
            },
        ];
        let encoded = encode_blobs(&blobs).unwrap();
        assert_eq!(encoded[0].base, Some(5));
        assert_eq!(encoded[1].base, None);
        assert!(version_to_db(u64::MAX).is_err());
    }
}
