//! The embedded backend: one SQLite file in WAL mode.
//!
//! SQLite allows one writer at a time. Rather than letting several connections race for the
//! write lock (and sleep in the busy handler), writes queue in memory for the writer thread
//! (`sqlite_writer`), which runs each as a closure and commits them in groups. Point reads run
//! on the caller's thread (`sqlite_reader`); searches and history pages use a read-only sqlx
//! pool.

use crate::ResourceId;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use rusqlite::OptionalExtension;
use serde_json::Value;
use spindle_graph::checkpoint::{CheckpointError, Checkpointer, WriteReceipt};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::types::Json;
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use crate::checkpoints::{copy_checkpoints_sqlite, SqliteCheckpointer};
use crate::error::sqlite_conflict_if_taken;
use crate::json_filter::{push_sqlite_condition, push_sqlite_contains};
use crate::model::*;
use crate::rows::{
    AssistantRow, AssistantVersionRow, ThreadRow, ASSISTANT_COLUMNS, THREAD_COLUMNS,
    VERSION_COLUMNS,
};
use crate::sqlite_notices::{notice_logged, Notices};
use crate::sqlite_reader::Readers;
use crate::sqlite_values::{id, json, ts, RowExt};
use crate::sqlite_writer::{WritePermit, Writer};
use crate::store::sqlite_nearest::NearestIndexes;
use crate::{
    thread_state, AssistantStore, Backend, LoggedSave, Storage, StorageError, StorageResult,
    ThreadStore,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

pub struct SqliteStorage {
    pub(crate) read: SqlitePool,
    /// Point reads on the caller's thread (`sqlite_reader`).
    pub(crate) readers: Arc<Readers>,
    /// Runs writes, as closures, on the one write connection (`sqlite_writer`).
    pub(crate) writer: Arc<Writer>,
    /// For writes not yet moved to the writer thread; used only under a [`Writer::permit`].
    write: SqlitePool,
    /// The store's nearest-neighbour indexes known to exist (`store::sqlite_nearest`).
    pub(crate) nearest: NearestIndexes,
    /// Queues runs' saves with their events ([`Storage::queue_logged`]); one for the process,
    /// so a thread's queued saves join one batch whichever worker queued them.
    logged: SqliteCheckpointer,
    /// What the writer's commits wake in this process ([`Storage::wakeups`]).
    notices: Arc<Notices>,
}

/// Accepts `sqlite://path`, `sqlite:path` and a plain file path.
fn connect_options(url: &str) -> StorageResult<SqliteConnectOptions> {
    let options = if url.starts_with("sqlite:") {
        SqliteConnectOptions::from_str(url)?
    } else {
        SqliteConnectOptions::new().filename(url)
    };
    Ok(options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // In WAL mode NORMAL loses nothing when the process crashes; only a power loss can
        // drop the last commits.
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true))
}

/// Makes sqlite-vec's functions (`vec_distance_cosine`, ...) part of every SQLite connection
/// this process opens from now on, through rusqlite and sqlx alike: both link the one
/// `libsqlite3-sys`, whose auto-extension list applies to each new connection.
fn register_vector_functions() {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| {
        type EntryPoint = unsafe extern "C" fn(
            *mut rusqlite::ffi::sqlite3,
            *mut *mut std::os::raw::c_char,
            *const rusqlite::ffi::sqlite3_api_routines,
        ) -> std::os::raw::c_int;
        // SAFETY: `sqlite3_vec_init` is an SQLite extension entry point with exactly this
        // signature; the crate declares it without arguments only because it is not meant to
        // be called from Rust. It is registered once, and SQLite calls it on each connection.
        let rc = unsafe {
            let entry: EntryPoint = std::mem::transmute(sqlite_vec::sqlite3_vec_init as *const ());
            rusqlite::ffi::sqlite3_auto_extension(Some(entry))
        };
        if rc != rusqlite::ffi::SQLITE_OK {
            tracing::error!(
                rc,
                "registering sqlite-vec failed; searches by meaning will fail"
            );
        }
    });
}

