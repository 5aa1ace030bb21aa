//! A run's event pump: numbers the events the engine streams, hands each to live streams at
//! once, and writes them to the thread's event log, in batches or with the run's saves.
//!
//! A save carries exactly the events the engine sent before asking for it: the engine's
//! [`EventSink`](spindle_graph::EventSink) counts the events it sent, each save request
//! carries that count (see `logged_saves`), and the pump takes events from the channel up to
//! it, no further. Events sent after the save (the next step's, while the pump was busy) stay
//! for a later write: logged with the save, a crash before their own step's save would show
//! them twice in the replay of the resumed run, which runs that step again.
//!
//! Live streams get an event once it is logged, never before (`Publisher`): a client that
//! resumes a stream elsewhere after a crash then finds in the log every event it was sent, so
//! what it got before and after equals a replay. Events go to the log as soon as the engine
//! has no more ready (the storage's writer groups them with other runs' writes), so this
//! costs a commit's latency, not a batch's linger.

use std::sync::{Arc, OnceLock};

use chrono::Utc;
use futures::future::{FutureExt, Shared};
use serde_json::Value;
use spindle_graph::stream::StreamEvent;
use spindle_storage::{start_event_data, ClaimedRun, ResourceId};
use spindle_storage::{LoggedEvent, LoggedSave, Run, Storage, UNLOGGED_EVENTS_MAX};
use tokio::sync::mpsc;

use crate::hub::{EventHub, HubMessage};
use crate::logged_saves::SaveRequest;
use crate::metrics::FirstEvent;
use crate::v2_events::{normalize, normalize::Normalizer};

/// Most events one log write carries; a model streaming tokens fills batches, not transactions.
/// At most this many events (plus a final `error`) are queued but not known to be logged at
/// any time, which the storage's [`UNLOGGED_EVENTS_MAX`] must cover: a lost worker's
/// successor numbers its events after them.
const MAX_BATCH: usize = 256;
/// (The tail may also hold a run's `error` and its lifecycle end.)
const _: () = assert!((MAX_BATCH as i64) + 2 < UNLOGGED_EVENTS_MAX);

/// The first event of a run's attempt, `metadata {run_id, attempt}`, at `seq`. The worker
/// logs it, unless the run was claimed at its creation, whose transaction logged it
/// ([`spindle_storage::ClaimStart`]): a stream of that run sends it at once (the server's
/// `runs::stream`).
pub fn start_event(run: &Run, seq: i64) -> LoggedEvent {
    let data = start_event_data(run.run_id, run.attempt);
    logged(run, seq, "metadata".to_owned(), data)
}

pub(super) fn logged(run: &Run, seq: i64, event: String, data: Value) -> LoggedEvent {
    LoggedEvent {
        thread_id: run.thread_id,
        seq,
        run_id: run.run_id,
        event,
        data,
        created_at: Utc::now(),
    }
}

/// What a run logs for the thread event stream (agent protocol v2) besides `metadata`.
pub(super) struct ProtocolLog {
    /// The run's graph, which names its lifecycle events.
    pub graph_name: String,
    /// For a run started through the protocol: turns its graph's events into the protocol's.
    pub normalizer: Option<Normalizer>,
}

