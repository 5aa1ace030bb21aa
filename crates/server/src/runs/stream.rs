//! Streaming a run, or every run of a thread, to a client: subscribe first, replay the log
//! second, then forward live events, so a client resuming after `Last-Event-ID` sees no gap and
//! no duplicate. A run's stream ends when the run ends; a thread's stream lasts as long as the
//! client listens (or until the thread is deleted).
//!
//! Live events are forwarded only while they continue the log exactly (`seq == sent + 1`).
//! The worker hands events to the hub before their batch is committed, and a subscriber that
//! lags loses messages; in both cases the next live event may be ahead of what the stream has
//! sent, and the stream goes back to the log instead of skipping over the gap.
//!
//! A stream's pump runs in the response body itself, polled by the connection's task: no task
//! and no channel of its own, which an idle stream (most are) would hold for nothing (a tokio
//! channel is 1.6 KB before its first frame). The pump hands each frame to the body and waits
//! until the body is polled again, so the client's pace paces the pump, and a client that
//! leaves drops the pump with the body.

use spindle_storage::ResourceId;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use serde_json::json;
use spindle_storage::{LoggedEvent, Scope, Storage, StorageError, RUN_END_EVENT};
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

    /// Whether `event` is the end of the run this stream follows (a run stream's last).
    fn ends_with(&self, event: &LoggedEvent) -> bool {
        matches!(*self, Target::Run(run_id) if event.run_id == run_id && event.event == RUN_END_EVENT)
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
) -> impl Stream<Item = Result<Bytes, StreamCut>> {
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
) -> impl Stream<Item = Result<Bytes, StreamCut>> {
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
) -> impl Stream<Item = Result<Bytes, StreamCut>> {
    let mut first = None;
    let opening = match opening {
        Opening::Log => Opened::Log,
        Opening::Live { first: None } => Opened::Live(None),
        Opening::Live { first: Some(event) } => {
            // Sent before the pump is first polled: the frame is ready the moment the response
            // is first polled.
            first = follow.target.frame(event, follow.with_ids);
            Opened::Live(Some(Position {
                seq: event.seq,
                anchored: true,
            }))
        }
    };
    let closing = live.closing();
    let outbox = Outbox::default();
    let pump = pump(
        storage,
        live,
        scope,
        follow,
        opening,
        keepalive,
        outbox.clone(),
    );
    Body {
        first,
        pump: Some(Box::pin(pump)),
        outbox,
        closing,
        on_done: Some(on_done),
        cut: false,
    }
}

/// How a stream ends when the process closes its streams (a graceful shutdown): as an error of
/// its body, so hyper cuts the connection without the chunked body's last chunk. The client
/// then sees a broken stream rather than a finished one, and reconnects to the response's
/// `Location` with `Last-Event-ID`: the JS client reconnects only after an error, and
/// langgraph-sdk otherwise first asks whether the run is still going.
#[derive(Debug)]
pub struct StreamCut;

impl std::fmt::Display for StreamCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the server is closing its streams; reconnect with Last-Event-ID")
    }
}

impl std::error::Error for StreamCut {}

/// Where the pump puts a frame for the body to send: one at a time, both in the connection's
/// task.
#[derive(Clone, Default)]
struct Outbox(Arc<Mutex<Option<Bytes>>>);

