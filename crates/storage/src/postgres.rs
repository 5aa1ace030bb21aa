//! The shared backend: PostgreSQL, for several server processes on one database.
//!
//! JSON lives in `jsonb`, so metadata filters are `@>` containment backed by GIN indexes.
//! Writes that read before they write lock the row (`FOR UPDATE`) so concurrent processes
//! serialise on it.

use crate::ResourceId;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{SubsecRound, Utc};
use serde_json::Value;
use spindle_graph::checkpoint::{CheckpointError, Checkpointer, WriteReceipt};
use sqlx::postgres::PgPool;
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, QueryBuilder};
use uuid::Uuid;

/// A statement with its parameters, as the builders of a writer's group's arrays bind them.
pub(crate) type PgQuery<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

use crate::assistant_cache::AssistantCache;
use crate::checkpoints::{copy_checkpoints_pg, PostgresCheckpointer};
use crate::error::conflict_if_taken;
use crate::model::*;
use crate::pg_creator::{PgCreator, ThreadCreation};
use crate::pg_writer::PgWriter;
use crate::rows::{
    AssistantRow, AssistantVersionRow, ThreadRow, ASSISTANT_COLUMNS, THREAD_COLUMNS,
    VERSION_COLUMNS,
};
use crate::{
    thread_state, AssistantStore, Backend, LoggedEvent, LoggedSave, Storage, StorageError,
    StorageResult, ThreadStore,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

pub struct PostgresStorage {
    pub(crate) pool: PgPool,
    /// Plain threads' and runs' creations, grouped into shared transactions.
    pub(crate) creator: PgCreator,
    /// The schema pgvector is installed in, if it is (settled on first use; see
    /// `store::postgres`).
    pub(crate) pgvector: tokio::sync::OnceCell<Option<String>>,
    /// Runs' saves, event batches and ends, grouped into shared transactions.
    pub(crate) writer: PgWriter,
    /// Assistants as runs were made from them ([`AssistantStore::assistant_for_run`]).
    pub(crate) assistants: AssistantCache,
    /// Whether [`Storage::wakeups`] started the listener (only the server listens; tests and
    /// `migrate` do not hold a connection for it).
    listening: std::sync::atomic::AtomicBool,
}

async fn pool(url: &str) -> StorageResult<PgPool> {
    Ok(crate::pg_pool::connect(url).await?)
}

impl PostgresStorage {
    /// Connects and applies pending migrations (under PostgreSQL's advisory lock, so several
    /// processes starting at once do not race).
    /// `writers`: the runs' writer tasks (see `pg_writer`).
    pub async fn connect(url: &str, writers: usize) -> StorageResult<Self> {
        let pool = pool(url).await?;
        MIGRATOR.run(&pool).await?;
        Ok(Self::new(pool, writers))
    }

    fn new(pool: PgPool, writers: usize) -> Self {
        Self {
            writer: PgWriter::start(pool.clone(), writers),
            creator: PgCreator::start(pool.clone()),
            pool,
            pgvector: tokio::sync::OnceCell::new(),
            assistants: AssistantCache::default(),
            listening: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Wraps an existing pool (tests share one per database), with `writers` runs' writers.
    pub async fn from_pool(pool: PgPool, writers: usize) -> StorageResult<Self> {
        MIGRATOR.run(&pool).await?;
        Ok(Self::new(pool, writers))
    }

    pub async fn migrate_only(url: &str) -> StorageResult<usize> {
        let pool = pool(url).await?;
        let applied: Vec<i64> =
            match sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&pool)
                .await
            {
                Ok(versions) => versions,
                // No migrations table yet: nothing has been applied.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => Vec::new(),
                Err(e) => return Err(e.into()),
            };
        let pending = MIGRATOR
            .iter()
            .filter(|m| !applied.contains(&m.version))
            .count();
        MIGRATOR.run(&pool).await?;
        pool.close().await;
        Ok(pending)
    }
}

/// Text sorts by byte order (`COLLATE "C"`), as SQLite does, so both backends page alike
/// whatever the database's locale.
fn byte_order(column: &str) -> String {
    match column {
        "name" | "graph_id" | "status" => format!("{column} COLLATE \"C\""),
        other => other.to_owned(),
    }
}

fn push_visible(qb: &mut QueryBuilder<'_, Postgres>, scope: &Scope) {
    qb.push("(user_id = ")
        .push_bind(scope.user_id.clone())
        .push(" OR user_id IS NULL)");
}

async fn fetch_assistant(
    conn: &mut PgConnection,
    scope: &Scope,
    id: ResourceId,
    lock: bool,
) -> StorageResult<Option<Assistant>> {
    let sql = format!(
        "SELECT {ASSISTANT_COLUMNS} FROM assistants WHERE assistant_id = $1 AND (user_id = $2 OR user_id IS NULL){}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let row: Option<AssistantRow> = sqlx::query_as(&sql)
        .bind(id)
        .bind(&scope.user_id)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(Assistant::from))
}

async fn insert_version(
    conn: &mut PgConnection,
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

async fn set_current(
    conn: &mut PgConnection,
    id: ResourceId,
    version: i64,
    fields: &AssistantFields,
) -> StorageResult<Assistant> {
    let sql = format!(
        "UPDATE assistants SET graph_id = $2, name = $3, description = $4, config = $5, context = $6, \
         metadata = $7, version = $8, updated_at = $9 WHERE assistant_id = $1 RETURNING {ASSISTANT_COLUMNS}"
    );
    let row: AssistantRow = sqlx::query_as(&sql)
        .bind(id)
        .bind(&fields.graph_id)
        .bind(&fields.name)
        .bind(&fields.description)
        .bind(Json(&fields.config))
        .bind(Json(&fields.context))
        .bind(Json(&fields.metadata))
        .bind(version)
        .bind(Utc::now())
        .fetch_one(conn)
        .await?;
    Ok(row.into())
}

/// A [`MetadataCondition`] on the `metadata` column: its containments are `@>`, which the
/// GIN indexes serve.
pub(crate) fn push_pg_condition(
    qb: &mut QueryBuilder<'_, Postgres>,
    condition: &MetadataCondition,
) {
    crate::json_filter::push_condition(qb, condition, &mut |qb, wanted| {
        qb.push("metadata @> ").push_bind(Json(wanted.clone()));
    });
}

fn push_assistant_filter(
    qb: &mut QueryBuilder<'_, Postgres>,
    scope: &Scope,
    filter: &AssistantFilter,
) {
    qb.push(" WHERE ");
    push_visible(qb, scope);
    if let Some(graph_id) = &filter.graph_id {
        qb.push(" AND graph_id = ").push_bind(graph_id.clone());
    }
    if let Some(name) = &filter.name {
        qb.push(" AND strpos(lower(name), lower(")
            .push_bind(name.clone())
            .push(")) > 0");
    }
    if let Some(metadata) = &filter.metadata {
        qb.push(" AND metadata @> ")
            .push_bind(Json(Value::Object(metadata.clone())));
    }
    if let Some(condition) = &filter.condition {
        qb.push(" AND ");
        push_pg_condition(qb, condition);
    }
}

fn push_thread_filter(qb: &mut QueryBuilder<'_, Postgres>, scope: &Scope, filter: &ThreadFilter) {
    qb.push(" WHERE ");
    push_visible(qb, scope);
    if let Some(ids) = &filter.ids {
        qb.push(" AND thread_id = ANY(")
            .push_bind(ids.clone())
            .push(")");
    }
    if let Some(status) = filter.status {
        qb.push(" AND status = ").push_bind(status.as_str());
    }
    if let Some(metadata) = &filter.metadata {
        qb.push(" AND metadata @> ")
            .push_bind(Json(Value::Object(metadata.clone())));
    }
    if let Some(condition) = &filter.condition {
        qb.push(" AND ");
        push_pg_condition(qb, condition);
    }
    if let Some(values) = &filter.values {
        qb.push(" AND state_values @> ")
            .push_bind(Json(Value::Object(values.clone())));
    }
}

/// Deletes an assistant with its versions and crons (foreign keys) and its runs, active ones
/// included; with `delete_threads`, first the caller's threads whose metadata names it (with
/// their checkpoints, runs and events). Returns the runs that were running, to stop.
async fn delete_assistant(
    conn: &mut PgConnection,
    scope: &Scope,
    id: ResourceId,
    delete_threads: bool,
) -> StorageResult<Vec<Uuid>> {
    let visible: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM assistants WHERE assistant_id = $1 AND (user_id = $2 OR user_id IS NULL) \
         FOR UPDATE",
    )
    .bind(id)
    .bind(&scope.user_id)
    .fetch_optional(&mut *conn)
    .await?;
    if visible.is_none() {
        return Err(StorageError::NotFound("assistant"));
    }
    let mut stopped = Vec::new();
    if delete_threads {
        let threads: Vec<ResourceId> = sqlx::query_scalar(
            "SELECT thread_id FROM threads WHERE metadata @> jsonb_build_object('assistant_id', $1::text) \
             AND (user_id = $2 OR user_id IS NULL) ORDER BY thread_id FOR UPDATE",
        )
        .bind(id.to_string())
        .bind(&scope.user_id)
        .fetch_all(&mut *conn)
        .await?;
        stopped = crate::runs::postgres::running_runs_of_threads(conn, &threads).await?;
        for thread in threads {
            crate::thread_state::postgres::delete_rows(conn, thread).await?;
        }
    }
    stopped.extend(crate::runs::postgres::delete_assistant_runs(conn, id, Utc::now()).await?);
    sqlx::query("DELETE FROM assistants WHERE assistant_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(stopped)
}

/// A copy's metadata: the original's, which names its graph (`graph_id`, set by its runs).
/// A thread whose metadata does not (one run before runs set it) gets its latest run's
/// graph and assistant, so the copy has the graph its state is of without any run.
const COPY_METADATA: &str = "COALESCE((SELECT jsonb_build_object('graph_id', a.graph_id, \
     'assistant_id', a.assistant_id) || t.metadata FROM runs r \
     JOIN assistants a ON a.assistant_id = r.assistant_id WHERE r.thread_id = t.thread_id \
     ORDER BY r.created_at DESC LIMIT 1), t.metadata)";

#[async_trait]
impl AssistantStore for PostgresStorage {
    async fn create_assistant(
        &self,
        owner: Owner<'_>,
        new: NewAssistant,
    ) -> StorageResult<Assistant> {
        let mut tx = self.pool.begin().await?;
        let now = Utc::now();
        let f = &new.fields;
        let sql = format!(
            "INSERT INTO assistants (assistant_id, user_id, graph_id, name, description, config, context, \
             metadata, version, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1, $9, $9) \
             ON CONFLICT (assistant_id) DO NOTHING RETURNING {ASSISTANT_COLUMNS}"
        );
        let inserted: Option<AssistantRow> = sqlx::query_as(&sql)
            .bind(new.assistant_id)
            .bind(owner.user_id())
            .bind(&f.graph_id)
            .bind(&f.name)
            .bind(&f.description)
            .bind(Json(&f.config))
            .bind(Json(&f.context))
            .bind(Json(&f.metadata))
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(inserted) = inserted else {
            let scope = Scope::new(owner.user_id().unwrap_or_default());
            let existing = fetch_assistant(&mut tx, &scope, new.assistant_id, false).await?;
            return match (new.if_exists, existing) {
                (IfExists::DoNothing, Some(existing)) => Ok(existing),
                _ => Err(StorageError::Conflict(format!(
                    "assistant {} already exists",
                    new.assistant_id
                ))),
            };
        };
        let version = AssistantVersion {
            assistant_id: new.assistant_id,
            version: 1,
            fields: new.fields,
            created_at: now,
        };
        insert_version(&mut tx, new.assistant_id, &version).await?;
        tx.commit().await?;
        Ok(inserted.into())
    }

    async fn get_assistant(&self, scope: &Scope, id: ResourceId) -> StorageResult<Assistant> {
        let mut conn = self.pool.acquire().await?;
        fetch_assistant(&mut conn, scope, id, false)
            .await?
            .ok_or(StorageError::NotFound("assistant"))
    }

    async fn assistant_for_run(&self, scope: &Scope, id: ResourceId) -> StorageResult<Assistant> {
        if let Some(kept) = self.assistants.get(scope, id) {
            return Ok(kept);
        }
        let assistant = self.get_assistant(scope, id).await?;
        self.assistants.keep(&assistant);
        Ok(assistant)
    }

    async fn update_assistant(
        &self,
        scope: &Scope,
        id: ResourceId,
        patch: AssistantPatch,
    ) -> StorageResult<Assistant> {
        let mut tx = self.pool.begin().await?;
        let current = fetch_assistant(&mut tx, scope, id, true)
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
        let updated = set_current(&mut tx, id, version.version, &version.fields).await?;
        tx.commit().await?;
        self.assistants.forget(id);
        Ok(updated)
    }

    async fn delete_assistant(
        &self,
        scope: &Scope,
        id: ResourceId,
        delete_threads: bool,
    ) -> StorageResult<Vec<Uuid>> {
        let mut tx = self.pool.begin().await?;
        let stopped = delete_assistant(&mut tx, scope, id, delete_threads).await?;
        tx.commit().await?;
        self.assistants.forget(id);
        Ok(stopped)
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
            byte_order(search.sort_by.column())
        ))
        .push_bind(search.page.limit)
        .push(" OFFSET ")
        .push_bind(search.page.offset);
        let rows: Vec<AssistantRow> = qb.build_query_as().fetch_all(&self.pool).await?;
        let total = self.count_assistants(scope, search.filter).await?;
        Ok(Paged {
            items: rows.into_iter().map(Assistant::from).collect(),
            total,
        })
    }

    async fn count_assistants(&self, scope: &Scope, filter: AssistantFilter) -> StorageResult<i64> {
        let mut qb = QueryBuilder::new("SELECT COUNT(*) FROM assistants");
        push_assistant_filter(&mut qb, scope, &filter);
        Ok(qb.build_query_scalar().fetch_one(&self.pool).await?)
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
            qb.push(" AND metadata @> ")
                .push_bind(Json(Value::Object(metadata)));
        }
        qb.push(" ORDER BY version DESC LIMIT ")
            .push_bind(page.limit)
            .push(" OFFSET ")
            .push_bind(page.offset);
        let rows: Vec<AssistantVersionRow> = qb.build_query_as().fetch_all(&self.pool).await?;
        Ok(rows.into_iter().map(AssistantVersion::from).collect())
    }

    async fn set_latest_assistant_version(
        &self,
        scope: &Scope,
        id: ResourceId,
        version: i64,
    ) -> StorageResult<Assistant> {
        let mut tx = self.pool.begin().await?;
        fetch_assistant(&mut tx, scope, id, true)
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
        let updated = set_current(&mut tx, id, version, &target.fields).await?;
        tx.commit().await?;
        self.assistants.forget(id);
        Ok(updated)
    }
}