/// Numbers the run's events after the thread's last logged one (starting with `metadata`,
/// unless the run's creation logged it) and queues them for the log: as soon as the engine
/// has no more ready, or with the next save the engine asks for, in its transaction (see
/// `logged_saves`), so no save is stored without the events emitted before it. Live streams
/// get each write's events once it is committed (`Publisher`); what is left when the run
/// stops is returned, for the transaction that ends the run. The protocol's
/// `running` follows `metadata`; a v2 run's engine events pass through its normalizer
/// first (see `crate::protocol`), and messages still open when the run failed end with the
/// failure set in `failed`. `first_seen` records when the graph's first event came.
#[allow(clippy::too_many_arguments)]
pub(super) async fn pump_events(
    storage: Arc<dyn Storage>,
    hub: Arc<EventHub>,
    claimed: ClaimedRun,
    mut events: mpsc::Receiver<StreamEvent>,
    mut saves: mpsc::UnboundedReceiver<SaveRequest>,
    protocol_log: Option<ProtocolLog>,
    failed: Arc<OnceLock<String>>,
    first_seen: Option<FirstEvent>,
) -> Result<EventTail, String> {
    let mut pump = Pump::new(storage, hub, claimed.run.clone(), claimed.last_seq);
    pump.first_event = first_seen;
    if !claimed.start_logged {
        let first = start_event(&pump.run, claimed.last_seq + 1);
        pump.log(first.event, first.data).await?;
    }
    if let Some(log) = protocol_log {
        let (name, data) = normalize::lifecycle(&[], "running", &log.graph_name, None);
        pump.log(name, data).await?;
        pump.normalizer = log.normalizer;
    }
    let mut saves_open = true;
    loop {
        // Nothing more is ready: what was taken goes to the log now, to streams once there.
        if !pump.batch.is_empty() && events.is_empty() && saves.is_empty() {
            pump.flush().await;
        }
        tokio::select! {
            // A save first: it takes in every event sent before it anyway.
            biased;
            request = saves.recv(), if saves_open => match request {
                Some(request) => pump.save(request, &mut events).await?,
                None => saves_open = false,
            },
            event = events.recv() => match event {
                Some(event) => pump.receive(event).await?,
                None => break,
            },
        }
    }
    // The engine is done; the saves it asked for were sent before its sink closed.
    while let Ok(request) = saves.try_recv() {
        pump.save(request, &mut events).await?;
    }
    if let Some(mut normalizer) = pump.normalizer.take() {
        let error = failed.get().map(String::as_str);
        for (name, data) in normalizer.finish(error) {
            pump.log(name, data).await?;
        }
    }
    Ok(EventTail {
        seq: pump.seq,
        events: pump.batch,
        publisher: pump.publisher,
    })
}

/// Hands a run's events to live streams once they are logged, in the order they were
/// numbered: each write's events after its commit (writes of a thread commit in order), none
/// of a write that failed.
pub(super) struct Publisher {
    queue: mpsc::UnboundedSender<(Committed, Vec<LoggedEvent>)>,
    task: tokio::task::JoinHandle<()>,
}

/// Whether a write committed.
type Committed = Shared<futures::future::BoxFuture<'static, bool>>;

impl Publisher {
    fn start(hub: Arc<EventHub>, thread_id: ResourceId) -> Self {
        let (queue, mut writes) = mpsc::unbounded_channel::<(Committed, Vec<LoggedEvent>)>();
        let task = tokio::spawn(async move {
            while let Some((committed, events)) = writes.recv().await {
                if committed.await {
                    for event in events {
                        hub.publish(thread_id, HubMessage::Event(Arc::new(event)));
                    }
                }
            }
        });
        Self { queue, task }
    }

    /// Publishes `events` once `committed` says they are logged.
    pub(super) fn after(&self, committed: Committed, events: Vec<LoggedEvent>) {
        if !events.is_empty() {
            let _ = self.queue.send((committed, events));
        }
    }

    /// Waits until everything handed over is published (or known not to be logged).
    pub(super) async fn finish(self) {
        drop(self.queue);
        let _ = self.task.await;
    }
}

/// What a run's event pump holds between events.
struct Pump {
    storage: Arc<dyn Storage>,
    run: Run,
    /// The last seq given.
    seq: i64,
    /// How many of the engine's events were taken from its channel.
    received: u64,
    /// Numbered, not yet handed to the log.
    batch: Vec<LoggedEvent>,
    normalizer: Option<Normalizer>,
    /// Hands what is logged to live streams.
    publisher: Publisher,
    /// The last write (a save or events) handed to the storage and not known to be stored,
    /// and how many events the writes not known to be stored carry.
    unconfirmed: Option<(Committed, usize)>,
    /// Records the latency of the graph's first event, taken with it.
    first_event: Option<FirstEvent>,
}

