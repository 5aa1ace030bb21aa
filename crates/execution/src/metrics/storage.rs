//! Timing every storage call: [`MeteredStorage`] wraps the process's storage and forwards
//! each method of its traits, recording the call's latency (and whether it failed) under the
//! method's name.
//!
//! Why a wrapper at the trait boundary: it is the one place every storage call passes, on
//! both backends, whatever runs it underneath (SQLite's writer thread, its point reads, its
//! sqlx read pool; PostgreSQL's pool), and it measures what callers wait for, queueing
//! included. Timing inside the backends would mean an edit at each of their ~70 methods per
//! backend; sqlx's statement logging sees neither SQLite's writer nor its point reads, and
//! costs a formatted string per statement. The cost here is a clock read before and after a
//! call and three atomic additions.
//!
//! Each method is forwarded, defaulted ones included (a default here would replace the
//! backend's own: `queue_logged` would stop queuing); the compiler asks for a new required
//! method, and a new defaulted one must be added by hand. The engine's checkpointer
//! (`checkpointer()`) is the backend's own and is not timed; a run's saves go through
//! `save_logged`/`queue_logged`, which are.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use spindle_graph::checkpoint::{CheckpointError, Checkpointer, WriteReceipt};
use spindle_storage::crons::NextRun;
use spindle_storage::*;
use uuid::Uuid;

use super::Metrics;

/// The storage, with every call timed into [`Metrics`].
pub struct MeteredStorage {
    inner: Arc<dyn Storage>,
    metrics: Arc<Metrics>,
}

impl MeteredStorage {
    pub fn wrap(inner: Arc<dyn Storage>, metrics: Arc<Metrics>) -> Arc<dyn Storage> {
        Arc::new(Self { inner, metrics })
    }
}

/// Awaits `call` and records how long it took under `op`.
async fn timed<T, E>(
    metrics: &Metrics,
    op: &'static str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let started = Instant::now();
    let result = call.await;
    metrics.storage_call(op, started.elapsed(), result.is_err());
    result
}

/// Forwards the listed async methods of `$trait`, each timed under its own name.
macro_rules! forward {
    ($trait:ident { $(fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)* }) => {
        #[async_trait]
        impl $trait for MeteredStorage {
            $(
                async fn $name(&self $(, $arg: $ty)*) -> StorageResult<$ret> {
                    timed(&self.metrics, stringify!($name), self.inner.$name($($arg),*)).await
                }
            )*
        }
    };
}

