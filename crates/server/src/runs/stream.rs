//! Streaming a run, or every run of a thread, to a client: subscribe first, replay the log
//! second, then forward live events, so a client resuming after `Last-Event-ID` sees no gap and
//! no duplicate. A run's stream ends when the run ends; a thread's stream lasts as long as the
//! client listens (or until the thread is deleted).
//!
//! Live events are forwarded only while they continue the log exactly (`seq == sent + 1`).
//! The worker hands events to the hub before their batch is committed, and a subscriber that
//! lags loses messages; in both cases the next live event may be ahead of what the stream has
//! sent, and the stream goes back to the log instead of skipping over the gap.

use spindle_storage::ResourceId;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use serde_json::json;
use spindle_storage::{LoggedEvent, Scope, Storage, StorageError, RUN_END_EVENT};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::protocol::envelope::Framer;
use crate::protocol::is_lifecycle;
use crate::sse;
use spindle_execution::hub::{EventHub, HubMessage, Lagged, Subscription};

/// How often a stream re-reads the log in case the run executes in another process, where
/// commits to the log are not announced (see `spindle_execution::wakeups`).
const POLL: Duration = Duration::from_millis(250);
/// Events read from the log per query.
const PAGE: i64 = 500;

/// What a stream follows.
#[derive(Clone, Debug)]
pub struct Follow {
    pub thread_id: ResourceId,
    pub target: Target,
    /// Send events with seq greater than this (`Last-Event-ID`; `-1` replays all). Without
    /// it a run stream starts at the run's first event, a thread stream at the next event.
    pub after: Option<i64>,
    /// Put `id:` lines on frames (resumable streams).
    pub with_ids: bool,
}

/// Whose events a stream carries.
#[derive(Clone, Debug)]
pub enum Target {
    /// One run's events; the stream ends with the run.
    Run(Uuid),
    /// The events of every run of the thread, selected by `ThreadModes`.
    Thread(ThreadModes),
    /// The events of every run of the thread as agent protocol v2 envelopes (the thread
    /// event stream). The framer keeps a one-event look-back, hence the lock; only the
    /// stream's own task takes it.
    Protocol(Arc<Mutex<Framer>>),
}

/// What `GET /threads/{id}/stream` sends, as its `stream_modes` select.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadModes {
    /// Every event of every run (the run's own stream modes), with run starts and ends.
    pub run_modes: bool,
    /// Only run starts (`metadata {run_id, attempt}`) and ends (`metadata {status: run_done}`).
    pub lifecycle: bool,
    /// Updates of the thread's state made through the state API.
    pub state_update: bool,
}

/// The logged event name of a state update made through the state API.
pub const STATE_UPDATE_EVENT: &str = "state_update";

impl Target {
    /// The SSE frame a logged event becomes on this stream, if it belongs on it.
    fn frame(&self, event: &LoggedEvent, with_ids: bool) -> Option<Bytes> {
        let id = with_ids.then_some(event.seq);
        match *self {
            Target::Protocol(ref framer) => framer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .frame(event),
            // The protocol's lifecycle events are the thread event stream's own: run streams
            // announce a run's start and end with `metadata` instead.
            _ if is_lifecycle(&event.event) => None,
            Target::Run(run_id) => (event.run_id == run_id && event.event != RUN_END_EVENT)
                .then(|| sse::json_frame(&event.event, &event.data, id)),
            Target::Thread(modes) => match event.event.as_str() {
                RUN_END_EVENT if modes.run_modes || modes.lifecycle => {
                    let done = json!({"status": "run_done", "run_id": event.run_id.to_string()});
                    Some(sse::json_frame("metadata", &done, id))
                }
                "metadata" if modes.run_modes || modes.lifecycle => {
                    Some(sse::json_frame("metadata", &event.data, id))
                }
                STATE_UPDATE_EVENT if modes.state_update => {
                    Some(sse::json_frame(&event.event, &event.data, id))
                }
                RUN_END_EVENT | "metadata" | STATE_UPDATE_EVENT => None,
                _ if modes.run_modes => Some(sse::json_frame(&event.event, &event.data, id)),
                _ => None,
            },
        }
    }