impl SqliteStorage {
    /// Opens (creating if needed) the database file and applies pending migrations.
    pub async fn open(url: &str) -> StorageResult<Self> {
        register_vector_functions();
        let options = connect_options(url)?;
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        MIGRATOR.run(&write).await?;
        let notices = Arc::new(Notices::default());
        let writer = Arc::new(Writer::open(options.get_filename(), notices.clone())?);
        let readers = Arc::new(Readers::new(options.get_filename()));
        let read = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options.read_only(true))
            .await?;
        let logged = SqliteCheckpointer::new(read.clone(), readers.clone(), writer.clone());
        Ok(Self {
            read,
            readers,
            writer,
            write,
            nearest: NearestIndexes::default(),
            logged,
            notices,
        })
    }

    /// A transaction on the sqlx write connection, with the writer thread parked until the
    /// permit is dropped (after the transaction ends).
    pub(crate) async fn begin_write(
        &self,
    ) -> StorageResult<(WritePermit, sqlx::Transaction<'static, Sqlite>)> {
        let permit = self.writer.permit().await?;
        let tx = self.write.begin().await?;
        Ok((permit, tx))
    }

    /// The writer pool, for unit tests that set up rows directly.
    #[cfg(test)]
    pub(crate) fn write_pool(&self) -> &SqlitePool {
        &self.write
    }

    pub async fn migrate_only(url: &str) -> StorageResult<usize> {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(connect_options(url)?)
            .await?;
        let applied = pending_count(&pool).await?;
        MIGRATOR.run(&pool).await?;
        pool.close().await;
        Ok(applied)
    }
}

async fn pending_count(pool: &SqlitePool) -> StorageResult<usize> {
    let table_exists: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_optional(pool)
    .await?;
    let applied: Vec<i64> = if table_exists.is_some() {
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await?
    } else {
        Vec::new()
    };
    Ok(MIGRATOR
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .count())
}

/// `user_id = scope OR user_id IS NULL`: the caller's resources and the shared ones.
fn push_visible(qb: &mut QueryBuilder<'_, Sqlite>, scope: &Scope) {
    qb.push("(user_id = ")
        .push_bind(scope.user_id.clone())
        .push(" OR user_id IS NULL)");
}

async fn fetch_assistant(
    conn: &mut SqliteConnection,
    scope: &Scope,
    id: ResourceId,
) -> StorageResult<Option<Assistant>> {
    let sql = format!(
        "SELECT {ASSISTANT_COLUMNS} FROM assistants WHERE assistant_id = $1 AND (user_id = $2 OR user_id IS NULL)"
    );
    let row: Option<AssistantRow> = sqlx::query_as(&sql)
        .bind(id)
        .bind(&scope.user_id)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(Assistant::from))
}