impl Pump {
    fn new(storage: Arc<dyn Storage>, hub: Arc<EventHub>, run: Run, seq: i64) -> Self {
        Self {
            publisher: Publisher::start(hub, run.thread_id),
            storage,
            run,
            seq,
            received: 0,
            batch: Vec::new(),
            normalizer: None,
            unconfirmed: None,
            first_event: None,
        }
    }

    /// An event taken from the engine's channel.
    async fn receive(&mut self, event: StreamEvent) -> Result<(), String> {
        self.received += 1;
        let taken = self.take(event).await;
        if let Some(first) = self.first_event.take() {
            first.observe();
        }
        taken
    }

    /// An engine event, through the protocol's normalizer when the run has one.
    async fn take(&mut self, event: StreamEvent) -> Result<(), String> {
        let logged = match self.normalizer.as_mut() {
            Some(normalizer) => normalizer.push(event),
            None => vec![(event.event_name(), event.data)],
        };
        for (name, data) in logged {
            self.log(name, data).await?;
        }
        Ok(())
    }

    /// Numbers an event and adds it to the batch.
    async fn log(&mut self, name: String, data: Value) -> Result<(), String> {
        self.bound_unlogged().await;
        self.seq += 1;
        self.batch.push(logged(&self.run, self.seq, name, data));
        if self.batch.len() >= MAX_BATCH {
            self.flush().await;
        }
        Ok(())
    }

    /// Keeps the events streamed but not known to be logged under [`MAX_BATCH`] (what a lost
    /// worker's successor skips, [`UNLOGGED_EVENTS_MAX`], covers them): once the saves not
    /// yet stored carry that many with the batch, waits for them.
    async fn bound_unlogged(&mut self) {
        let carried = self.unconfirmed.as_ref().map_or(0, |(_, carried)| *carried);
        if carried > 0 && carried + self.batch.len() >= MAX_BATCH {
            self.settle().await;
        }
    }

    /// Waits until the writes handed over are stored. A save that failed took its events with
    /// it; the engine learns of the failure from its receipt and the run ends in error.
    async fn settle(&mut self) {
        if let Some((committed, _)) = self.unconfirmed.take() {
            committed.await;
        }
    }

    /// Queues the batch for the log (behind the writes queued before it), and for live
    /// streams once it is there.
    async fn flush(&mut self) {
        let events = std::mem::take(&mut self.batch);
        let carried = events.len();
        let stored = self.storage.queue_events(events.clone());
        let committed = async move {
            match stored.await {
                Ok(()) => true,
                Err(error) => {
                    tracing::warn!(%error, "a batch of the run's events was not logged");
                    false
                }
            }
        }
        .boxed()
        .shared();
        self.publisher.after(committed.clone(), events);
        self.confirm_later(committed, carried);
    }

    /// Counts a write handed over as not known to be stored; it is the latest, so once it is
    /// stored the earlier ones are too (a thread's writes commit in order).
    fn confirm_later(&mut self, committed: Committed, carried: usize) {
        let before = self.unconfirmed.take().map_or(0, |(_, carried)| carried);
        self.unconfirmed = Some((committed, before + carried));
    }

    /// A save the engine asked for: takes in the events sent before it (counted once in the
    /// channel, so they are there), then has the storage store them with it, in one
    /// transaction.
    async fn save(
        &mut self,
        request: SaveRequest,
        events: &mut mpsc::Receiver<StreamEvent>,
    ) -> Result<(), String> {
        while self.received < request.events_before {
            let Some(event) = events.recv().await else {
                break;
            };
            self.receive(event).await?;
        }
        let events = std::mem::take(&mut self.batch);
        let save = LoggedSave {
            write: request.write,
            events: events.clone(),
        };
        let carried = save.events.len();
        let receipt = self.storage.queue_logged(save);
        let saved = receipt.shared();
        let committed = saved.clone().map(|stored| stored.is_ok()).boxed().shared();
        self.publisher.after(committed.clone(), events);
        self.confirm_later(committed, carried);
        // The engine may have stopped waiting (its run was cancelled); the save goes on.
        let _ = request.reply.send(Box::pin(saved));
        Ok(())
    }
}

