//! Spindle's storage boundary: traits the server calls, and their two backends.
//!
//! Every method takes the caller's [`Scope`] (or an [`Owner`] for creations), and every method
//! that changes state is one database transaction. The backends are [`sqlite::SqliteStorage`]
//! (embedded, the default for `spindle dev`) and [`postgres::PostgresStorage`] (for several
//! server processes sharing one database). [`connect`] picks one from a database URL.
//! [`Storage::checkpointer`] gives the graph engine's checkpointer over the same database
//! ([`checkpoints`]).

mod assistant_cache;
pub mod checkpoints;
pub mod crons;
mod error;
mod id;
mod json_filter;
pub use json_filter::{
    contains as json_contains, filter_depth, filter_values, MAX_FILTER_DEPTH, MAX_FILTER_VALUES,
};
pub mod model;
mod pg_creator;
mod pg_notify;
mod pg_pool;
mod pg_writer;
pub mod postgres;
mod rows;
pub mod runs;
mod schema;
pub mod sqlite;
mod sqlite_notices;
mod sqlite_reader;
mod sqlite_values;
mod sqlite_wal_io;
mod sqlite_writer;
pub mod store;
#[cfg(feature = "test-util")]
pub mod test_util;
pub mod thread_state;

use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

pub use checkpoints::LoggedSave;
pub use crons::{
    Cron, CronFields, CronFilter, CronFiring, CronSearch, CronSortBy, CronStore, FiringId, NewCron,
    OnRunCompleted, FIRING_LEASE,
};
pub use error::{StorageError, StorageResult};
pub use id::{InvalidId, ResourceId};
pub use model::*;
pub use runs::start_event_data;
pub use runs::{
    CancelAction, Claim, ClaimStart, ClaimedRun, CreatedRun, IfThreadMissing, LoggedEvent,
    MultitaskStrategy, NewRun, QueueOutlook, Run, RunEnd, RunFilter, RunStatus, RunStore,
    INHERITED_METADATA, RUN_END_EVENT, UNLOGGED_EVENTS_MAX,
};
/// Re-exported so the server can classify database failures without depending on sqlx.
pub use sqlx::Error as SqlxError;
pub use store::{
    FilterCondition, FilterOp, ItemSearch, ItemStore, ItemVector, NamespaceSearch, PutItem,
    StoreItem,
};

/// Assistants and their versions.
#[async_trait]
pub trait AssistantStore: Send + Sync {
    /// Creates an assistant at version 1. With [`IfExists::DoNothing`] an existing assistant of
    /// the same id is returned unchanged; with [`IfExists::Raise`] it is a conflict.
    async fn create_assistant(
        &self,
        owner: Owner<'_>,
        new: NewAssistant,
    ) -> StorageResult<Assistant>;
    async fn get_assistant(&self, scope: &Scope, id: ResourceId) -> StorageResult<Assistant>;
    /// The assistant a run is about to be created for: [`AssistantStore::get_assistant`], or
    /// a copy this process read before (PostgreSQL keeps them, saving a query per run). A copy
    /// may be out of date, so the run names what it was made from ([`NewRun::assistant_read`])
    /// and its creation is refused with [`StorageError::AssistantChanged`] when that no longer
    /// holds; the caller then asks again and gets the assistant as stored.
    async fn assistant_for_run(&self, scope: &Scope, id: ResourceId) -> StorageResult<Assistant> {
        self.get_assistant(scope, id).await
    }
    /// Writes a new version (max + 1) from the current one and makes it current.
    async fn update_assistant(
        &self,
        scope: &Scope,
        id: ResourceId,
        patch: AssistantPatch,
    ) -> StorageResult<Assistant>;
    /// Deletes an assistant, its versions, crons and runs, in one transaction. Its active
    /// runs are stopped (pending ones go, running ones go and are returned, for the caller to
    /// signal their workers) and their threads released. Threads stay, with their state,
    /// unless `delete_threads`: then the caller's threads whose metadata names the assistant
    /// go too (as the reference's `?delete_threads=true`), and their running runs are returned.
    async fn delete_assistant(
        &self,
        scope: &Scope,
        id: ResourceId,
        delete_threads: bool,
    ) -> StorageResult<Vec<Uuid>>;
    async fn search_assistants(
        &self,
        scope: &Scope,
        search: AssistantSearch,
    ) -> StorageResult<Paged<Assistant>>;
    async fn count_assistants(&self, scope: &Scope, filter: AssistantFilter) -> StorageResult<i64>;
    /// Versions, newest first, optionally filtered by metadata containment.
    async fn list_assistant_versions(
        &self,
        scope: &Scope,
        id: ResourceId,
        metadata: Option<JsonObject>,
        page: Page,
    ) -> StorageResult<Vec<AssistantVersion>>;
    /// Pins `version` as the one runs use.
    async fn set_latest_assistant_version(
        &self,
        scope: &Scope,
        id: ResourceId,
        version: i64,
    ) -> StorageResult<Assistant>;
}

