//! Thread state changes that are not runs: state updates and supersteps (checkpoints saved with
//! the thread's new columns and a logged event, in one transaction), and the end of a thread's
//! life: its TTL, pruning, and the sweep of expired threads.
//!
//! Checkpoints are keyed by the thread id as a string (the engine's), not by a reference to
//! `threads`, so removing a thread removes its checkpoint rows explicitly, in the same
//! transaction. `keep_latest` keeps the latest checkpoint of every namespace (a subgraph
//! paused at an interrupt needs its own), their pending writes, and the blobs their channel
//! versions reach through delta chains; everything else of the thread's history goes.

pub(crate) mod postgres;
pub(crate) mod sqlite;

use chrono::{DateTime, Utc};

use crate::checkpoints::Put;
use crate::model::{CheckpointWrite, ThreadTtl, TtlStrategy};
use crate::{ResourceId, StorageError, StorageResult};

/// Threads one sweep transaction handles at most.
pub const SWEEP_BATCH: i64 = 100;

/// A checkpoint write as the backends' insert functions take it.
fn put<'a>(thread_id: &'a str, write: &'a CheckpointWrite) -> Put<'a> {
    Put {
        thread_id,
        checkpoint_ns: &write.checkpoint_ns,
        checkpoint: &write.checkpoint,
        metadata: &write.metadata,
        parent_id: write.parent_id.as_deref(),
        blobs: &write.blobs,
    }
}

/// The engine's thread id: the thread's id as text.
fn engine_id(id: ResourceId) -> String {
    id.as_str().to_owned()
}

/// The error a state change of a thread with an active run gets.
fn busy(id: ResourceId) -> crate::StorageError {
    crate::StorageError::Conflict(format!(
        "thread {id} has a pending or running run; its state cannot change until it ends"
    ))
}

/// A thread the sweeper found expired.
#[derive(sqlx::FromRow)]
struct ExpiredRow<Id> {
    thread_id: Id,
    ttl_strategy: Option<String>,
    ttl_minutes: Option<f64>,
    expires_at: Option<DateTime<Utc>>,
}

impl<Id> ExpiredRow<Id> {
    /// The thread's own TTL, when it has one (else the server's default applies).
    fn own_ttl(&self) -> StorageResult<Option<ThreadTtl>> {
        match (&self.ttl_strategy, self.ttl_minutes, self.expires_at) {
            (Some(s), Some(minutes), Some(_)) => {
                let strategy = TtlStrategy::parse(s)
                    .ok_or_else(|| StorageError::Corrupt(format!("unknown TTL strategy {s:?}")))?;
                Ok(Some(ThreadTtl { strategy, minutes }))
            }
            _ => Ok(None),
        }
    }
}

/// How long the server's default TTL lets a thread idle: threads last updated before the
/// cutoff have expired.
fn default_cutoff(now: DateTime<Utc>, default: Option<&ThreadTtl>) -> Option<DateTime<Utc>> {
    default.map(|d| now - (d.expiry(now) - now))
}
