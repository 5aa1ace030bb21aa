//! Event log retention: events of ended runs older than the retention period are removed,
//! a bounded batch at a time, so the log does not grow without limit. Seqs are counted on the
//! thread, so a removed event's seq is never reused; a client resuming from before the
//! retention window simply gets what is left.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use spindle_storage::Storage;
use tokio_util::sync::CancellationToken;

/// Events removed per statement: short transactions that never hold the writer for long.
const BATCH: i64 = 5_000;

/// Sweeps until `shutdown`: at start, then every `every`.
pub async fn sweep_events(
    storage: Arc<dyn Storage>,
    retention: Duration,
    every: Duration,
    shutdown: CancellationToken,
) {
    let Ok(retention) = chrono::Duration::from_std(retention) else {
        tracing::warn!("event retention is too long to compute; events are kept");
        return;
    };
    loop {
        let cutoff = Utc::now() - retention;
        let mut removed = 0;
        loop {
            match storage.prune_events(cutoff, BATCH).await {
                Ok(n) => {
                    removed += n;
                    if n < BATCH as u64 {
                        break;
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot prune the event log; retrying later");
                    break;
                }
            }
        }
        if removed > 0 {
            tracing::info!(removed, %cutoff, "pruned run events past their retention");
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = shutdown.cancelled() => return,
        }
    }
}