async fn insert_version(
    conn: &mut SqliteConnection,
    id: ResourceId,
    version: &AssistantVersion,
) -> StorageResult<()> {
    let f = &version.fields;
    sqlx::query(
        "INSERT INTO assistant_versions (assistant_id, version, graph_id, name, description, config, \
         context, metadata, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(id)
    .bind(version.version)
    .bind(&f.graph_id)
    .bind(&f.name)
    .bind(&f.description)
    .bind(Json(&f.config))
    .bind(Json(&f.context))
    .bind(Json(&f.metadata))
    .bind(version.created_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Makes `fields` at `version` the assistant's current configuration.
async fn set_current(
    conn: &mut SqliteConnection,
    id: ResourceId,
    version: i64,
    fields: &AssistantFields,
) -> StorageResult<()> {
    sqlx::query(
        "UPDATE assistants SET graph_id = $2, name = $3, description = $4, config = $5, context = $6, \
         metadata = $7, version = $8, updated_at = $9 WHERE assistant_id = $1",
    )
    .bind(id)
    .bind(&fields.graph_id)
    .bind(&fields.name)
    .bind(&fields.description)
    .bind(Json(&fields.config))
    .bind(Json(&fields.context))
    .bind(Json(&fields.metadata))
    .bind(version)
    .bind(Utc::now())
    .execute(conn)
    .await?;
    Ok(())
}

fn push_assistant_filter(
    qb: &mut QueryBuilder<'_, Sqlite>,
    scope: &Scope,
    filter: &AssistantFilter,
) {
    qb.push(" WHERE ");
    push_visible(qb, scope);
    if let Some(graph_id) = &filter.graph_id {
        qb.push(" AND graph_id = ").push_bind(graph_id.clone());
    }
    if let Some(name) = &filter.name {
        qb.push(" AND instr(lower(name), lower(")
            .push_bind(name.clone())
            .push(")) > 0");
    }
    if let Some(metadata) = &filter.metadata {
        qb.push(" AND ");
        push_sqlite_contains(qb, "metadata", &Value::Object(metadata.clone()));
    }
    if let Some(condition) = &filter.condition {
        qb.push(" AND ");
        push_sqlite_condition(qb, "metadata", condition);
    }
}

fn push_thread_filter(qb: &mut QueryBuilder<'_, Sqlite>, scope: &Scope, filter: &ThreadFilter) {
    qb.push(" WHERE ");
    push_visible(qb, scope);
    if let Some(ids) = &filter.ids {
        qb.push(" AND thread_id IN (");
        let mut list = qb.separated(", ");
        for id in ids {
            list.push_bind(*id);
        }
        // `IN ()` is a syntax error; an empty id list matches nothing.
        if ids.is_empty() {
            list.push("NULL");
        }
        qb.push(")");
    }
    if let Some(status) = filter.status {
        qb.push(" AND status = ").push_bind(status.as_str());
    }
    if let Some(metadata) = &filter.metadata {
        qb.push(" AND ");
        push_sqlite_contains(qb, "metadata", &Value::Object(metadata.clone()));
    }
    if let Some(condition) = &filter.condition {
        qb.push(" AND ");
        push_sqlite_condition(qb, "metadata", condition);
    }
    if let Some(values) = &filter.values {
        qb.push(" AND state_values IS NOT NULL AND ");
        push_sqlite_contains(qb, "state_values", &Value::Object(values.clone()));
    }
}

async fn count_with(mut qb: QueryBuilder<'_, Sqlite>, pool: &SqlitePool) -> StorageResult<i64> {
    Ok(qb.build_query_scalar().fetch_one(pool).await?)
}

#[async_trait]
impl AssistantStore for SqliteStorage {
    async fn create_assistant(
        &self,
        owner: Owner<'_>,
        new: NewAssistant,
    ) -> StorageResult<Assistant> {
        let (_permit, mut tx) = self.begin_write().await?;
        let existing: Option<(Option<String>,)> =
            sqlx::query_as("SELECT user_id FROM assistants WHERE assistant_id = $1")
                .bind(new.assistant_id)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some((existing_owner,)) = existing {
            let visible = existing_owner.is_none() || existing_owner.as_deref() == owner.user_id();
            if new.if_exists == IfExists::DoNothing && visible {
                let scope = Scope::new(owner.user_id().unwrap_or_default());
                return fetch_assistant(&mut tx, &scope, new.assistant_id)
                    .await?
                    .ok_or(StorageError::NotFound("assistant"));
            }
            return Err(StorageError::Conflict(format!(
                "assistant {} already exists",
                new.assistant_id
            )));
        }
        let now = Utc::now();
        let f = &new.fields;
        sqlx::query(
            "INSERT INTO assistants (assistant_id, user_id, graph_id, name, description, config, context, \
             metadata, version, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1, $9, $9)",
        )
        .bind(new.assistant_id)
        .bind(owner.user_id())
        .bind(&f.graph_id)
        .bind(&f.name)
        .bind(&f.description)
        .bind(Json(&f.config))
        .bind(Json(&f.context))
        .bind(Json(&f.metadata))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let version = AssistantVersion {
            assistant_id: new.assistant_id,
            version: 1,
            fields: new.fields.clone(),
            created_at: now,
        };
        insert_version(&mut tx, new.assistant_id, &version).await?;
        tx.commit().await?;
        Ok(Assistant {
            assistant_id: new.assistant_id,
            user_id: owner.user_id().map(str::to_owned),
            version: 1,
            fields: new.fields,
            created_at: now,
            updated_at: now,
        })
    }

    async fn get_assistant(
        &self,
        scope: &Scope,
        assistant: ResourceId,
    ) -> StorageResult<Assistant> {
        let sql = format!(
            "SELECT {ASSISTANT_COLUMNS} FROM assistants WHERE assistant_id = ?1 \
             AND (user_id = ?2 OR user_id IS NULL)"
        );
        self.readers.read(|conn| {
            let row = conn
                .prepare_cached(&sql)?
                .query_row((id(assistant), &scope.user_id), AssistantRow::from_sqlite)
                .optional()?;
            Ok(row.ok_or(StorageError::NotFound("assistant"))?.into())
        })
    }

    async fn update_assistant(
        &self,
        scope: &Scope,
        id: ResourceId,
        patch: AssistantPatch,
    ) -> StorageResult<Assistant> {
        let (_permit, mut tx) = self.begin_write().await?;
        let current = fetch_assistant(&mut tx, scope, id)
            .await?
            .ok_or(StorageError::NotFound("assistant"))?;
        let latest: i64 = sqlx::query_scalar(
            "SELECT MAX(version) FROM assistant_versions WHERE assistant_id = $1",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
        let version = AssistantVersion {
            assistant_id: id,
            version: latest + 1,
            fields: patch.apply(&current.fields),
            created_at: Utc::now(),
        };
        insert_version(&mut tx, id, &version).await?;
        set_current(&mut tx, id, version.version, &version.fields).await?;
        let updated = fetch_assistant(&mut tx, scope, id)
            .await?
            .ok_or(StorageError::NotFound("assistant"))?;
        tx.commit().await?;
        Ok(updated)
    }

    async fn delete_assistant(
        &self,
        scope: &Scope,
        assistant: ResourceId,
        delete_threads: bool,
    ) -> StorageResult<Vec<Uuid>> {
        let scope = scope.clone();
        self.writer
            .write(move |conn| delete_assistant(conn, &scope, assistant, delete_threads))
            .await
    }

    async fn search_assistants(
        &self,
        scope: &Scope,
        search: AssistantSearch,
    ) -> StorageResult<Paged<Assistant>> {
        let mut qb = QueryBuilder::new(format!("SELECT {ASSISTANT_COLUMNS} FROM assistants"));
        push_assistant_filter(&mut qb, scope, &search.filter);
        let order = search.sort_order.sql();
        qb.push(format!(
            " ORDER BY {} {order}, assistant_id {order} LIMIT ",
            search.sort_by.column()
        ))
        .push_bind(search.page.limit)
        .push(" OFFSET ")
        .push_bind(search.page.offset);
        let rows: Vec<AssistantRow> = qb.build_query_as().fetch_all(&self.read).await?;
        let total = self.count_assistants(scope, search.filter).await?;
        Ok(Paged {
            items: rows.into_iter().map(Assistant::from).collect(),
            total,
        })
    }

    async fn count_assistants(&self, scope: &Scope, filter: AssistantFilter) -> StorageResult<i64> {
        let mut qb = QueryBuilder::new("SELECT COUNT(*) FROM assistants");
        push_assistant_filter(&mut qb, scope, &filter);
        count_with(qb, &self.read).await
    }

    async fn list_assistant_versions(
        &self,
        scope: &Scope,
        id: ResourceId,
        metadata: Option<JsonObject>,
        page: Page,
    ) -> StorageResult<Vec<AssistantVersion>> {
        self.get_assistant(scope, id).await?;
        let mut qb = QueryBuilder::new(format!(
            "SELECT {VERSION_COLUMNS} FROM assistant_versions WHERE assistant_id = "
        ));
        qb.push_bind(id);
        if let Some(metadata) = metadata {
            qb.push(" AND ");
            push_sqlite_contains(&mut qb, "metadata", &Value::Object(metadata));
        }
        qb.push(" ORDER BY version DESC LIMIT ")
            .push_bind(page.limit)
            .push(" OFFSET ")
            .push_bind(page.offset);
        let rows: Vec<AssistantVersionRow> = qb.build_query_as().fetch_all(&self.read).await?;
        Ok(rows.into_iter().map(AssistantVersion::from).collect())
    }

    async fn set_latest_assistant_version(
        &self,
        scope: &Scope,
        id: ResourceId,
        version: i64,
    ) -> StorageResult<Assistant> {
        let (_permit, mut tx) = self.begin_write().await?;
        fetch_assistant(&mut tx, scope, id)
            .await?
            .ok_or(StorageError::NotFound("assistant"))?;
        let sql = format!("SELECT {VERSION_COLUMNS} FROM assistant_versions WHERE assistant_id = $1 AND version = $2");
        let row: Option<AssistantVersionRow> = sqlx::query_as(&sql)
            .bind(id)
            .bind(version)
            .fetch_optional(&mut *tx)
            .await?;
        let target =
            AssistantVersion::from(row.ok_or(StorageError::NotFound("assistant version"))?);
        set_current(&mut tx, id, version, &target.fields).await?;
        let updated = fetch_assistant(&mut tx, scope, id)
            .await?
            .ok_or(StorageError::NotFound("assistant"))?;
        tx.commit().await?;
        Ok(updated)
    }
}

/// Runs `delete` (`?1` the id, `?2` the caller) and answers not found when it removed nothing.
fn delete_visible(
    conn: &rusqlite::Connection,
    delete: &str,
    key: ResourceId,
    user_id: String,
    what: &'static str,
) -> StorageResult<()> {
    if conn.prepare_cached(delete)?.execute((id(key), user_id))? == 0 {
        return Err(StorageError::NotFound(what));
    }
    Ok(())
}

/// Deletes an assistant with its versions and crons (foreign keys) and its runs, active ones
/// included; with `delete_threads`, first the caller's threads whose metadata names it (with
/// their checkpoints, runs and events). Returns the runs that were running, to stop.
fn delete_assistant(
    conn: &rusqlite::Connection,
    scope: &Scope,
    assistant: ResourceId,
    delete_threads: bool,
) -> StorageResult<Vec<Uuid>> {
    let visible = conn
        .prepare_cached(
            "SELECT 1 FROM assistants WHERE assistant_id = ?1 AND (user_id = ?2 OR user_id IS NULL)",
        )?
        .exists((id(assistant), &scope.user_id))?;
    if !visible {
        return Err(StorageError::NotFound("assistant"));
    }
    let mut stopped = Vec::new();
    if delete_threads {
        let threads: Vec<ResourceId> = conn
            .prepare_cached(
                "SELECT thread_id FROM threads WHERE json_extract(metadata, '$.assistant_id') = ?1 \
                 AND (user_id = ?2 OR user_id IS NULL)",
            )?
            .query_map((id(assistant), &scope.user_id), |r| r.resource_id("thread_id"))?
            .collect::<rusqlite::Result<_>>()?;
        stopped = crate::runs::sqlite::running_runs_of_threads(conn, &threads)?;
        for thread in threads {
            crate::thread_state::sqlite::delete_rows(conn, thread)?;
        }
    }
    stopped.extend(crate::runs::sqlite::delete_assistant_runs(
        conn,
        assistant,
        Utc::now(),
    )?);
    conn.prepare_cached("DELETE FROM assistants WHERE assistant_id = ?1")?
        .execute([id(assistant)])?;
    Ok(stopped)
}

/// A thread the caller can see (on the write connection or a point-read one).
fn thread_now(
    conn: &rusqlite::Connection,
    scope: &Scope,
    thread: ResourceId,
) -> StorageResult<Thread> {
    let sql = format!(
        "SELECT {THREAD_COLUMNS} FROM threads WHERE thread_id = ?1 \
         AND (user_id = ?2 OR user_id IS NULL)"
    );
    let row = conn
        .prepare_cached(&sql)?
        .query_row((id(thread), &scope.user_id), ThreadRow::from_sqlite)
        .optional()?;
    row.ok_or(StorageError::NotFound("thread"))?.try_into()
}

fn create_thread(
    conn: &rusqlite::Connection,
    scope: &Scope,
    new: NewThread,
) -> StorageResult<Thread> {
    let now = Utc::now();
    let created =
        conn.prepare_cached(
            "INSERT INTO threads (thread_id, user_id, metadata, created_at, updated_at, \
             state_updated_at) VALUES (?1, ?2, ?3, ?4, ?4, ?4) ON CONFLICT (thread_id) DO NOTHING",
        )?
        .execute((
            id(new.thread_id),
            &scope.user_id,
            json(&new.metadata)?,
            ts(now),
        ))? == 1;
    if created {
        if let Some(ttl) = &new.ttl {
            thread_state::sqlite::set_ttl(conn, new.thread_id, Some(ttl), now)?;
        }
        if let Some(state) = &new.state {
            thread_state::sqlite::save_state(conn, new.thread_id, state, now)?;
        }
    }
    match (
        created,
        new.if_exists,
        thread_now(conn, scope, new.thread_id),
    ) {
        (true, _, Ok(thread)) | (_, IfExists::DoNothing, Ok(thread)) => Ok(thread),
        (_, _, Err(StorageError::NotFound(_))) | (false, IfExists::Raise, Ok(_)) => Err(
            StorageError::Conflict(format!("thread {} already exists", new.thread_id)),
        ),
        (_, _, Err(e)) => Err(e),
    }
}

#[async_trait]
impl ThreadStore for SqliteStorage {
    async fn create_thread(&self, scope: &Scope, new: NewThread) -> StorageResult<Thread> {
        let scope = scope.clone();
        // A request waits on it before it can answer.
        self.writer
            .write_ahead(move |conn| create_thread(conn, &scope, new))
            .await
    }

    async fn get_thread(&self, scope: &Scope, thread: ResourceId) -> StorageResult<Thread> {
        self.readers.read(|conn| thread_now(conn, scope, thread))
    }

    async fn patch_thread(
        &self,
        scope: &Scope,
        thread: ResourceId,
        patch: ThreadPatch,
    ) -> StorageResult<Thread> {
        let scope = scope.clone();
        self.writer
            .write(move |conn| {
                let mut current = thread_now(conn, &scope, thread)?;
                // A shallow merge, like jsonb `||`: a key's new value replaces the old one
                // whole and null is kept as a value. (SQLite's json_patch would merge deeply
                // and delete nulls.)
                current.metadata.extend(patch.metadata);
                let now = Utc::now();
                conn.prepare_cached(
                    "UPDATE threads SET metadata = ?2, updated_at = ?3 WHERE thread_id = ?1",
                )?
                .execute((id(thread), json(&current.metadata)?, ts(now)))?;
                if let Some(ttl) = &patch.ttl {
                    thread_state::sqlite::set_ttl(conn, thread, Some(ttl), now)?;
                }
                thread_now(conn, &scope, thread)
            })
            .await
    }

    async fn write_thread_state(
        &self,
        scope: &Scope,
        thread: ResourceId,
        write: StateWrite,
        event: Option<ThreadEvent>,
    ) -> StorageResult<StateWritten> {
        let scope = scope.clone();
        // The writer thread runs one write at a time: no run can start between the check and
        // the write.
        self.writer
            .write(move |conn| {
                thread_now(conn, &scope, thread)?;
                thread_state::sqlite::ensure_idle(conn, thread)?;
                thread_state::sqlite::ensure_latest(conn, thread, &write)?;
                // Microseconds, as the database keeps them: the event returned is the one
                // logged.
                let now = chrono::SubsecRound::trunc_subsecs(Utc::now(), 6);
                thread_state::sqlite::save_state(conn, thread, &write, now)?;
                let event = event
                    .map(|e| thread_state::sqlite::log_event(conn, thread, &e, now))
                    .transpose()?;
                let thread = thread_now(conn, &scope, thread)?;
                Ok(StateWritten { thread, event })
            })
            .await
    }

    async fn prune_threads(
        &self,
        scope: &Scope,
        ids: &[ResourceId],
        strategy: TtlStrategy,
    ) -> StorageResult<u64> {
        let (scope, ids) = (scope.clone(), ids.to_vec());
        self.writer
            .write(move |conn| thread_state::sqlite::prune(conn, &scope, &ids, strategy))
            .await
    }

    async fn sweep_expired_threads(
        &self,
        now: chrono::DateTime<Utc>,
        default: Option<ThreadTtl>,
        limit: i64,
    ) -> StorageResult<SweepOutcome> {
        self.writer
            .write(move |conn| thread_state::sqlite::sweep(conn, now, default.as_ref(), limit))
            .await
    }

    async fn delete_thread(&self, scope: &Scope, thread: ResourceId) -> StorageResult<()> {
        let user_id = scope.user_id.clone();
        self.writer
            .write(move |conn| {
                delete_visible(
                    conn,
                    "DELETE FROM threads WHERE thread_id = ?1 AND (user_id = ?2 OR user_id IS NULL)",
                    thread,
                    user_id,
                    "thread",
                )?;
                // Its streams end.
                notice_logged(thread, i64::MAX);
                Ok(())
            })
            .await
    }

    async fn search_threads(
        &self,
        scope: &Scope,
        search: ThreadSearch,
    ) -> StorageResult<Paged<Thread>> {
        let mut qb = QueryBuilder::new(format!("SELECT {THREAD_COLUMNS} FROM threads"));
        push_thread_filter(&mut qb, scope, &search.filter);
        let order = search.sort_order.sql();
        qb.push(format!(
            " ORDER BY {} {order}, thread_id {order} LIMIT ",
            search.sort_by.column()
        ))
        .push_bind(search.page.limit)
        .push(" OFFSET ")
        .push_bind(search.page.offset);
        let rows: Vec<ThreadRow> = qb.build_query_as().fetch_all(&self.read).await?;
        let total = self.count_threads(scope, search.filter).await?;
        Ok(Paged {
            items: rows
                .into_iter()
                .map(Thread::try_from)
                .collect::<StorageResult<_>>()?,
            total,
        })
    }

    async fn count_threads(&self, scope: &Scope, filter: ThreadFilter) -> StorageResult<i64> {
        let mut qb = QueryBuilder::new("SELECT COUNT(*) FROM threads");
        push_thread_filter(&mut qb, scope, &filter);
        count_with(qb, &self.read).await
    }

    async fn copy_thread(
        &self,
        scope: &Scope,
        from: ResourceId,
        to: ResourceId,
    ) -> StorageResult<Thread> {
        let scope = scope.clone();
        self.writer
            .write(move |conn| {
                let copied = conn
                    .prepare_cached(
                        "INSERT INTO threads (thread_id, user_id, status, metadata, config, \
                         state_values, interrupts, error, created_at, updated_at, state_updated_at) \
                         SELECT ?3, user_id, 'idle', COALESCE(( \
                             SELECT json_insert(t.metadata, '$.graph_id', a.graph_id, \
                                                '$.assistant_id', a.assistant_id) \
                             FROM runs r JOIN assistants a ON a.assistant_id = r.assistant_id \
                             WHERE r.thread_id = t.thread_id \
                             ORDER BY r.created_at DESC LIMIT 1), metadata), \
                         config, state_values, '{}', NULL, ?4, ?4, ?4 FROM threads t \
                         WHERE thread_id = ?1 AND (user_id = ?2 OR user_id IS NULL)",
                    )?
                    .execute((id(from), &scope.user_id, id(to), ts(Utc::now())))
                    .map_err(|e| {
                        sqlite_conflict_if_taken(e, || format!("thread {to} already exists"))
                    })?;
                if copied == 0 {
                    return Err(StorageError::NotFound("thread"));
                }
                copy_checkpoints_sqlite(conn, &id(from), &id(to))?;
                thread_now(conn, &scope, to)
            })
            .await
    }
}

#[async_trait]
impl Storage for SqliteStorage {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    async fn ping(&self) -> StorageResult<()> {
        let applied = sqlx::query_scalar(crate::schema::LATEST_APPLIED)
            .fetch_one(&self.read)
            .await;
        crate::schema::check_current(&MIGRATOR, applied)
    }

    fn checkpointer(&self) -> Arc<dyn Checkpointer> {
        Arc::new(SqliteCheckpointer::new(
            self.read.clone(),
            self.readers.clone(),
            self.writer.clone(),
        ))
    }

    async fn save_logged(&self, save: LoggedSave) -> Result<(), CheckpointError> {
        self.logged.submit_logged(save).await
    }

    fn queue_logged(&self, save: LoggedSave) -> WriteReceipt {
        self.logged.submit_logged(save)
    }

    fn queue_events(&self, events: Vec<crate::LoggedEvent>) -> crate::EventsReceipt {
        // With the thread's queued saves, in order (see `submit_events`).
        let logged = self.logged.submit_events(&events);
        Box::pin(async move { logged.await.map_err(StorageError::from) })
    }

    /// One process has the database to itself, so only its own commits wake it: those
    /// nothing else tells its streams and workers of (`sqlite_notices`).
    fn wakeups(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<crate::Wakeup>> {
        self.notices.subscribe()
    }

    async fn count_queued_runs(&self) -> StorageResult<crate::QueuedRuns> {
        // Each count reads an index: `runs_to_claim` (status first), and the partial index
        // of running runs.
        let (pending, running): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM runs WHERE status = 'pending'), \
             (SELECT count(*) FROM runs WHERE status = 'running')",
        )
        .fetch_one(&self.read)
        .await?;
        Ok(crate::QueuedRuns { pending, running })
    }

    fn pool_stats(&self) -> crate::PoolStats {
        crate::PoolStats {
            pools: vec![
                crate::ConnectionPool::of("read", &self.read),
                crate::ConnectionPool::of("write", &self.write),
            ],
            writer_queue: Some(self.writer.queued()),
        }
    }
}

/// A database file `db` in `dir` with only the shipped migrations numbered below `first_missing`
/// applied, as an older Spindle left it; its URL. For tests of a migration's upgrade.
#[cfg(test)]
pub(crate) async fn database_before(dir: &std::path::Path, first_missing: &str) -> String {
    let earlier = dir.join("migrations");
    std::fs::create_dir(&earlier).unwrap();
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite");
    for entry in std::fs::read_dir(shipped).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.as_str() < first_missing {
            std::fs::copy(&path, earlier.join(name)).unwrap();
        }
    }
    let url = format!("sqlite://{}?mode=rwc", dir.join("db").display());
    let pool = SqlitePool::connect(&url).await.unwrap();
    sqlx::migrate::Migrator::new(earlier.as_path())
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    pool.close().await;
    url
}
