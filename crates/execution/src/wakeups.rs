//! What other processes on the database commit, delivered to whoever waits for it here:
//! streams (a thread's log grew), worker loops (a run to claim), running runs (a cancel) and
//! the cron scheduler (a cron changed). The storage says what happened
//! ([`Storage::wakeups`](spindle_storage::Storage::wakeups): PostgreSQL's `LISTEN`/`NOTIFY`),
//! so nothing here polls the database.

use std::sync::Arc;

use spindle_storage::Wakeup;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use crate::crons::Scheduler;
use crate::hub::{EventHub, HubMessage};
use crate::worker::RunWorkers;

/// Tells the hub, the workers and the cron scheduler that commits are announced (so they
/// stop polling from now on, before any of them first waits) and hands each wake-up to its
/// waiter until `shutdown`.
pub fn start(
    wakeups: UnboundedReceiver<Wakeup>,
    hub: Arc<EventHub>,
    workers: Arc<RunWorkers>,
    crons: Arc<Scheduler>,
    shutdown: CancellationToken,
) {
    hub.set_announced();
    workers.set_announced(shutdown.clone());
    crons.set_announced();
    tokio::spawn(deliver(wakeups, hub, workers, crons, shutdown));
}

async fn deliver(
    mut wakeups: UnboundedReceiver<Wakeup>,
    hub: Arc<EventHub>,
    workers: Arc<RunWorkers>,
    crons: Arc<Scheduler>,
    shutdown: CancellationToken,
) {
    loop {
        let wakeup = tokio::select! {
            wakeup = wakeups.recv() => wakeup,
            () = shutdown.cancelled() => return,
        };
        let Some(wakeup) = wakeup else {
            tracing::error!("the database's notifications stopped; streams and workers of other processes are no longer seen");
            return;
        };
        match wakeup {
            Wakeup::Logged { thread_id, seq } => hub.publish(thread_id, HubMessage::Logged { seq }),
            Wakeup::RunsQueued => workers.wake(),
            Wakeup::Cancel { run_id } => workers.cancel_local(&[run_id]),
            Wakeup::CronsChanged => crons.wake(),
            Wakeup::Resync => {
                hub.publish_all(HubMessage::Logged { seq: i64::MAX });
                workers.wake();
                crons.wake();
            }
        }
    }
}