    /// Whether a live event is of what this stream follows (a run stream waiting behind an
    /// earlier run of its thread ignores that run's events instead of re-reading the log).
    fn wants(&self, event: &LoggedEvent) -> bool {
        match *self {
            Target::Run(run_id) => event.run_id == run_id,
            Target::Thread(_) | Target::Protocol(_) => true,
        }
    }

    /// The log query's run filter.
    fn run_id(&self) -> Option<Uuid> {
        match *self {
            Target::Run(run_id) => Some(run_id),
            Target::Thread(_) | Target::Protocol(_) => None,
        }
    }
}

/// Where a stream stands in the thread's log.
struct Position {
    /// The seq of the last event looked at (sent or skipped).
    seq: i64,
    /// Whether `seq` is known to be the event before the next one this stream must send. A run
    /// stream that found none of its run's events in the log is not anchored until it sees the
    /// run's first event (`metadata`).
    anchored: bool,
}

impl Position {
    /// Whether a live event continues the stream without a gap.
    fn continues_with(&self, event: &LoggedEvent, target: &Target) -> bool {
        if self.anchored {
            return event.seq == self.seq + 1;
        }
        matches!(*target, Target::Run(run_id) if event.run_id == run_id && event.event == "metadata")
    }
}

/// The SSE body of a run or thread stream. `on_done` runs when the stream stops, told whether
/// what it followed had ended (false: the client went away first).
pub fn follow_stream(
    storage: Arc<dyn Storage>,
    hub: Arc<EventHub>,
    scope: Scope,
    follow: Follow,
    keepalive: Duration,
    on_done: impl FnOnce(bool) + Send + 'static,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let live = hub.subscribe(follow.thread_id);
    stream_body(
        storage,
        live,
        scope,
        follow,
        Opening::Log,
        keepalive,
        on_done,
    )
}

/// The SSE body of a run created after `live` subscribed to its thread. Every event of the run
/// reaches `live`, so the stream starts without reading the log, and reads it only when it
/// must (a lagging subscription, a run executing in another process, the run's end).
///
/// `first` is the run's first event when this process claimed the run at its creation
/// ([`spindle_execution::first_event`]): the body then opens with it, ready before the
/// worker has even started, and the worker's own copy of it is passed over as already sent.
pub fn follow_new_run(
    storage: Arc<dyn Storage>,
    live: Subscription,
    scope: Scope,
    follow: Follow,
    first: Option<&LoggedEvent>,
    keepalive: Duration,
    on_done: impl FnOnce(bool) + Send + 'static,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let opening = Opening::Live { first };
    stream_body(storage, live, scope, follow, opening, keepalive, on_done)
}

/// Where a stream's events come from at first.
enum Opening<'a> {
    /// The log: what the stream follows may have begun before it subscribed.
    Log,
    /// Live: the subscription predates the run; `first` is the run's first event when the
    /// stream is to send it before the run does.
    Live { first: Option<&'a LoggedEvent> },
}

fn stream_body(
    storage: Arc<dyn Storage>,
    live: Subscription,
    scope: Scope,
    follow: Follow,
    opening: Opening,
    keepalive: Duration,
    on_done: impl FnOnce(bool) + Send + 'static,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let opening = match opening {
        Opening::Log => Opened::Log,
        Opening::Live { first: None } => Opened::Live(None),
        Opening::Live { first: Some(event) } => {
            if let Some(frame) = follow.target.frame(event, follow.with_ids) {
                // Into the channel now, not from the task below: the frame is then ready the
                // moment the response is first polled. The channel is new, so there is room.
                let _ = tx.try_send(frame);
            }
            Opened::Live(Some(Position {
                seq: event.seq,
                anchored: true,
            }))
        }
    };
    tokio::spawn(async move {
        // A stream the stopping process closed is neither over nor left by its client: what
        // it followed goes on, and `on_done` (which may cancel a run) is not told.
        if let Some(ended) = pump(storage, live, scope, follow, opening, keepalive, &tx).await {
            on_done(ended);
        }
    });
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) },
    )
}

