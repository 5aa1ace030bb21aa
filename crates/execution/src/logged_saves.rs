//! A run's checkpointer whose saves carry the run's events.
//!
//! The worker hands a run's events to the log in batches (full, or 50 ms old), while
//! the engine saves checkpoints and pending writes on its own. Left apart, a crash between a
//! save's commit and the next batch's leaves a step stored whose events never reach the log,
//! and the resumed run does not run that step again: a replay would never show it. So every
//! save the engine makes goes through the run's event pump (a [`SaveRequest`]), which first
//! takes in every event the engine emitted before the save (and none it emitted after: a
//! request carries the engine's count of events sent, see `event_pump`), then stores them
//! with it, in one transaction ([`spindle_storage::LoggedSave`]). A step's checkpoint is
//! therefore durable exactly when the events emitted before it are, on every backend and
//! durability.
//!
//! It costs no commit: on SQLite the save is queued on the writer as before (the events ride
//! in the same write, so a run's quick steps still share one or two commits); on PostgreSQL a
//! save was one transaction already, and the events add rows to it. The pump keeps the
//! saves in order on both, so the engine never waits for a save it queued before the run's
//! end, an interrupt or an error (`Checkpointer::queue`), and the run's end is written after
//! its last save.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use spindle_graph::checkpoint::{
    ChannelBlob, Checkpoint, CheckpointError, CheckpointTuple, Checkpointer, ListFilter,
    PendingWrite, QueuedWrite, WriteReceipt,
};
use spindle_graph::stream::SentCount;
use tokio::sync::{mpsc, oneshot};

/// A save the engine asked for, for the run's event pump to store with the events before it.
pub(super) struct SaveRequest {
    pub write: QueuedWrite,
    /// How many events the engine had sent when it asked: those the save carries (with any
    /// an earlier write did not).
    pub events_before: u64,
    /// The save's receipt, once the pump queued (or started) it.
    pub reply: oneshot::Sender<WriteReceipt>,
}

/// The engine's checkpointer for one run: reads go to the database's checkpointer, saves to
/// the run's event pump.
pub(super) struct LoggedSaves {
    reads: Arc<dyn Checkpointer>,
    requests: mpsc::UnboundedSender<SaveRequest>,
    /// The events the run's engine sent so far.
    sent: SentCount,
}

impl LoggedSaves {
    pub(super) fn new(
        reads: Arc<dyn Checkpointer>,
        requests: mpsc::UnboundedSender<SaveRequest>,
        sent: SentCount,
    ) -> Self {
        Self {
            reads,
            requests,
            sent,
        }
    }

    /// Hands the save to the pump; the receipt resolves once it is stored (or failed).
    fn request(&self, write: QueuedWrite) -> WriteReceipt {
        let (reply, receipt) = oneshot::channel();
        let request = SaveRequest {
            write,
            events_before: self.sent.get(),
            reply,
        };
        if self.requests.send(request).is_err() {
            return Box::pin(std::future::ready(Err(pump_stopped())));
        }
        Box::pin(async move {
            match receipt.await {
                Ok(receipt) => receipt.await,
                Err(_) => Err(pump_stopped()),
            }
        })
    }
}

/// The pump stops only when the run's events could not be logged; the run cannot go on
/// saving steps whose events are lost.
fn pump_stopped() -> CheckpointError {
    CheckpointError::Backend("the run's event log failed; its steps are not saved".into())
}

#[async_trait]
impl Checkpointer for LoggedSaves {
    async fn put(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint: &Checkpoint,
        metadata: &Value,
        parent_id: Option<&str>,
        blobs: &[ChannelBlob],
    ) -> Result<(), CheckpointError> {
        self.request(QueuedWrite::Checkpoint {
            thread_id: thread_id.to_owned(),
            checkpoint_ns: checkpoint_ns.to_owned(),
            checkpoint: Box::new(checkpoint.clone()),
            metadata: metadata.clone(),
            parent_id: parent_id.map(str::to_owned),
            blobs: blobs.to_vec(),
        })
        .await
    }

    async fn put_writes(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        writes: &[PendingWrite],
    ) -> Result<(), CheckpointError> {
        self.request(QueuedWrite::Writes {
            thread_id: thread_id.to_owned(),
            checkpoint_ns: checkpoint_ns.to_owned(),
            checkpoint_id: checkpoint_id.to_owned(),
            writes: writes.to_vec(),
        })
        .await
    }

    async fn get_tuple(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<CheckpointTuple>, CheckpointError> {
        self.reads
            .get_tuple(thread_id, checkpoint_ns, checkpoint_id)
            .await
    }

    async fn list(
        &self,
        thread_id: &str,
        checkpoint_ns: Option<&str>,
        filter: &ListFilter,
    ) -> Result<Vec<CheckpointTuple>, CheckpointError> {
        self.reads.list(thread_id, checkpoint_ns, filter).await
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), CheckpointError> {
        self.reads.delete_thread(thread_id).await
    }

    async fn copy_thread(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        self.reads.copy_thread(from, to).await
    }

    /// Queued through the pump, on every backend: it takes requests one at a time and keeps
    /// their order (SQLite's writer queue; on PostgreSQL each save starts once the one
    /// before is stored). The request reaches it at once, right behind the step's events,
    /// rather than once the earlier saves are done, so the step's events go with its save
    /// instead of being logged ahead of it by a batch that lingered.
    fn queue(&self, write: QueuedWrite) -> Result<WriteReceipt, Box<QueuedWrite>> {
        Ok(self.request(write))
    }
}