async fn fetch_thread(
    conn: &mut PgConnection,
    scope: &Scope,
    id: ResourceId,
) -> StorageResult<Option<Thread>> {
    let sql = format!("SELECT {THREAD_COLUMNS} FROM threads WHERE thread_id = $1 AND (user_id = $2 OR user_id IS NULL)");
    let row: Option<ThreadRow> = sqlx::query_as(&sql)
        .bind(id)
        .bind(&scope.user_id)
        .fetch_optional(conn)
        .await?;
    row.map(Thread::try_from).transpose()
}

#[async_trait]
impl ThreadStore for PostgresStorage {
    async fn create_thread(&self, scope: &Scope, new: NewThread) -> StorageResult<Thread> {
        let now = Utc::now();
        if new.ttl.is_none() && new.state.is_none() {
            // A plain new thread: made with others being created at the same time.
            let creation = ThreadCreation {
                thread_id: new.thread_id,
                user_id: scope.user_id.clone(),
                metadata: new.metadata.clone(),
                now: now.trunc_subsecs(6),
            };
            if let Some(thread) = self.creator.thread(creation).await? {
                return Ok(thread);
            }
        }
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO threads (thread_id, user_id, metadata, created_at, updated_at, state_updated_at) \
             VALUES ($1, $2, $3, $4, $4, $4) ON CONFLICT (thread_id) DO NOTHING",
        )
        .bind(new.thread_id)
        .bind(&scope.user_id)
        .bind(Json(&new.metadata))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let created = inserted.rows_affected() == 1;
        if created {
            if let Some(ttl) = &new.ttl {
                thread_state::postgres::set_ttl(&mut tx, new.thread_id, Some(ttl), now).await?;
            }
            if let Some(state) = &new.state {
                thread_state::postgres::save_state(&mut tx, new.thread_id, state, now).await?;
            }
        }
        let thread = match (
            created,
            new.if_exists,
            fetch_thread(&mut tx, scope, new.thread_id).await?,
        ) {
            (true, _, Some(thread)) | (_, IfExists::DoNothing, Some(thread)) => thread,
            _ => {
                return Err(StorageError::Conflict(format!(
                    "thread {} already exists",
                    new.thread_id
                )))
            }
        };
        tx.commit().await?;
        Ok(thread)
    }

    async fn get_thread(&self, scope: &Scope, id: ResourceId) -> StorageResult<Thread> {
        let mut conn = self.pool.acquire().await?;
        fetch_thread(&mut conn, scope, id)
            .await?
            .ok_or(StorageError::NotFound("thread"))
    }

    async fn patch_thread(
        &self,
        scope: &Scope,
        id: ResourceId,
        patch: ThreadPatch,
    ) -> StorageResult<Thread> {
        let mut tx = self.pool.begin().await?;
        let now = Utc::now();
        // jsonb `||` is a shallow merge that keeps nulls, as LangGraph's metadata merge does.
        let updated = sqlx::query(
            "UPDATE threads SET metadata = metadata || $3, updated_at = $4 \
             WHERE thread_id = $1 AND (user_id = $2 OR user_id IS NULL)",
        )
        .bind(id)
        .bind(&scope.user_id)
        .bind(Json(Value::Object(patch.metadata)))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() == 0 {
            return Err(StorageError::NotFound("thread"));
        }
        if let Some(ttl) = &patch.ttl {
            thread_state::postgres::set_ttl(&mut tx, id, Some(ttl), now).await?;
        }
        let thread = fetch_thread(&mut tx, scope, id)
            .await?
            .ok_or(StorageError::NotFound("thread"))?;
        tx.commit().await?;
        Ok(thread)
    }

    async fn write_thread_state(
        &self,
        scope: &Scope,
        id: ResourceId,
        write: StateWrite,
        event: Option<ThreadEvent>,
    ) -> StorageResult<StateWritten> {
        let mut tx = self.pool.begin().await?;
        // The row lock orders this with run creation, which takes it too.
        if !thread_state::postgres::lock_thread(&mut tx, scope, id).await? {
            return Err(StorageError::NotFound("thread"));
        }
        thread_state::postgres::ensure_idle(&mut tx, id).await?;
        thread_state::postgres::ensure_latest(&mut tx, id, &write).await?;
        // Microseconds, as the database keeps them: the event returned is the one logged.
        let now = chrono::SubsecRound::trunc_subsecs(Utc::now(), 6);
        thread_state::postgres::save_state(&mut tx, id, &write, now).await?;
        let event = match &event {
            Some(e) => Some(thread_state::postgres::log_event(&mut tx, id, e, now).await?),
            None => None,
        };
        let thread = fetch_thread(&mut tx, scope, id)
            .await?
            .ok_or(StorageError::NotFound("thread"))?;
        tx.commit().await?;
        Ok(StateWritten { thread, event })
    }

    async fn prune_threads(
        &self,
        scope: &Scope,
        ids: &[ResourceId],
        strategy: TtlStrategy,
    ) -> StorageResult<u64> {
        let mut tx = self.pool.begin().await?;
        let pruned = thread_state::postgres::prune(&mut tx, scope, ids, strategy).await?;
        tx.commit().await?;
        Ok(pruned)
    }

    async fn sweep_expired_threads(
        &self,
        now: chrono::DateTime<Utc>,
        default: Option<ThreadTtl>,
        limit: i64,
    ) -> StorageResult<SweepOutcome> {
        let mut tx = self.pool.begin().await?;
        let outcome = thread_state::postgres::sweep(&mut tx, now, default.as_ref(), limit).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    async fn delete_thread(&self, scope: &Scope, id: ResourceId) -> StorageResult<()> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "DELETE FROM threads WHERE thread_id = $1 AND (user_id = $2 OR user_id IS NULL)",
        )
        .bind(id)
        .bind(&scope.user_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StorageError::NotFound("thread"));
        }
        crate::thread_state::postgres::thread_row_deleted(&mut tx, id).await?;
        tx.commit().await?;
        Ok(())
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
            byte_order(search.sort_by.column())
        ))
        .push_bind(search.page.limit)
        .push(" OFFSET ")
        .push_bind(search.page.offset);
        let rows: Vec<ThreadRow> = qb.build_query_as().fetch_all(&self.pool).await?;
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
        Ok(qb.build_query_scalar().fetch_one(&self.pool).await?)
    }

    async fn copy_thread(
        &self,
        scope: &Scope,
        id: ResourceId,
        new_id: ResourceId,
    ) -> StorageResult<Thread> {
        let sql = format!(
            "INSERT INTO threads (thread_id, user_id, status, metadata, config, state_values, interrupts, error, \
             created_at, updated_at, state_updated_at) \
             SELECT $3, user_id, 'idle', {COPY_METADATA}, config, state_values, '{{}}', NULL, $4, $4, $4 \
             FROM threads t WHERE thread_id = $1 AND (user_id = $2 OR user_id IS NULL) RETURNING {THREAD_COLUMNS}"
        );
        let mut tx = self.pool.begin().await?;
        let row: Option<ThreadRow> = sqlx::query_as(&sql)
            .bind(id)
            .bind(&scope.user_id)
            .bind(new_id)
            .bind(Utc::now())
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| conflict_if_taken(e, || format!("thread {new_id} already exists")))?;
        let thread = Thread::try_from(row.ok_or(StorageError::NotFound("thread"))?)?;
        copy_checkpoints_pg(&mut tx, id.as_str(), new_id.as_str()).await?;
        tx.commit().await?;
        Ok(thread)
    }
}