/// Threads and their metadata.
#[async_trait]
pub trait ThreadStore: Send + Sync {
    /// Creates an idle thread. With [`IfExists::DoNothing`] an existing thread of the same id is
    /// returned unchanged; with [`IfExists::Raise`] it is a conflict.
    async fn create_thread(&self, scope: &Scope, new: NewThread) -> StorageResult<Thread>;
    async fn get_thread(&self, scope: &Scope, id: ResourceId) -> StorageResult<Thread>;
    /// Merges `metadata` key by key into the thread's metadata.
    async fn update_thread(
        &self,
        scope: &Scope,
        id: ResourceId,
        metadata: JsonObject,
    ) -> StorageResult<Thread> {
        let patch = ThreadPatch {
            metadata,
            ttl: None,
        };
        self.patch_thread(scope, id, patch).await
    }
    /// Merges the patch's metadata and, when given, replaces the thread's TTL (counted from
    /// now), in one transaction.
    async fn patch_thread(
        &self,
        scope: &Scope,
        id: ResourceId,
        patch: ThreadPatch,
    ) -> StorageResult<Thread>;
    /// A state edit: in one transaction, saves `write`'s checkpoints, sets the thread's
    /// status, values and interrupts from it (clearing its error), and appends `event` to the
    /// thread's event log. `Conflict` while a run of the thread is pending or running.
    async fn write_thread_state(
        &self,
        scope: &Scope,
        id: ResourceId,
        write: StateWrite,
        event: Option<ThreadEvent>,
    ) -> StorageResult<StateWritten>;
    /// Prunes the caller's threads among `ids` (others are skipped): `Delete` removes them
    /// with their runs, events and checkpoints; `KeepLatest` keeps only the latest checkpoint
    /// of each namespace (skipping a thread with an active run). Returns how many were pruned.
    async fn prune_threads(
        &self,
        scope: &Scope,
        ids: &[ResourceId],
        strategy: TtlStrategy,
    ) -> StorageResult<u64>;
    /// Applies the TTL of up to `limit` expired threads that have no active run, of every
    /// user: a thread's own TTL once its `expires_at` passed; `default` for threads without
    /// one, once they were not updated for that long. One transaction.
    async fn sweep_expired_threads(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        default: Option<ThreadTtl>,
        limit: i64,
    ) -> StorageResult<SweepOutcome>;
    async fn delete_thread(&self, scope: &Scope, id: ResourceId) -> StorageResult<()>;
    async fn search_threads(
        &self,
        scope: &Scope,
        search: ThreadSearch,
    ) -> StorageResult<Paged<Thread>>;
    async fn count_threads(&self, scope: &Scope, filter: ThreadFilter) -> StorageResult<i64>;
    /// Copies a thread to a new idle thread, in one transaction: its metadata (which names its
    /// graph), config, values and every checkpoint, pending write and blob of its history, in
    /// SQL. Its runs and events are not copied (as the reference).
    async fn copy_thread(
        &self,
        scope: &Scope,
        id: ResourceId,
        new_id: ResourceId,
    ) -> StorageResult<Thread>;
}