/// A stream's opening once its first event, if it had one, is in its channel: where the
/// stream stands then, if that is known without the log.
enum Opened {
    Log,
    Live(Option<Position>),
}

/// Feeds the stream until what it follows ends (true), the client leaves (false) or the
/// process closes its streams (`None`). Opening live, the log holds nothing the subscription
/// will not bring, so the first read of the log is skipped.
async fn pump(
    storage: Arc<dyn Storage>,
    mut live: Subscription,
    scope: Scope,
    follow: Follow,
    opening: Opened,
    keepalive: Duration,
    tx: &mpsc::Sender<Bytes>,
) -> Option<bool> {
    let closing = live.closing();
    let mut live_first = matches!(opening, Opened::Live(_));
    let start = match opening {
        Opened::Live(Some(sent)) => Ok(sent),
        Opened::Live(None) | Opened::Log => start(&storage, &follow).await,
    };
    let mut at = match start {
        Ok(at) => at,
        Err(err) => {
            tracing::warn!(error = %err, thread_id = %follow.thread_id, "cannot open the event stream");
            return Some(true);
        }
    };
    let mut heartbeat = tokio::time::interval(keepalive);
    heartbeat.tick().await;
    // Not `interval`, whose first tick is at once: that read the log twice on every start.
    // Where commits are announced, an idle stream reads nothing until one is.
    let mut poll = (!live.announced())
        .then(|| tokio::time::interval_at(tokio::time::Instant::now() + POLL, POLL));
    // Whether the stream has sent every event of its run: its subscription predates the run
    // and no live event was passed over since (a gap or a lag). A run's end announced on the
    // hub comes after all of its events (the worker publishes each before it ends the run),
    // so such a stream is complete without reading the log again.
    let mut all_live = live_first;
    loop {
        // Catch up from the log: the first time, after a gap, and on every poll tick.
        let read = if std::mem::take(&mut live_first) {
            Ok(false)
        } else {
            catch_up(&storage, &scope, &follow, &mut at, tx).await
        };
        match read {
            Ok(true) => return Some(true),
            Ok(false) => {}
            Err(CatchUp::ClientGone) => return Some(false),
            Err(CatchUp::Failed(err)) => {
                tracing::warn!(error = %err, thread_id = %follow.thread_id, "cannot read the event log");
                return Some(true);
            }
        }
        loop {
            tokio::select! {
                message = live.recv() => match message {
                    Ok(HubMessage::Event(event)) if event.seq > at.seq && follow.target.wants(&event) => {
                        if !at.continues_with(&event, &follow.target) {
                            all_live = false;
                            break;
                        }
                        at = Position { seq: event.seq, anchored: true };
                        if let Some(frame) = follow.target.frame(&event, follow.with_ids) {
                            if tx.send(frame).await.is_err() {
                                return Some(false);
                            }
                        }
                    }
                    Ok(HubMessage::RunEnded { run_id, .. })
                        if all_live && at.anchored && follow.target.run_id() == Some(run_id) =>
                    {
                        return Some(true);
                    }
                    Ok(HubMessage::RunEnded { .. }) => break,
                    // Committed beyond what the stream has sent (by another process, or
                    // after a gap in what this one streamed live).
                    Ok(HubMessage::Logged { seq }) if seq > at.seq => break,
                    Ok(_) => {}
                    // Fell behind: the log has everything.
                    Err(Lagged(_)) => {
                        all_live = false;
                        break;
                    }
                },
                _ = heartbeat.tick() => {
                    if tx.send(Bytes::from_static(sse::HEARTBEAT)).await.is_err() {
                        return Some(false);
                    }
                }
                _ = tick(&mut poll) => break,
                () = tx.closed() => return Some(false),
                // The process is stopping: the client resumes elsewhere.
                () = closing.cancelled() => return None,
            }
        }
    }
}