#[async_trait]
impl Storage for PostgresStorage {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    async fn ping(&self) -> StorageResult<()> {
        let applied = sqlx::query_scalar(crate::schema::LATEST_APPLIED)
            .fetch_one(&self.pool)
            .await;
        crate::schema::check_current(&MIGRATOR, applied)
    }

    fn checkpointer(&self) -> Arc<dyn Checkpointer> {
        Arc::new(PostgresCheckpointer::new(self.pool.clone()))
    }

    async fn save_logged(&self, save: LoggedSave) -> Result<(), CheckpointError> {
        Ok(self.writer.save(save).await?)
    }

    fn queue_logged(&self, save: LoggedSave) -> WriteReceipt {
        let saved = self.writer.save(save);
        Box::pin(async move { Ok(saved.await?) })
    }

    fn queue_events(&self, events: Vec<LoggedEvent>) -> crate::EventsReceipt {
        Box::pin(self.writer.queue_events(events))
    }

    fn wakeups(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<crate::Wakeup>> {
        if self
            .listening
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return None;
        }
        let (wakeup, wakeups) = tokio::sync::mpsc::unbounded_channel();
        let origin = self.writer.origin().to_owned();
        tokio::spawn(crate::pg_notify::listen(self.pool.clone(), origin, wakeup));
        Some(wakeups)
    }

    async fn count_queued_runs(&self) -> StorageResult<crate::QueuedRuns> {
        let (pending, running): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'pending'), \
             count(*) FILTER (WHERE status = 'running') \
             FROM runs WHERE status IN ('pending', 'running')",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(crate::QueuedRuns { pending, running })
    }

    fn pool_stats(&self) -> crate::PoolStats {
        crate::PoolStats {
            pools: vec![
                crate::ConnectionPool::of("main", &self.pool),
                self.creator.stats(),
            ],
            writer_queue: None,
        }
    }
}
