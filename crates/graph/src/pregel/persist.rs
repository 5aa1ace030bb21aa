//! Saving what the loop produces: checkpoints, pending writes, and the durability modes.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::state::{START_INPUT, TASKS};
use super::{Durability, Loop, LoopError, RunError};
use crate::checkpoint::Checkpointer;
use crate::checkpoint::{
    new_checkpoint_id, BlobValue, ChannelBlob, CheckpointError, PendingWrite, QueuedWrite,
    WriteReceipt,
};

/// Steps a run may go ahead of its saves under `Durability::Async`.
const MAX_STEPS_BEHIND: usize = 16;

impl Loop {
    pub(super) async fn save_writes(&mut self, writes: Vec<PendingWrite>) -> Result<(), LoopError> {
        if writes.is_empty() {
            return Ok(());
        }
        if self.durability == Durability::Exit {
            // Kept for the end: interrupts and errors must survive even when only the last
            // checkpoint is written.
            self.exit.writes.extend(writes);
            return Ok(());
        }
        let (Some(saver), Some(cid)) = (self.saver.clone(), self.checkpoint_id.clone()) else {
            return Ok(());
        };
        let write = QueuedWrite::Writes {
            thread_id: self.thread().to_owned(),
            checkpoint_ns: self.ns_str.clone(),
            checkpoint_id: cid,
            writes,
        };
        self.save(saver, write).await
    }

    /// Saves now (`Durability::Sync`), or queues the save behind the earlier ones
    /// (`Durability::Async`), so the run goes on while its saves are written in order.
    async fn save(
        &mut self,
        saver: Arc<dyn Checkpointer>,
        write: QueuedWrite,
    ) -> Result<(), LoopError> {
        if self.durability == Durability::Sync {
            self.flush().await?;
            write.apply(saver.as_ref()).await?;
            return Ok(());
        }
        let earlier = self.behind.take();
        let receipt = match saver.queue(write) {
            // The backend keeps the order; a failure of an earlier save still surfaces.
            Ok(receipt) => after(earlier, receipt),
            // Ordered here: each save starts when the one before it is done.
            Err(write) => {
                self.saves_ordered = false;
                let task = tokio::spawn(async move {
                    if let Some(earlier) = earlier {
                        earlier.await?;
                    }
                    write.apply(saver.as_ref()).await
                });
                Box::pin(async move {
                    task.await
                        .map_err(|e| CheckpointError::Backend(e.to_string()))?
                })
            }
        };
        self.behind = Some(receipt);
        Ok(())
    }

    /// Waits until every queued save is done.
    pub(super) async fn flush(&mut self) -> Result<(), LoopError> {
        self.steps_behind = 0;
        if let Some(receipt) = self.behind.take() {
            receipt.await.map_err(RunError::Checkpoint)?;
        }
        Ok(())
    }

    /// Before a step runs: lets the saves of at most [`MAX_STEPS_BEHIND`] steps wait in the
    /// queue, so a long run of quick steps cannot queue its whole history in memory.
    pub(super) async fn bound_saves_behind(&mut self) -> Result<(), LoopError> {
        if self.behind.is_none() {
            return Ok(());
        }
        self.steps_behind += 1;
        if self.steps_behind > MAX_STEPS_BEHIND {
            self.flush().await?;
        }
        Ok(())
    }

