//! An in-memory [`Checkpointer`], for tests and for runs without a database.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use serde_json::Value;

use super::blob::{materialize, BlobValue, ChannelBlob};
use super::{
    is_trigger_channel, metadata_matches, ChannelVersion, Checkpoint, CheckpointError,
    CheckpointRef, CheckpointTuple, Checkpointer, ListFilter, PendingWrite,
};

#[derive(Debug, Clone)]
struct Saved {
    checkpoint: Checkpoint,
    metadata: Value,
    parent_id: Option<String>,
    writes: Vec<PendingWrite>,
}

#[derive(Debug, Default, Clone)]
struct Thread {
    /// namespace -> checkpoint id -> saved checkpoint; ids sort by time.
    checkpoints: HashMap<String, BTreeMap<String, Saved>>,
    /// (namespace, channel, version) -> blob.
    blobs: HashMap<(String, String, ChannelVersion), BlobValue>,
}

/// Checkpoints in memory. It can count the bytes a database saver would write (serialised
/// checkpoint rows, metadata, changed blobs and writes), so benchmarks can report the cost of
/// a turn; counting serialises everything, so it is off unless asked for.
#[derive(Debug, Default)]
pub struct InMemoryCheckpointer {
    threads: Mutex<HashMap<String, Thread>>,
    bytes_written: std::sync::atomic::AtomicU64,
    count_bytes: bool,
}

impl InMemoryCheckpointer {
    /// An empty checkpointer.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty checkpointer that counts the bytes it would write.
    pub fn counting_bytes() -> Self {
        InMemoryCheckpointer {
            count_bytes: true,
            ..Self::default()
        }
    }

    /// Bytes of serialised checkpoints, blobs and writes saved so far.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn count(&self, n: usize) {
        self.bytes_written
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, HashMap<String, Thread>>, CheckpointError> {
        self.threads
            .lock()
            .map_err(|_| CheckpointError::Backend("checkpointer lock poisoned".into()))
    }
}

fn tuple(
    thread_id: &str,
    ns: &str,
    saved: &Saved,
    blobs: &HashMap<(String, String, ChannelVersion), BlobValue>,
) -> Result<CheckpointTuple, CheckpointError> {
    let mut checkpoint = saved.checkpoint.clone();
    checkpoint.channel_values.clear();
    for (channel, version) in &saved.checkpoint.channel_versions {
        if is_trigger_channel(channel) {
            continue;
        }
        let value = materialize(channel, *version, |v| {
            blobs.get(&(ns.to_string(), channel.clone(), v)).cloned()
        })?;
        if let Some(value) = value {
            checkpoint.channel_values.insert(channel.clone(), value);
        }
    }
    Ok(CheckpointTuple {
        at: CheckpointRef {
            thread_id: thread_id.to_string(),
            checkpoint_ns: ns.to_string(),
            checkpoint_id: saved.checkpoint.id.clone(),
        },
        checkpoint,
        metadata: saved.metadata.clone(),
        parent_id: saved.parent_id.clone(),
        pending_writes: saved.writes.clone(),
    })
}

#[async_trait]
impl Checkpointer for InMemoryCheckpointer {
    async fn put(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint: &Checkpoint,
        metadata: &Value,
        parent_id: Option<&str>,
        blobs: &[ChannelBlob],
    ) -> Result<(), CheckpointError> {
        let mut stored = checkpoint.clone();
        stored.channel_values.clear();
        if self.count_bytes {
            // What a database saver would write: the checkpoint row without values, the
            // metadata and the changed blobs.
            let mut bytes = serde_json::to_vec(&stored).map(|b| b.len()).unwrap_or(0)
                + serde_json::to_vec(metadata).map(|b| b.len()).unwrap_or(0);
            for b in blobs {
                bytes += serde_json::to_vec(&b.value).map(|b| b.len()).unwrap_or(0);
            }
            self.count(bytes);
        }
        let mut threads = self.lock()?;
        let thread = threads.entry(thread_id.to_string()).or_default();
        for b in blobs {
            thread.blobs.insert(
                (checkpoint_ns.to_string(), b.channel.clone(), b.version),
                b.value.clone(),
            );
        }
        thread
            .checkpoints
            .entry(checkpoint_ns.to_string())
            .or_default()
            .insert(
                stored.id.clone(),
                Saved {
                    checkpoint: stored,
                    metadata: metadata.clone(),
                    parent_id: parent_id.map(str::to_string),
                    writes: Vec::new(),
                },
            );
        Ok(())
    }

    async fn put_writes(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        writes: &[PendingWrite],
    ) -> Result<(), CheckpointError> {
        if self.count_bytes {
            self.count(serde_json::to_vec(writes).map(|b| b.len()).unwrap_or(0));
        }
        let mut threads = self.lock()?;
        let saved = threads
            .get_mut(thread_id)
            .and_then(|t| t.checkpoints.get_mut(checkpoint_ns))
            .and_then(|c| c.get_mut(checkpoint_id))
            .ok_or_else(|| {
                CheckpointError::Missing(format!("checkpoint {checkpoint_id} of {thread_id}"))
            })?;
        for w in writes {
            // A task's write replaces its earlier write to the same channel (idempotent retry).
            saved.writes.retain(|x| {
                !(x.task_id == w.task_id && x.channel == w.channel && w.channel.starts_with("__"))
            });
            saved.writes.push(w.clone());
        }
        Ok(())
    }

    async fn get_tuple(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<CheckpointTuple>, CheckpointError> {
        let threads = self.lock()?;
        let Some(thread) = threads.get(thread_id) else {
            return Ok(None);
        };
        let Some(cps) = thread.checkpoints.get(checkpoint_ns) else {
            return Ok(None);
        };
        let saved = match checkpoint_id {
            Some(id) => cps.get(id),
            None => cps.values().next_back(),
        };
        saved
            .map(|s| tuple(thread_id, checkpoint_ns, s, &thread.blobs))
            .transpose()
    }

    async fn list(
        &self,
        thread_id: &str,
        checkpoint_ns: Option<&str>,
        filter: &ListFilter,
    ) -> Result<Vec<CheckpointTuple>, CheckpointError> {
        let threads = self.lock()?;
        let Some(thread) = threads.get(thread_id) else {
            return Ok(Vec::new());
        };
        let mut all: Vec<(&String, &Saved)> = thread
            .checkpoints
            .iter()
            .filter(|(ns, _)| checkpoint_ns.is_none_or(|want| want == ns.as_str()))
            .flat_map(|(ns, cps)| cps.values().map(move |s| (ns, s)))
            .filter(|(_, s)| {
                filter
                    .before
                    .as_deref()
                    .is_none_or(|b| s.checkpoint.id.as_str() < b)
            })
            .filter(|(_, s)| metadata_matches(&s.metadata, filter.metadata.as_ref()))
            .collect();
        all.sort_by(|a, b| b.1.checkpoint.id.cmp(&a.1.checkpoint.id));
        all.into_iter()
            .take(filter.limit.unwrap_or(usize::MAX))
            .map(|(ns, s)| tuple(thread_id, ns, s, &thread.blobs))
            .collect()
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), CheckpointError> {
        self.lock()?.remove(thread_id);
        Ok(())
    }

    async fn copy_thread(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        let mut threads = self.lock()?;
        if let Some(t) = threads.get(from).cloned() {
            threads.insert(to.to_string(), t);
        }
        Ok(())
    }
}
