//! Streaming a run (or every run of a thread) to a client: subscribe first, replay the log
//! second, then forward live events, so a client resuming after `Last-Event-ID` sees no gap and
//! no duplicate. The stream ends when the run ends.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use spindle_storage::{LoggedEvent, RunStatus, Scope, Storage};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::hub::{EventHub, HubMessage};
use crate::sse;

/// How often a stream re-reads the log in case the run executes in another process.
const POLL: Duration = Duration::from_millis(250);
/// Events read from the log per query.
const PAGE: i64 = 500;

/// What a stream follows.
#[derive(Clone, Copy)]
pub struct Follow {
    pub thread_id: Uuid,
    pub run_id: Uuid,
    /// Send events with seq greater than this (`Last-Event-ID`); `-1`/`0` replays all.
    pub after: i64,
    /// Put `id:` lines on frames (resumable streams).
    pub with_ids: bool,
}

/// The SSE body of a run. `on_done` runs when the stream stops, told whether the run had
/// ended (false: the client went away first).
pub fn run_stream(
    storage: Arc<dyn Storage>,
    hub: Arc<EventHub>,
    scope: Scope,
    follow: Follow,
    keepalive: Duration,
    on_done: impl FnOnce(bool) + Send + 'static,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let mut live = hub.subscribe(follow.thread_id);
    tokio::spawn(async move {
        let mut sent = follow.after.max(0);
        let mut ended = false;
        let mut heartbeat = tokio::time::interval(keepalive);
        heartbeat.tick().await;
        let mut poll = tokio::time::interval(POLL);
        loop {
            // Catch up from the log: the first time, after a lag, and on every poll tick.
            match catch_up(&storage, &scope, follow, &mut sent, &tx).await {
                Ok(status) if !status.is_active() => {
                    ended = true;
                }
                Ok(_) => {}
                Err(CatchUp::ClientGone) => break,
                Err(CatchUp::Failed(err)) => {
                    tracing::warn!(error = %err, run_id = %follow.run_id, "cannot read the run's events");
                    ended = true;
                }
            }
            if ended {
                break;
            }
            let gone = loop {
                tokio::select! {
                    message = live.recv() => match message {
                        Ok(HubMessage::Event(event)) if event.run_id == follow.run_id && event.seq > sent => {
                            if send(&tx, &event, follow.with_ids).await.is_err() {
                                break true;
                            }
                            sent = event.seq;
                        }
                        Ok(HubMessage::RunEnded { run_id, .. }) if run_id == follow.run_id => break false,
                        Ok(_) => {}
                        // Fell behind or the hub went away: the log has everything.
                        Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => break false,
                    },
                    _ = heartbeat.tick() => {
                        if tx.send(Bytes::from_static(sse::HEARTBEAT)).await.is_err() {
                            break true;
                        }
                    }
                    _ = poll.tick() => break false,
                    () = tx.closed() => break true,
                }
            };
            if gone {
                break;
            }
        }
        on_done(ended);
    });
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) },
    )
}

enum CatchUp {
    ClientGone,
    Failed(String),
}

/// Sends what the log holds after `sent`; returns the run's status as of after the read.
async fn catch_up(
    storage: &Arc<dyn Storage>,
    scope: &Scope,
    follow: Follow,
    sent: &mut i64,
    tx: &mpsc::Sender<Bytes>,
) -> Result<RunStatus, CatchUp> {
    // Status first: if the run had ended, every event it wrote is in the log already.
    let status = match storage
        .get_run(scope, follow.thread_id, follow.run_id)
        .await
    {
        Ok(run) => run.status,
        // Deleted (rollback, or the thread was deleted): nothing more will come.
        Err(spindle_storage::StorageError::NotFound(_)) => RunStatus::Interrupted,
        Err(err) => return Err(CatchUp::Failed(err.to_string())),
    };
    loop {
        let events = storage
            .read_events(follow.thread_id, *sent, Some(follow.run_id), PAGE)
            .await
            .map_err(|e| CatchUp::Failed(e.to_string()))?;
        let full = events.len() as i64 == PAGE;
        for event in &events {
            send(tx, event, follow.with_ids)
                .await
                .map_err(|()| CatchUp::ClientGone)?;
            *sent = event.seq;
        }
        if !full {
            return Ok(status);
        }
    }
}

async fn send(tx: &mpsc::Sender<Bytes>, event: &LoggedEvent, with_ids: bool) -> Result<(), ()> {
    let frame = sse::json_frame(&event.event, &event.data, with_ids.then_some(event.seq));
    tx.send(frame).await.map_err(|_| ())
}