forward!(AssistantStore {
    fn create_assistant(&self, owner: Owner<'_>, new: NewAssistant) -> Assistant;
    fn get_assistant(&self, scope: &Scope, id: ResourceId) -> Assistant;
    fn assistant_for_run(&self, scope: &Scope, id: ResourceId) -> Assistant;
    fn update_assistant(&self, scope: &Scope, id: ResourceId, patch: AssistantPatch) -> Assistant;
    fn delete_assistant(&self, scope: &Scope, id: ResourceId, delete_threads: bool) -> Vec<Uuid>;
    fn search_assistants(&self, scope: &Scope, search: AssistantSearch) -> Paged<Assistant>;
    fn count_assistants(&self, scope: &Scope, filter: AssistantFilter) -> i64;
    fn list_assistant_versions(
        &self,
        scope: &Scope,
        id: ResourceId,
        metadata: Option<JsonObject>,
        page: Page
    ) -> Vec<AssistantVersion>;
    fn set_latest_assistant_version(&self, scope: &Scope, id: ResourceId, version: i64) -> Assistant;
});

forward!(ThreadStore {
    fn create_thread(&self, scope: &Scope, new: NewThread) -> Thread;
    fn get_thread(&self, scope: &Scope, id: ResourceId) -> Thread;
    fn update_thread(&self, scope: &Scope, id: ResourceId, metadata: JsonObject) -> Thread;
    fn patch_thread(&self, scope: &Scope, id: ResourceId, patch: ThreadPatch) -> Thread;
    fn write_thread_state(
        &self,
        scope: &Scope,
        id: ResourceId,
        write: StateWrite,
        event: Option<ThreadEvent>
    ) -> StateWritten;
    fn prune_threads(&self, scope: &Scope, ids: &[ResourceId], strategy: TtlStrategy) -> u64;
    fn sweep_expired_threads(
        &self,
        now: DateTime<Utc>,
        default: Option<ThreadTtl>,
        limit: i64
    ) -> SweepOutcome;
    fn delete_thread(&self, scope: &Scope, id: ResourceId) -> ();
    fn search_threads(&self, scope: &Scope, search: ThreadSearch) -> Paged<Thread>;
    fn count_threads(&self, scope: &Scope, filter: ThreadFilter) -> i64;
    fn copy_thread(&self, scope: &Scope, id: ResourceId, new_id: ResourceId) -> Thread;
});

forward!(RunStore {
    fn create_run(&self, scope: &Scope, new: NewRun) -> CreatedRun;
    fn get_run(&self, scope: &Scope, thread_id: ResourceId, run_id: Uuid) -> Run;
    fn list_runs(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        filter: RunFilter,
        page: Page
    ) -> Vec<Run>;
    fn delete_run(&self, scope: &Scope, thread_id: ResourceId, run_id: Uuid) -> ();
    fn cancel_runs(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        run_ids: &[Uuid],
        action: CancelAction
    ) -> Vec<Uuid>;
    fn claim_run(
        &self,
        worker_id: &str,
        lease: std::time::Duration,
        max_attempts: i32
    ) -> Option<ClaimedRun>;
    fn has_claimable_run(&self) -> bool;
    fn hand_back_run(&self, run_id: Uuid, worker_id: &str) -> ();
    fn queue_outlook(&self) -> spindle_storage::QueueOutlook;
    fn renew_lease(
        &self,
        run_id: Uuid,
        worker_id: &str,
        lease: std::time::Duration
    ) -> Option<Run>;
    fn finish_run(
        &self,
        thread_id: ResourceId,
        run_id: Uuid,
        worker_id: &str,
        end: RunEnd
    ) -> Option<Run>;
    fn append_events(&self, events: &[LoggedEvent]) -> ();
    fn read_events(
        &self,
        thread_id: ResourceId,
        after: i64,
        run_id: Option<Uuid>,
        limit: i64
    ) -> Vec<LoggedEvent>;
    fn last_event_seq(&self, thread_id: ResourceId) -> i64;
    fn find_run(&self, scope: &Scope, run_id: Uuid) -> Run;
    fn prune_events(&self, before: DateTime<Utc>, limit: i64) -> u64;
    fn active_runs(&self, scope: &Scope, status: Option<RunStatus>) -> Vec<(ResourceId, Uuid)>;
});

forward!(ItemStore {
    fn put_item(&self, scope: &Scope, put: PutItem) -> ();
    fn get_item(&self, scope: &Scope, namespace: &[String], key: &str, refresh_ttl: bool) -> StoreItem;
    fn delete_item(&self, scope: &Scope, namespace: &[String], key: &str) -> ();
    fn search_items(&self, scope: &Scope, search: ItemSearch) -> Vec<StoreItem>;
    fn list_namespaces(&self, scope: &Scope, search: NamespaceSearch) -> Vec<Vec<String>>;
    fn sweep_expired_items(&self, now: DateTime<Utc>, limit: i64) -> u64;
});

forward!(CronStore {
    fn create_cron(&self, scope: &Scope, new: NewCron) -> Cron;
    fn get_cron(&self, scope: &Scope, id: Uuid) -> Cron;
    fn update_cron(&self, scope: &Scope, id: Uuid, fields: CronFields) -> Cron;
    fn delete_cron(&self, scope: &Scope, id: Uuid) -> ();
    fn search_crons(&self, scope: &Scope, search: CronSearch) -> Vec<Cron>;
    fn count_crons(&self, scope: &Scope, filter: CronFilter) -> i64;
    fn next_cron_due(&self) -> Option<DateTime<Utc>>;
    fn claim_due_crons(&self, now: DateTime<Utc>, limit: i64, next: &NextRun) -> Vec<CronFiring>;
    fn release_cron_firing(&self, firing: FiringId) -> ();
});

#[async_trait]
impl Storage for MeteredStorage {
    fn backend(&self) -> Backend {
        self.inner.backend()
    }

    async fn ping(&self) -> StorageResult<()> {
        timed(&self.metrics, "ping", self.inner.ping()).await
    }

    fn checkpointer(&self) -> Arc<dyn Checkpointer> {
        self.inner.checkpointer()
    }

    async fn save_logged(&self, save: LoggedSave) -> Result<(), CheckpointError> {
        timed(&self.metrics, "save_logged", self.inner.save_logged(save)).await
    }

    /// Timed from the call to the save's commit, when its receipt resolves.
    fn queue_logged(&self, save: LoggedSave) -> WriteReceipt {
        let started = Instant::now();
        let receipt = self.inner.queue_logged(save);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let saved = receipt.await;
            metrics.storage_call("queue_logged", started.elapsed(), saved.is_err());
            saved
        })
    }

    /// Timed from the call to the events' commit, when their receipt resolves.
    fn queue_events(&self, events: Vec<LoggedEvent>) -> spindle_storage::EventsReceipt {
        let started = Instant::now();
        let receipt = self.inner.queue_events(events);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let logged = receipt.await;
            metrics.storage_call("queue_events", started.elapsed(), logged.is_err());
            logged
        })
    }

    fn wakeups(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<spindle_storage::Wakeup>> {
        self.inner.wakeups()
    }

    async fn count_queued_runs(&self) -> StorageResult<QueuedRuns> {
        timed(
            &self.metrics,
            "count_queued_runs",
            self.inner.count_queued_runs(),
        )
        .await
    }

    fn pool_stats(&self) -> PoolStats {
        self.inner.pool_stats()
    }
}