    pub(super) fn base_metadata(&self, source: &str, writes: Value) -> Value {
        let mut m = match self.run.config.get("metadata") {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        m.insert("source".into(), json!(source));
        m.insert("step".into(), json!(self.step));
        m.insert("parents".into(), Value::Object(self.parents.clone()));
        m.insert("writes".into(), writes);
        Value::Object(m)
    }

    /// Save a new checkpoint of the current state and stream it.
    pub(super) async fn put_checkpoint(
        &mut self,
        source: &str,
        writes_meta: Value,
        mut blobs: Vec<ChannelBlob>,
        updated: Vec<String>,
    ) -> Result<(), LoopError> {
        let id = new_checkpoint_id();
        let checkpoint = self.state.to_checkpoint(&self.graph, id.clone(), updated);
        let metadata = self.base_metadata(source, writes_meta);
        let parent = self.checkpoint_id.replace(id);
        self.parent_id = parent.clone();
        self.pending.clear();
        // Streamed before it is saved, as the step's other events are: a sink that logs events
        // with the save that follows them (Spindle's workers do) then logs this one with it.
        self.emit_checkpoint(&metadata).await;
        if let Some(saver) = self.saver.clone() {
            match self.durability {
                Durability::Exit => {
                    for b in &blobs {
                        self.exit.channels.insert(b.channel.clone());
                    }
                    if !self.exit.dirty {
                        // The last checkpoint actually saved is the parent of the one the
                        // run will save at its end.
                        self.exit.parent = parent.clone();
                        self.exit.dirty = true;
                    }
                    self.exit.metadata = Some(metadata.clone());
                    self.exit.writes.clear();
                }
                Durability::Sync | Durability::Async => {
                    let write = QueuedWrite::Checkpoint {
                        thread_id: self.thread().to_owned(),
                        checkpoint_ns: self.ns_str.clone(),
                        checkpoint: Box::new(checkpoint),
                        metadata: metadata.clone(),
                        parent_id: parent,
                        blobs: std::mem::take(&mut blobs),
                    };
                    self.save(saver, write).await?;
                }
            }
        }
        Ok(())
    }

    /// Under `Durability::Exit`, write the final checkpoint with full copies of every channel
    /// that changed during the run (intermediate deltas were never saved), then the pending
    /// writes made against it.
    pub(super) async fn save_exit(&mut self) -> Result<(), LoopError> {
        if self.durability != Durability::Exit {
            return Ok(());
        }
        let Some(saver) = self.saver.clone() else {
            return Ok(());
        };
        if self.exit.dirty {
            let mut blobs = Vec::new();
            for name in std::mem::take(&mut self.exit.channels) {
                if name == TASKS || name == START_INPUT {
                    blobs.push(self.state.bookkeeping_blob(&name));
                    continue;
                }
                if let Some(&i) = self.graph.channel_index.get(&name) {
                    self.state.depths[i] = 0;
                    blobs.push(ChannelBlob {
                        channel: name,
                        version: self.state.versions[i],
                        value: match &self.state.values[i] {
                            Some(v) => BlobValue::Full { value: v.clone() },
                            None => BlobValue::Empty,
                        },
                    });
                }
            }
            let id = self.checkpoint_id.clone().unwrap_or_else(new_checkpoint_id);
            let cp = self.state.to_checkpoint(&self.graph, id, Vec::new());
            let md = self
                .exit
                .metadata
                .take()
                .unwrap_or_else(|| self.base_metadata("loop", Value::Null));
            let parent = self.exit.parent.take();
            saver
                .put(
                    self.thread(),
                    &self.ns_str,
                    &cp,
                    &md,
                    parent.as_deref(),
                    &blobs,
                )
                .await?;
            self.exit.dirty = false;
        }
        let writes = std::mem::take(&mut self.exit.writes);
        if let (false, Some(cid)) = (writes.is_empty(), self.checkpoint_id.clone()) {
            saver
                .put_writes(self.thread(), &self.ns_str, &cid, &writes)
                .await?;
        }
        Ok(())
    }
}

/// A receipt that also carries the failure of the saves queued before it.
fn after(earlier: Option<WriteReceipt>, receipt: WriteReceipt) -> WriteReceipt {
    match earlier {
        None => receipt,
        Some(earlier) => Box::pin(async move {
            let first = earlier.await;
            let second = receipt.await;
            first.and(second)
        }),
    }
}

/// What `Durability::Exit` holds back until the run ends.
#[derive(Debug, Default)]
pub(crate) struct ExitBuffer {
    /// Channels changed since the last saved checkpoint.
    pub channels: std::collections::BTreeSet<String>,
    /// Metadata of the newest (unsaved) checkpoint.
    pub metadata: Option<Value>,
    /// The last checkpoint actually saved: the parent of the one saved at exit.
    pub parent: Option<String>,
    /// Pending writes against the newest checkpoint.
    pub writes: Vec<PendingWrite>,
    /// Whether a checkpoint was made that is not saved yet.
    pub dirty: bool,
}
