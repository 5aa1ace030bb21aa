//! Thread expiry: a task that applies each thread's TTL (its own, or the server's default for
//! threads without one) every `sweep_every`, a bounded batch per transaction, so expired
//! threads go (`delete`) or shrink to their latest checkpoint (`keep_latest`) without a client
//! asking. Threads with a pending or running run are left for a later sweep.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use spindle_storage::thread_state::SWEEP_BATCH;
use spindle_storage::{Storage, SweepOutcome, ThreadTtl};
use tokio_util::sync::CancellationToken;

/// Thread TTL settings.
#[derive(Debug, Clone, Copy)]
pub struct ThreadTtlConfig {
    /// Applied to threads without a TTL of their own, counted from their last update.
    pub default: Option<ThreadTtl>,
    /// How often expired threads are looked for.
    pub sweep_every: Duration,
}

impl Default for ThreadTtlConfig {
    fn default() -> Self {
        Self {
            default: None,
            sweep_every: Duration::from_secs(300),
        }
    }
}

/// Sweeps until `shutdown`: at start, then every `config.sweep_every`.
pub async fn sweep_threads(
    storage: Arc<dyn Storage>,
    config: ThreadTtlConfig,
    shutdown: CancellationToken,
) {
    loop {
        let swept = sweep_once(storage.as_ref(), config.default).await;
        if swept != SweepOutcome::default() {
            tracing::info!(
                deleted = swept.deleted,
                trimmed = swept.trimmed,
                "applied thread TTLs"
            );
        }
        tokio::select! {
            () = tokio::time::sleep(config.sweep_every) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// One sweep: batches until a batch comes back short.
pub async fn sweep_once(storage: &dyn Storage, default: Option<ThreadTtl>) -> SweepOutcome {
    let mut total = SweepOutcome::default();
    loop {
        match storage
            .sweep_expired_threads(Utc::now(), default, SWEEP_BATCH)
            .await
        {
            Ok(batch) => {
                total.deleted += batch.deleted;
                total.trimmed += batch.trimmed;
                if batch.deleted + batch.trimmed < SWEEP_BATCH as u64 {
                    return total;
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot sweep expired threads; retrying later");
                return total;
            }
        }
    }
}