impl Outbox {
    /// Hands `frame` to the body, which sends it when the pump next waits: the pump waits here
    /// once, without a waker, and goes on when the body is polled for the next frame.
    async fn send(&self, frame: Bytes) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(frame);
        let mut handed = false;
        std::future::poll_fn(|_| {
            if std::mem::replace(&mut handed, true) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    fn take(&self) -> Option<Bytes> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The SSE body of a stream: its opening frame, then what its pump hands over.
struct Body<F, D: FnOnce(bool)> {
    first: Option<Bytes>,
    /// `None` once the pump has stopped.
    pump: Option<Pin<Box<F>>>,
    outbox: Outbox,
    closing: tokio_util::sync::CancellationToken,
    /// Told whether what the stream followed ended (false: the client left first); not told
    /// when the process closes its streams.
    on_done: Option<D>,
    /// The pump stopped because the process closes its streams: the body ends with
    /// [`StreamCut`] once its last frame is sent.
    cut: bool,
}

// Nothing of the body is pinned in place (the pump is boxed).
impl<F, D: FnOnce(bool)> Unpin for Body<F, D> {}

impl<F: Future<Output = Stopped>, D: FnOnce(bool)> Stream for Body<F, D> {
    type Item = Result<Bytes, StreamCut>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(frame) = this.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        let Some(pump) = this.pump.as_mut() else {
            return Poll::Ready(this.end());
        };
        let polled = pump.as_mut().poll(cx);
        let frame = this.outbox.take();
        if let Poll::Ready(stopped) = polled {
            this.pump = None;
            let on_done = this.on_done.take();
            match (stopped, on_done) {
                (Stopped::Ended, Some(on_done)) => on_done(true),
                (Stopped::Closing, _) => this.cut = true,
                (Stopped::Ended, None) => {}
            }
        }
        match frame {
            Some(frame) => Poll::Ready(Some(Ok(frame))),
            None if this.pump.is_none() => Poll::Ready(this.end()),
            // The pump waits on something that wakes this task.
            None => Poll::Pending,
        }
    }
}

impl<F, D: FnOnce(bool)> Body<F, D> {
    /// What the body yields once its pump has stopped and its frames are sent.
    fn end(&mut self) -> Option<Result<Bytes, StreamCut>> {
        std::mem::take(&mut self.cut).then_some(Err(StreamCut))
    }
}

impl<F, D: FnOnce(bool)> Drop for Body<F, D> {
    fn drop(&mut self) {
        // Dropped while its pump still runs: the client went away (hyper drops the body of a
        // connection that closed), unless the process is closing its streams.
        if self.pump.is_some() && !self.closing.is_cancelled() {
            if let Some(on_done) = self.on_done.take() {
                on_done(false);
            }
        }
    }
}

/// A stream's opening once its first event, if it had one, is the body's first frame: where
/// the stream stands then, if that is known without the log.
enum Opened {
    Log,
    Live(Option<Position>),
}

/// Why a stream's pump stopped. (A client that leaves drops it instead.)
enum Stopped {
    /// What the stream follows ended, or its log cannot be read: the stream is over.
    Ended,
    /// The process is closing its streams: the client resumes elsewhere, and what the stream
    /// followed goes on.
    Closing,
}

/// When a stream's first keepalive is due: at a random point of its first interval, not a whole
/// interval after it opened. Streams opened together (a fleet of clients reconnecting after a
/// restart, a UI opening many threads) would otherwise send theirs together every interval,
/// bursts that other requests queue behind; spread out, 10,000 idle streams are a steady
/// 2,000 comments a second at the default interval.
fn first_heartbeat(keepalive: Duration) -> tokio::time::Instant {
    tokio::time::Instant::now() + keepalive - spindle_execution::random_below(keepalive)
}

/// Feeds the stream until what it follows ends or the process closes its streams. Opening
/// live, the log holds nothing the subscription will not bring, so the first read of the log
/// is skipped.
async fn pump(
    storage: Arc<dyn Storage>,
    mut live: Subscription,
    scope: Scope,
    follow: Follow,
    opening: Opened,
    keepalive: Duration,
    out: Outbox,
) -> Stopped {
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
            return Stopped::Ended;
        }
    };
    let mut heartbeat = tokio::time::interval_at(first_heartbeat(keepalive), keepalive);
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
            catch_up(&storage, &scope, &follow, &mut at, &out).await
        };
        match read {
            Ok(true) => return Stopped::Ended,
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(error = %err, thread_id = %follow.thread_id, "cannot read the event log");
                return Stopped::Ended;
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
                            out.send(frame).await;
                        }
                    }
                    Ok(HubMessage::RunEnded { run_id, .. })
                        if all_live && at.anchored && follow.target.run_id() == Some(run_id) =>
                    {
                        return Stopped::Ended;
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
                _ = heartbeat.tick() => out.send(Bytes::from_static(sse::HEARTBEAT)).await,
                _ = tick(&mut poll) => break,
                // The process is stopping: the client resumes elsewhere.
                () = closing.cancelled() => return Stopped::Closing,
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

/// Sends what the log holds after `at`; answers whether what the stream follows has ended
/// (so every event it will ever have is in the log and has been sent).
async fn catch_up(
    storage: &Arc<dyn Storage>,
    scope: &Scope,
    follow: &Follow,
    at: &mut Position,
    out: &Outbox,
) -> Result<bool, StorageError> {
    // Read the end condition first: if it holds now, the log below is complete.
    let mut ended = ended(storage, scope, follow).await?;
    loop {
        let events = storage
            .read_events(follow.thread_id, at.seq, follow.target.run_id(), PAGE)
            .await?;
        let full = events.len() as i64 == PAGE;
        for event in &events {
            if let Some(frame) = follow.target.frame(event, follow.with_ids) {
                out.send(frame).await;
            }
            // A run that ended between the check above and this read: its end event is the
            // last it logs, and `at` now passes it, so the announcement of that end (its seq,
            // not past `at`) would wake nothing, and the stream would wait forever.
            ended |= follow.target.ends_with(event);
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

    /// A run that ends between the stream's check of its status and its read of the log:
    /// the read passes the run's end event, so the announcement of that end (whose seq is not
    /// past what the stream read) will wake nothing. The end event read is the end; the stream
    /// must not wait for another. (The chaos test found a join stream of a run executed in
    /// another process still open after the run had ended, for good.)
    #[tokio::test]
    async fn a_run_stream_that_reads_its_runs_end_in_the_log_has_ended() {
        use spindle_storage::{IfExists, IfThreadMissing, MultitaskStrategy, NewRun, NewThread};

        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("stream.db").to_string_lossy().into_owned();
        let storage = spindle_storage::connect(&url).await.unwrap();
        let scope = Scope::new("");
        let thread_id = ResourceId::generate();
        let new = NewThread::new(thread_id, Default::default(), IfExists::Raise);
        storage.create_thread(&scope, new).await.unwrap();
        let run = NewRun {
            run_id: Uuid::new_v4(),
            thread_id,
            assistant_id: ResourceId::generate(),
            assistant_read: None,
            kwargs: Default::default(),
            metadata: Default::default(),
            multitask_strategy: MultitaskStrategy::Enqueue,
            run_after: chrono::Utc::now(),
            claim: None,
            if_thread_missing: IfThreadMissing::Reject,
            cron_firing: None,
        };
        let run_id = run.run_id;
        storage.create_run(&scope, run).await.unwrap();
        // The log as it is once the run ended, with the run's row read before that (pending):
        // its events, then its end.
        let logged = |seq, name| LoggedEvent {
            thread_id,
            ..event(run_id, seq, name)
        };
        let events = [
            logged(1, "metadata"),
            logged(2, "values"),
            logged(3, RUN_END_EVENT),
        ];
        storage.append_events(&events).await.unwrap();
        let follow = Follow {
            thread_id,
            target: Target::Run(run_id),
            after: None,
            with_ids: true,
        };
        let mut at = Position {
            seq: 0,
            anchored: false,
        };
        let out = Outbox::default();
        let mut frames = 0;
        let ended = {
            let read = catch_up(&storage, &scope, &follow, &mut at, &out);
            let mut read = std::pin::pin!(read);
            // As the body does: each frame handed over is taken, and the read polled again.
            std::future::poll_fn(|cx| {
                let polled = read.as_mut().poll(cx);
                if out.take().is_some() {
                    frames += 1;
                    cx.waker().wake_by_ref();
                }
                polled
            })
            .await
            .unwrap()
        };
        assert_eq!(frames, 2, "metadata and values; the end marker is not sent");
        assert!(
            storage
                .get_run(&scope, thread_id, run_id)
                .await
                .unwrap()
                .status
                .is_active(),
            "the run's row still reads active, as the stream's first look found it"
        );
        assert!(ended, "the stream read the run's end event and must end");
        assert_eq!(at.seq, 3);
    }

    /// A thread stream on a new SQLite database, with its thread created.
    async fn thread_stream(
        on_done: impl FnOnce(bool) + Send + 'static,
    ) -> (
        Arc<dyn Storage>,
        Arc<EventHub>,
        ResourceId,
        impl Stream<Item = Result<Bytes, StreamCut>>,
        tempfile::TempDir,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("stream.db").to_string_lossy().into_owned();
        let storage = spindle_storage::connect(&url).await.unwrap();
        let thread_id = ResourceId::generate();
        let new = spindle_storage::NewThread::new(
            thread_id,
            Default::default(),
            spindle_storage::IfExists::Raise,
        );
        storage.create_thread(&Scope::new(""), new).await.unwrap();
        let hub = Arc::new(EventHub::default());
        let follow = Follow {
            thread_id,
            target: Target::Thread(ThreadModes {
                run_modes: true,
                ..ThreadModes::default()
            }),
            after: Some(0),
            with_ids: true,
        };
        let body = follow_stream(
            storage.clone(),
            hub.clone(),
            Scope::new(""),
            follow,
            Duration::from_secs(60),
            on_done,
        );
        (storage, hub, thread_id, body, dir)
    }

    /// Whether the body has nothing to send for now.
    async fn waits<S: Stream + Unpin>(body: &mut S) -> bool {
        tokio::time::timeout(Duration::from_millis(50), body.next())
            .await
            .is_err()
    }

    /// A stream whose subscription fell behind (the hub keeps 1024 messages for it) reads the
    /// log instead, and its client gets every event once, in order.
    #[tokio::test]
    async fn a_stream_that_lags_sends_each_event_once_from_the_log() {
        let (storage, hub, thread_id, body, _dir) = thread_stream(|_| {}).await;
        let mut body = std::pin::pin!(body);
        assert!(waits(&mut body).await, "the log is empty");
        let events: Vec<LoggedEvent> = (1..=1500)
            .map(|seq| LoggedEvent {
                thread_id,
                ..event(Uuid::nil(), seq, "values")
            })
            .collect();
        storage.append_events(&events).await.unwrap();
        // Published while the stream is not polled: more than the hub keeps for it.
        for event in events {
            hub.publish(thread_id, HubMessage::Event(Arc::new(event)));
        }
        let mut ids = Vec::new();
        while ids.len() < 1500 {
            let frame = text(body.next().await.map(Result::unwrap)).unwrap();
            let id = frame.lines().find_map(|l| l.strip_prefix("id: ")).unwrap();
            ids.push(id.parse::<i64>().unwrap());
        }
        assert_eq!(ids, (1..=1500).collect::<Vec<_>>());
        assert!(waits(&mut body).await, "nothing more, no duplicate");
    }

    /// The stream's end is told whether what it followed ended: not when its client leaves,
    /// and nothing at all when the process closes its streams (the client resumes elsewhere;
    /// the body ends with an error, so the connection is cut rather than finished).
    #[tokio::test]
    async fn a_stream_tells_its_end_whether_its_client_left() {
        let (told, outcomes) = std::sync::mpsc::channel();
        let (_, _, _, body, _dir) = thread_stream(move |ended| told.send(ended).unwrap()).await;
        let mut body = Box::pin(body);
        assert!(waits(&mut body).await);
        drop(body);
        assert_eq!(outcomes.try_recv(), Ok(false), "the client left");

        let (told, outcomes) = std::sync::mpsc::channel();
        let (_, hub, _, body, _dir) = thread_stream(move |ended| told.send(ended).unwrap()).await;
        let mut body = Box::pin(body);
        assert!(waits(&mut body).await);
        hub.close_streams();
        assert!(
            matches!(body.next().await, Some(Err(StreamCut))),
            "the stream is cut"
        );
        assert!(body.next().await.is_none(), "then ends");
        drop(body);
        assert!(
            outcomes.try_recv().is_err(),
            "closed by the process: not told"
        );
    }

    /// A run's stream that ends with the run tells so once.
    #[tokio::test]
    async fn a_run_stream_that_ends_tells_so_once() {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("stream.db").to_string_lossy().into_owned();
        let storage = spindle_storage::connect(&url).await.unwrap();
        let hub = Arc::new(EventHub::default());
        let (thread_id, run) = (ResourceId::generate(), Uuid::new_v4());
        let follow = Follow {
            thread_id,
            target: Target::Run(run),
            after: None,
            with_ids: true,
        };
        let first = LoggedEvent {
            thread_id,
            ..event(run, 1, "metadata")
        };
        let (told, outcomes) = std::sync::mpsc::channel();
        let live = hub.subscribe(thread_id);
        let body = follow_new_run(
            storage,
            live,
            Scope::new(""),
            follow,
            Some(&first),
            Duration::from_secs(60),
            move |ended| told.send(ended).unwrap(),
        );
        let mut body = Box::pin(body);
        assert!(body.next().await.is_some(), "the run's first event");
        assert!(waits(&mut body).await);
        let ended = HubMessage::RunEnded {
            run_id: run,
            status: spindle_storage::RunStatus::Success,
            ended: None,
        };
        hub.publish(thread_id, ended);
        assert!(body.next().await.is_none());
        drop(body);
        assert_eq!(outcomes.try_iter().collect::<Vec<_>>(), [true]);
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

    /// Every stream's first keepalive falls within its first interval, and streams opened
    /// together have theirs spread over the whole interval, not bunched at its end.
    #[test]
    fn first_keepalives_spread_over_the_interval() {
        let interval = Duration::from_secs(10);
        let opened = tokio::time::Instant::now();
        let offsets: Vec<Duration> = (0..1000)
            .map(|_| first_heartbeat(interval) - opened)
            .collect();
        assert!(offsets
            .iter()
            .all(|o| *o > Duration::ZERO && *o <= interval + Duration::from_secs(1)));
        for tenth in 0..10 {
            let (from, to) = (interval * tenth / 10, interval * (tenth + 1) / 10);
            let within = offsets.iter().filter(|o| **o >= from && **o < to).count();
            assert!(
                within > 50,
                "{within} of 1000 first keepalives in tenth {tenth}"
            );
        }
    }
}