/// The next tick of the poll, or never without one.
async fn tick(poll: &mut Option<tokio::time::Interval>) {
    match poll {
        Some(poll) => {
            poll.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Where a stream starts. A thread stream without `Last-Event-ID` sends what happens from now
/// on; anything else replays the log after `after`.
async fn start(storage: &Arc<dyn Storage>, follow: &Follow) -> Result<Position, StorageError> {
    Ok(match (&follow.target, follow.after) {
        (Target::Thread(_) | Target::Protocol(_), None) => Position {
            seq: storage.last_event_seq(follow.thread_id).await?,
            anchored: true,
        },
        (Target::Thread(_) | Target::Protocol(_), Some(after)) => Position {
            seq: after.max(0),
            anchored: true,
        },
        (Target::Run(_), after) => Position {
            seq: after.unwrap_or(0).max(0),
            anchored: false,
        },
    })
}

enum CatchUp {
    ClientGone,
    Failed(String),
}

/// Sends what the log holds after `at`; answers whether what the stream follows has ended
/// (so every event it will ever have is in the log and has been sent).
async fn catch_up(
    storage: &Arc<dyn Storage>,
    scope: &Scope,
    follow: &Follow,
    at: &mut Position,
    tx: &mpsc::Sender<Bytes>,
) -> Result<bool, CatchUp> {
    // Read the end condition first: if it holds now, the log below is complete.
    let ended = match ended(storage, scope, follow).await {
        Ok(ended) => ended,
        Err(err) => return Err(CatchUp::Failed(err.to_string())),
    };
    loop {
        let events = storage
            .read_events(follow.thread_id, at.seq, follow.target.run_id(), PAGE)
            .await
            .map_err(|e| CatchUp::Failed(e.to_string()))?;
        let full = events.len() as i64 == PAGE;
        for event in &events {
            if let Some(frame) = follow.target.frame(event, follow.with_ids) {
                tx.send(frame).await.map_err(|_| CatchUp::ClientGone)?;
            }
            *at = Position {
                seq: event.seq,
                anchored: true,
            };
        }
        if !full {
            return Ok(ended);
        }
    }
}

/// A run stream ends with its run (or when the run is deleted: rollback, or its thread was
/// deleted); a thread stream when its thread is deleted.
async fn ended(
    storage: &Arc<dyn Storage>,
    scope: &Scope,
    follow: &Follow,
) -> Result<bool, StorageError> {
    let found = match follow.target {
        Target::Run(run_id) => storage
            .get_run(scope, follow.thread_id, run_id)
            .await
            .map(|run| !run.status.is_active()),
        Target::Thread(_) | Target::Protocol(_) => storage
            .get_thread(scope, follow.thread_id)
            .await
            .map(|_| false),
    };
    match found {
        Err(StorageError::NotFound(_)) => Ok(true),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use futures::{FutureExt, StreamExt};
    use serde_json::Value;

    use super::*;

    fn event(run_id: Uuid, seq: i64, name: &str) -> LoggedEvent {
        LoggedEvent {
            thread_id: ResourceId::from(Uuid::nil()),
            seq,
            run_id,
            event: name.into(),
            data: json!({"n": seq}),
            created_at: chrono::Utc::now(),
        }
    }

    fn text(frame: Option<Bytes>) -> Option<String> {
        frame.map(|b| String::from_utf8(b.to_vec()).unwrap())
    }

    #[test]
    fn a_run_stream_carries_its_run_only_and_not_the_end_marker() {
        let (run, other) = (Uuid::new_v4(), Uuid::new_v4());
        let target = Target::Run(run);
        assert!(target.frame(&event(run, 1, "values"), false).is_some());
        assert!(target.frame(&event(other, 2, "values"), false).is_none());
        assert!(target.frame(&event(run, 3, RUN_END_EVENT), false).is_none());
    }

    #[test]
    fn lifecycle_sends_run_starts_and_run_done() {
        let run = Uuid::new_v4();
        let target = Target::Thread(ThreadModes {
            lifecycle: true,
            ..ThreadModes::default()
        });
        assert!(target.frame(&event(run, 1, "values"), true).is_none());
        let start = text(target.frame(&event(run, 2, "metadata"), true)).unwrap();
        assert!(start.starts_with("event: metadata\r\n"), "{start}");
        let done = text(target.frame(&event(run, 3, RUN_END_EVENT), true)).unwrap();
        let data: Value =
            serde_json::from_str(done.lines().find_map(|l| l.strip_prefix("data: ")).unwrap())
                .unwrap();
        assert_eq!(
            data,
            json!({"status": "run_done", "run_id": run.to_string()})
        );
        assert!(done.contains("id: 3\r\n"));
    }

    #[test]
    fn run_modes_skip_state_updates_and_state_update_takes_only_them() {
        let run = Uuid::new_v4();
        let runs = Target::Thread(ThreadModes {
            run_modes: true,
            ..ThreadModes::default()
        });
        let states = Target::Thread(ThreadModes {
            state_update: true,
            ..ThreadModes::default()
        });
        assert!(runs.frame(&event(run, 1, "updates"), true).is_some());
        assert!(runs
            .frame(&event(run, 2, STATE_UPDATE_EVENT), true)
            .is_none());
        assert!(states.frame(&event(run, 1, "updates"), true).is_none());
        assert!(states
            .frame(&event(run, 2, STATE_UPDATE_EVENT), true)
            .is_some());
    }

    /// A stream of a run claimed at its creation opens with the run's first event before the
    /// worker has sent anything, then passes over the worker's copy of it: each event once,
    /// in order, ending with the run.
    #[tokio::test]
    async fn a_stream_opening_with_its_runs_first_event_sends_each_event_once() {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("stream.db").to_string_lossy().into_owned();
        let storage = spindle_storage::connect(&url).await.unwrap();
        let hub = Arc::new(EventHub::default());
        let (thread_id, run) = (ResourceId::generate(), Uuid::new_v4());
        let at = |seq, name| LoggedEvent {
            thread_id,
            ..event(run, seq, name)
        };
        let follow = Follow {
            thread_id,
            target: Target::Run(run),
            after: None,
            with_ids: true,
        };
        let first = at(8, "metadata");
        let live = hub.subscribe(thread_id);
        let body = follow_new_run(
            storage,
            live,
            Scope::new(""),
            follow,
            Some(&first),
            Duration::from_secs(60),
            |_| {},
        );
        let mut body = std::pin::pin!(body);
        // Ready at the first poll, before the stream's task or any worker has run.
        let opening = body.next().now_or_never().flatten().unwrap().unwrap();
        let opening = String::from_utf8(opening.to_vec()).unwrap();
        assert!(opening.starts_with("event: metadata\r\n"), "{opening}");
        assert!(opening.contains("id: 8\r\n"), "{opening}");

        for seq_name in [(8, "metadata"), (9, "values"), (10, "updates")] {
            let event = at(seq_name.0, seq_name.1);
            hub.publish(thread_id, HubMessage::Event(Arc::new(event)));
        }
        let ended = HubMessage::RunEnded {
            run_id: run,
            status: spindle_storage::RunStatus::Success,
            ended: None,
        };
        hub.publish(thread_id, ended);
        let rest: Vec<String> = body
            .map(|frame| String::from_utf8(frame.unwrap().to_vec()).unwrap())
            .collect()
            .await;
        assert_eq!(rest.len(), 2, "{rest:?}");
        assert!(rest[0].starts_with("event: values\r\n") && rest[0].contains("id: 9\r\n"));
        assert!(rest[1].starts_with("event: updates\r\n") && rest[1].contains("id: 10\r\n"));
    }

    #[test]
    fn live_events_must_continue_the_log() {
        let run = Uuid::new_v4();
        let anchored = Position {
            seq: 4,
            anchored: true,
        };
        assert!(anchored.continues_with(&event(run, 5, "values"), &Target::Run(run)));
        assert!(!anchored.continues_with(&event(run, 6, "values"), &Target::Run(run)));
        let fresh = Position {
            seq: 0,
            anchored: false,
        };
        assert!(fresh.continues_with(&event(run, 9, "metadata"), &Target::Run(run)));
        assert!(!fresh.continues_with(&event(run, 10, "values"), &Target::Run(run)));
    }
}