/// Where a run's events stand when it stops: the last seq used, the events not logged yet
/// (the run's end logs them), and who hands what is logged to live streams.
pub(super) struct EventTail {
    pub seq: i64,
    pub events: Vec<LoggedEvent>,
    pub publisher: Publisher,
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use spindle_graph::checkpoint::{new_checkpoint_id, Checkpoint, QueuedWrite};
    use spindle_graph::stream::StreamMode;
    use spindle_graph::EventSink;
    use spindle_storage::{
        IfExists, IfThreadMissing, JsonObject, MultitaskStrategy, NewRun, NewThread, ResourceId,
        Scope,
    };
    use tokio::sync::oneshot;
    use uuid::Uuid;

    use super::*;

    fn custom(data: Value) -> StreamEvent {
        StreamEvent {
            namespace: Vec::new(),
            mode: StreamMode::Custom,
            part: None,
            data,
        }
    }

    /// A run's thread and the run, in a fresh SQLite database.
    async fn a_run(dir: &std::path::Path) -> (Arc<dyn Storage>, Run) {
        let url = dir.join("pump.db").to_string_lossy().into_owned();
        let storage = spindle_storage::connect(&url).await.unwrap();
        let scope = Scope::new("");
        let thread_id = ResourceId::generate();
        let thread = NewThread::new(thread_id, JsonObject::new(), IfExists::Raise);
        storage.create_thread(&scope, thread).await.unwrap();
        let new = NewRun {
            run_id: Uuid::new_v4(),
            thread_id,
            assistant_id: ResourceId::generate(),
            assistant_read: None,
            kwargs: JsonObject::new(),
            metadata: JsonObject::new(),
            multitask_strategy: MultitaskStrategy::Enqueue,
            run_after: Utc::now(),
            claim: None,
            if_thread_missing: IfThreadMissing::Reject,
            cron_firing: None,
        };
        let run = storage.create_run(&scope, new).await.unwrap().run;
        (storage, run)
    }

    /// The engine went on to its next step while the pump was busy: the save stores the
    /// events sent before it and leaves the next step's in the channel. Stored with the
    /// save, they would show twice after a crash, as the resumed run sends them again.
    #[tokio::test]
    async fn a_save_carries_the_events_sent_before_it_and_none_after() {
        let dir = tempfile::tempdir().unwrap();
        let (storage, run) = a_run(dir.path()).await;
        let (sink, mut events) = mpsc::channel(16);
        let sink = EventSink::from(sink);
        assert!(sink.send(custom(json!("step 1"))).await);
        let (reply, receipt) = oneshot::channel();
        let request = SaveRequest {
            write: QueuedWrite::Checkpoint {
                thread_id: run.thread_id.to_string(),
                checkpoint_ns: String::new(),
                checkpoint: Box::new(Checkpoint {
                    v: 1,
                    id: new_checkpoint_id(),
                    ts: Utc::now().to_rfc3339(),
                    channel_values: Default::default(),
                    channel_versions: Default::default(),
                    versions_seen: Default::default(),
                    updated_channels: Vec::new(),
                    delta_depths: Default::default(),
                }),
                metadata: json!({"step": 1}),
                parent_id: None,
                blobs: Vec::new(),
            },
            events_before: sink.sent().get(),
            reply,
        };
        assert!(sink.send(custom(json!("step 2"))).await);

        let mut pump = Pump::new(storage.clone(), Arc::default(), run.clone(), 0);
        pump.save(request, &mut events).await.unwrap();
        receipt.await.unwrap().await.unwrap();

        let logged = storage
            .read_events(run.thread_id, 0, Some(run.run_id), 100)
            .await
            .unwrap();
        let logged: Vec<&Value> = logged.iter().map(|event| &event.data).collect();
        assert_eq!(logged, [&json!("step 1")]);
        assert_eq!(events.try_recv().unwrap().data, json!("step 2"));
    }
}