/// Everything the server needs from a database.
///
/// The server times every call of these traits through `spindle_execution::metrics::
/// MeteredStorage`, which forwards each method, defaulted ones included: a method added here
/// (or to a store trait) is added there too.
#[async_trait]
pub trait Storage: AssistantStore + ThreadStore + RunStore + ItemStore + CronStore {
    /// Which backend this is, for logs and `/info`.
    fn backend(&self) -> Backend;
    /// Answers whether the database can serve a query right now (for `/ready`).
    async fn ping(&self) -> StorageResult<()>;
    /// The graph engine's checkpointer over this database, sharing its connections.
    fn checkpointer(&self) -> Arc<dyn spindle_graph::checkpoint::Checkpointer>;
    /// Stores a run's save and the events it carries in one transaction (see [`LoggedSave`]):
    /// if either fails, neither is stored.
    async fn save_logged(
        &self,
        save: LoggedSave,
    ) -> Result<(), spindle_graph::checkpoint::CheckpointError>;
    /// As [`Storage::save_logged`], queued: both backends' writers apply a thread's writes in
    /// the order they come (as [`Checkpointer::queue`]), so the save is queued before this
    /// returns, and the receipt resolves once it is committed.
    ///
    /// [`Checkpointer::queue`]: spindle_graph::checkpoint::Checkpointer::queue
    fn queue_logged(&self, save: LoggedSave) -> spindle_graph::checkpoint::WriteReceipt;
    /// Queues events for their threads' logs, as [`RunStore::append_events`] appends them,
    /// behind the writes queued before (both backends' writers apply a thread's writes in
    /// order); the receipt resolves once they are committed. Queued before this returns.
    fn queue_events(&self, events: Vec<LoggedEvent>) -> EventsReceipt;
    /// What commits on this database that this process may wait for, as it happens: other
    /// processes' (PostgreSQL's `LISTEN`/`NOTIFY`), or, where one process has the database to
    /// itself (SQLite), its own that nothing else tells its streams and workers of
    /// (`sqlite_notices`). Called once, at start-up: a second caller gets `None`; a storage
    /// that gives none is polled.
    fn wakeups(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Wakeup>> {
        None
    }
    /// How many runs wait in the queue and how many execute, in every process (for
    /// `/metrics`: one count over an index).
    async fn count_queued_runs(&self) -> StorageResult<QueuedRuns>;
    /// The connection pools and the write queue as they are now (for `/metrics`; no query).
    fn pool_stats(&self) -> PoolStats;
}

/// The commit of events queued with [`Storage::queue_events`].
pub type EventsReceipt =
    std::pin::Pin<Box<dyn std::future::Future<Output = StorageResult<()>> + Send + 'static>>;

/// Something another process committed (see [`Storage::wakeups`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wakeup {
    /// The thread's event log grew to `seq`.
    Logged { thread_id: ResourceId, seq: i64 },
    /// A run may be claimable: one was created pending, or its thread's active run ended.
    RunsQueued,
    /// A running run is to be cancelled (its flag is set).
    Cancel { run_id: uuid::Uuid },
    /// Crons were created, changed or deleted.
    CronsChanged,
    /// Notifications may have been lost (the listening connection dropped): look again.
    Resync,
}

/// Runs of every process by queue status, as [`Storage::count_queued_runs`] counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueuedRuns {
    pub pending: i64,
    pub running: i64,
}

/// The database connections of this process, as [`Storage::pool_stats`] sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub pools: Vec<ConnectionPool>,
    /// Writes handed to SQLite's writer thread and not answered yet (queued, or in the
    /// transaction it is committing); `None` on PostgreSQL, which has no such queue.
    pub writer_queue: Option<usize>,
}

/// One connection pool: its name (`main` and `creation` on PostgreSQL; `read` and `write` on
/// SQLite), the connections it holds open, those of them idle, and the most it opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionPool {
    pub name: &'static str,
    pub open: u32,
    pub idle: u32,
    pub max: u32,
}

impl ConnectionPool {
    /// A sqlx pool now.
    pub(crate) fn of<DB: sqlx::Database>(name: &'static str, pool: &sqlx::Pool<DB>) -> Self {
        Self {
            name,
            open: pool.size(),
            idle: u32::try_from(pool.num_idle()).unwrap_or(u32::MAX),
            max: pool.options().get_max_connections(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Where a database URL points: PostgreSQL for `postgres://` and `postgresql://`, else SQLite
/// (a `sqlite:` URL or a plain file path).
pub fn backend_of(url: &str) -> Backend {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Backend::Postgres
    } else {
        Backend::Sqlite
    }
}

/// How a process uses its database, where the defaults do not fit.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// PostgreSQL: the tasks that group runs' writes into shared transactions, each on a
    /// connection of its own; `None`: [`default_pg_writers`]. Ignored on SQLite, whose one
    /// writer is the database's own rule.
    pub pg_writers: Option<usize>,
}

pub use pg_writer::default_writer_count as default_pg_writers;

/// Opens the database at `url` and brings its schema up to date.
pub async fn connect(url: &str) -> StorageResult<Arc<dyn Storage>> {
    connect_with(url, &ConnectOptions::default()).await
}

/// [`connect`] with `options`.
pub async fn connect_with(url: &str, options: &ConnectOptions) -> StorageResult<Arc<dyn Storage>> {
    Ok(match backend_of(url) {
        Backend::Postgres => {
            let writers = options.pg_writers.unwrap_or_else(default_pg_writers);
            Arc::new(postgres::PostgresStorage::connect(url, writers).await?)
        }
        Backend::Sqlite => Arc::new(sqlite::SqliteStorage::open(url).await?),
    })
}

/// Applies pending schema migrations to the database at `url` and returns how many ran.
pub async fn migrate(url: &str) -> StorageResult<usize> {
    match backend_of(url) {
        Backend::Postgres => postgres::PostgresStorage::migrate_only(url).await,
        Backend::Sqlite => sqlite::SqliteStorage::migrate_only(url).await,
    }
}
