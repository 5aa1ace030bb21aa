//! Test helpers: isolated databases of both backends, for this crate's tests and for crates
//! that test against real storage. Enabled by the `test-util` feature.
//!
//! SQLite always runs, on a fresh file in a temporary directory. PostgreSQL runs when
//! [`POSTGRES_URL_ENV`] names a server; each database is then a fresh schema of it (reached
//! through `search_path`), dropped again by [`TestDatabase::remove`] or when the
//! [`TestDatabase`] is dropped, even if the test panicked. When the variable is unset the
//! PostgreSQL variant is skipped, and a banner on stderr says so; set
//! [`REQUIRE_POSTGRES_ENV`] to make that a failure (CI).
//!
//! ```no_run
//! use spindle_storage::test_util::for_each_backend;
//! use spindle_storage::Scope;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // In a `#[tokio::test]`:
//! for_each_backend(|db| async move {
//!     let threads = db.storage().count_threads(&Scope::local(), Default::default()).await;
//!     // A failed assertion is reported with the backend's name.
//!     assert_eq!(threads.unwrap(), 0);
//! })
//! .await;
//! # }
//! ```

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Once};
use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::types::Json;
use sqlx::{Connection, PgConnection};
use tempfile::TempDir;
use uuid::Uuid;

use crate::model::ThreadStatus;
use crate::postgres::PostgresStorage;
use crate::sqlite::SqliteStorage;
use crate::{Backend, ResourceId, Storage};

/// The PostgreSQL server tests use, e.g. `postgres://postgres@127.0.0.1:5432/test`.
pub const POSTGRES_URL_ENV: &str = "SPINDLE_TEST_POSTGRES_URL";
/// When set (to anything but `0`), a missing [`POSTGRES_URL_ENV`] fails the tests.
pub const REQUIRE_POSTGRES_ENV: &str = "SPINDLE_TEST_REQUIRE_POSTGRES";

/// An empty, isolated database: nothing migrated yet.
pub struct TestDatabase {
    backend: Backend,
    url: String,
    place: Place,
    removed: bool,
}

enum Place {
    Sqlite {
        path: PathBuf,
        _dir: TempDir,
    },
    /// A schema of the database at `base_url`; or, with `database`, that database of its own
    /// (created on the server of the `base_url` it replaced), in its `public` schema.
    Postgres {
        base_url: String,
        schema: String,
        database: Option<String>,
    },
}

impl TestDatabase {
    /// A fresh SQLite file in a new temporary directory.
    pub fn sqlite() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("spindle-storage-test-")
            .tempdir()
            .expect("create a temporary directory");
        let path = dir.path().join("spindle.db");
        Self {
            backend: Backend::Sqlite,
            url: path.to_str().expect("temporary path is UTF-8").to_owned(),
            place: Place::Sqlite { path, _dir: dir },
            removed: false,
        }
    }

    /// A fresh schema on the PostgreSQL server at `base_url`.
    pub async fn postgres(base_url: &str) -> Self {
        let schema = format!("spindle_test_{}", Uuid::new_v4().simple());
        create(base_url, "SCHEMA", &schema).await;
        // The application name marks the schema's sessions, so that removing the schema can
        // end them first (see `drop_schema`).
        let separator = if base_url.contains('?') { '&' } else { '?' };
        Self {
            backend: Backend::Postgres,
            url: format!(
                "{base_url}{separator}options[search_path]={schema}&application_name={schema}"
            ),
            place: Place::Postgres {
                base_url: base_url.to_owned(),
                schema,
                database: None,
            },
            removed: false,
        }
    }

    /// A fresh database of its own on the PostgreSQL server at `base_url`, for tests of what
    /// PostgreSQL shares across a database's schemas: its notifications reach every session
    /// of the database, so tests on schemas of one database hear each other's.
    pub async fn postgres_alone(base_url: &str) -> Self {
        let database = format!("spindle_test_{}", Uuid::new_v4().simple());
        create(base_url, "DATABASE", &database).await;
        let own_url = with_database(base_url, &database);
        let separator = if own_url.contains('?') { '&' } else { '?' };
        Self {
            backend: Backend::Postgres,
            url: format!("{own_url}{separator}application_name={database}"),
            place: Place::Postgres {
                base_url: own_url,
                schema: "public".to_owned(),
                database: Some(database),
            },
            removed: false,
        }
    }

    /// SQLite, then PostgreSQL if [`POSTGRES_URL_ENV`] is set (see the module docs).
    pub async fn all() -> Vec<Self> {
        let mut all = vec![Self::sqlite()];
        if let Some(url) = postgres_url() {
            all.push(Self::postgres(&url).await);
        }
        all
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// A URL that reaches exactly this database, for [`crate::connect`] and [`crate::migrate`].
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Opens the storage (which applies the migrations).
    pub async fn open(&self) -> TestDb {
        let (storage, raw): (Arc<dyn Storage>, Raw) = match &self.place {
            Place::Sqlite { path, .. } => {
                let storage = SqliteStorage::open(&self.url)
                    .await
                    .expect("open SQLite storage");
                let options = SqliteConnectOptions::new()
                    .filename(path)
                    .busy_timeout(Duration::from_secs(10));
                let raw = SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(options)
                    .await
                    .expect("open SQLite side connection");
                (Arc::new(storage), Raw::Sqlite(raw))
            }
            Place::Postgres {
                base_url,
                schema,
                database,
            } => {
                let options = PgConnectOptions::from_str(base_url)
                    .expect("parse the PostgreSQL URL")
                    .options([("search_path", schema.as_str())])
                    .application_name(database.as_deref().unwrap_or(schema));
                // The server's pool options, so that tests see how it meets dead connections.
                let pool = crate::pg_pool::options()
                    .max_connections(4)
                    .connect_with(options)
                    .await
                    .expect("connect to PostgreSQL");
                // Two writers, whatever the machine: the binary's default is one on 2 cores
                // (which the end-to-end tests run), and these tests also cover the writes of
                // different threads applied side by side.
                let storage = PostgresStorage::from_pool(pool.clone(), 2)
                    .await
                    .expect("open PostgreSQL storage");
                (Arc::new(storage), Raw::Postgres(pool))
            }
        };
        TestDb {
            storage,
            raw,
            backend: self.backend,
            url: self.url.clone(),
        }
    }

    /// Removes the database. Dropping does it too, but must block the thread to do it.
    pub async fn remove(mut self) {
        self.removed = true;
        if let Place::Postgres {
            base_url,
            schema,
            database,
        } = &self.place
        {
            if let Err(e) = drop_place(base_url, schema, database.as_deref()).await {
                let place = database.as_deref().unwrap_or(schema);
                let _ = writeln!(
                    std::io::stderr(),
                    "warning: could not drop test schema or database {place}: {e}"
                );
            }
        }
    }
}

/// Ends the sessions still using `schema`, then drops it.
///
/// A session can hold locks on the schema's tables: a transaction dropped on an error path is
/// rolled back only when its pooled connection is next tested, by a task of the runtime that
/// ran the test, and that runtime may be gone or blocked by now.
async fn drop_schema(base_url: &str, schema: &str) -> Result<(), sqlx::Error> {
    let mut conn = PgConnection::connect(base_url).await?;
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = $1 AND pid <> pg_backend_pid()",
    )
    .bind(schema)
    .execute(&mut conn)
    .await?;
    sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(&mut conn)
        .await?;
    conn.close().await
}

/// Creates a schema or a database (`kind`) named `name` on the server at `base_url`.
async fn create(base_url: &str, kind: &str, name: &str) {
    let mut conn = PgConnection::connect(base_url)
        .await
        .unwrap_or_else(|e| panic!("{POSTGRES_URL_ENV}={base_url}: cannot connect: {e}"));
    sqlx::query(&format!("CREATE {kind} \"{name}\""))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("create {kind} {name}: {e}"));
    let _ = conn.close().await;
}

/// Drops a test's schema, or its database when it has one of its own.
async fn drop_place(
    base_url: &str,
    schema: &str,
    database: Option<&str>,
) -> Result<(), sqlx::Error> {
    let Some(database) = database else {
        return drop_schema(base_url, schema).await;
    };
    // Connected to the server's default database: one cannot drop the database one is in.
    let mut conn = PgConnection::connect(&with_database(base_url, "postgres")).await?;
    sqlx::query(&format!(
        "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
    ))
    .execute(&mut conn)
    .await?;
    conn.close().await
}

/// `url` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let mut url =
        url::Url::parse(url).unwrap_or_else(|e| panic!("{POSTGRES_URL_ENV}={url}: not a URL: {e}"));
    url.set_path(database);
    url.into()
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let Place::Postgres {
            base_url,
            schema,
            database,
        } = &self.place
        else {
            return;
        };
        if self.removed {
            return;
        }
        // Maybe inside a runtime, maybe unwinding: nothing can be awaited here, but a runtime
        // of its own on its own thread can.
        let (base_url, schema, database) = (base_url.clone(), schema.clone(), database.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime
                .block_on(drop_place(&base_url, &schema, database.as_deref()))
                .map_err(|e| format!("{schema}: {e}"))
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = writeln!(std::io::stderr(), "warning: could not drop test schema {e}");
            }
            Err(_) => {
                let _ = writeln!(std::io::stderr(), "warning: could not drop a test schema");
            }
        }
    }
}

/// An isolated database with the storage open on it.
pub struct TestDb {
    storage: Arc<dyn Storage>,
    raw: Raw,
    backend: Backend,
    url: String,
}

/// A connection beside the storage, for setting up state no storage method writes yet.
enum Raw {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl TestDb {
    pub fn storage(&self) -> &dyn Storage {
        &*self.storage
    }

    pub fn storage_arc(&self) -> Arc<dyn Storage> {
        self.storage.clone()
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn name(&self) -> &'static str {
        self.backend.as_str()
    }

    /// A URL that reaches this database, for [`crate::connect`] and [`crate::migrate`].
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sets what runs will write one day: a thread's status and the values of its latest
    /// checkpoint (and `state_updated_at` to now).
    pub async fn set_thread_state(
        &self,
        id: ResourceId,
        status: ThreadStatus,
        values: Option<Value>,
    ) {
        const SQL: &str = "UPDATE threads SET status = $2, state_values = $3, \
                           state_updated_at = $4 WHERE thread_id = $1";
        let done = match &self.raw {
            Raw::Sqlite(pool) => sqlx::query(SQL)
                .bind(id)
                .bind(status.as_str())
                .bind(values.map(Json))
                .bind(Utc::now())
                .execute(pool)
                .await
                .expect("set thread state")
                .rows_affected(),
            Raw::Postgres(pool) => sqlx::query(SQL)
                .bind(id)
                .bind(status.as_str())
                .bind(values.map(Json))
                .bind(Utc::now())
                .execute(pool)
                .await
                .expect("set thread state")
                .rows_affected(),
        };
        assert_eq!(done, 1, "set_thread_state: no thread {id}");
    }
}

/// What the checkpoint tables hold for one thread: rows, and bytes of stored data (the
/// checkpoint and metadata JSON text, blob and write values), for tests that check how much
/// a step writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct CheckpointFootprint {
    pub checkpoints: i64,
    pub checkpoint_bytes: i64,
    pub blobs: i64,
    pub blob_bytes: i64,
    pub writes: i64,
    pub write_bytes: i64,
}

impl CheckpointFootprint {
    /// Bytes of every kind.
    pub fn bytes(&self) -> i64 {
        self.checkpoint_bytes + self.blob_bytes + self.write_bytes
    }

    /// What was added since `earlier`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            checkpoints: self.checkpoints - earlier.checkpoints,
            checkpoint_bytes: self.checkpoint_bytes - earlier.checkpoint_bytes,
            blobs: self.blobs - earlier.blobs,
            blob_bytes: self.blob_bytes - earlier.blob_bytes,
            writes: self.writes - earlier.writes,
            write_bytes: self.write_bytes - earlier.write_bytes,
        }
    }
}

impl TestDb {
    /// How many checkpoint rows and bytes `thread_id` holds.
    pub async fn checkpoint_footprint(&self, thread_id: &str) -> CheckpointFootprint {
        match &self.raw {
            Raw::Sqlite(pool) => sqlx::query_as(
                "SELECT \
                 (SELECT COUNT(*) FROM checkpoints WHERE thread_id = $1) AS checkpoints, \
                 (SELECT COALESCE(SUM(length(CAST(checkpoint AS BLOB)) \
                     + length(CAST(metadata AS BLOB))), 0) \
                  FROM checkpoints WHERE thread_id = $1) AS checkpoint_bytes, \
                 (SELECT COUNT(*) FROM checkpoint_blobs WHERE thread_id = $1) AS blobs, \
                 (SELECT COALESCE(SUM(length(value)), 0) FROM checkpoint_blobs \
                  WHERE thread_id = $1) AS blob_bytes, \
                 (SELECT COUNT(*) FROM checkpoint_writes WHERE thread_id = $1) AS writes, \
                 (SELECT COALESCE(SUM(length(value)), 0) FROM checkpoint_writes \
                  WHERE thread_id = $1) AS write_bytes",
            )
            .bind(thread_id)
            .fetch_one(pool)
            .await
            .expect("measure checkpoints"),
            Raw::Postgres(pool) => sqlx::query_as(
                "SELECT \
                 (SELECT COUNT(*) FROM checkpoints WHERE thread_id = $1) AS checkpoints, \
                 (SELECT COALESCE(SUM(octet_length(checkpoint::text) \
                     + octet_length(metadata::text)), 0)::bigint \
                  FROM checkpoints WHERE thread_id = $1) AS checkpoint_bytes, \
                 (SELECT COUNT(*) FROM checkpoint_blobs WHERE thread_id = $1) AS blobs, \
                 (SELECT COALESCE(SUM(octet_length(value)), 0)::bigint FROM checkpoint_blobs \
                  WHERE thread_id = $1) AS blob_bytes, \
                 (SELECT COUNT(*) FROM checkpoint_writes WHERE thread_id = $1) AS writes, \
                 (SELECT COALESCE(SUM(octet_length(value)), 0)::bigint FROM checkpoint_writes \
                  WHERE thread_id = $1) AS write_bytes",
            )
            .bind(thread_id)
            .fetch_one(pool)
            .await
            .expect("measure checkpoints"),
        }
    }

    /// Ends every other session on the storage's database, as a restart of PostgreSQL or a
    /// cut network would: the storage's pool and writers must connect again. On SQLite, whose
    /// connections are open files, nothing.
    pub async fn cut_connections(&self) {
        if let Raw::Postgres(pool) = &self.raw {
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = current_setting('application_name') \
                 AND pid <> pg_backend_pid()",
            )
            .execute(pool)
            .await
            .expect("end the storage's sessions");
        }
    }

    /// The query plan the database chooses for `sql` with text parameters `params`, one line
    /// per plan step (`EXPLAIN QUERY PLAN` on SQLite; `EXPLAIN` on PostgreSQL, with sequential
    /// scans disabled).
    pub async fn query_plan(&self, sql: &str, params: &[&str]) -> String {
        match &self.raw {
            Raw::Sqlite(pool) => {
                let explain = format!("EXPLAIN QUERY PLAN {sql}");
                let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain);
                for p in params {
                    query = query.bind(*p);
                }
                let rows = query.fetch_all(pool).await.expect("explain");
                rows.into_iter().map(|r| r.3).collect::<Vec<_>>().join("\n")
            }
            Raw::Postgres(pool) => {
                // A test's tables are tiny, and a sequential scan of a tiny table is cheapest;
                // with it ruled out the plan shows the index path the query would take.
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query("SET LOCAL enable_seqscan = off")
                    .execute(&mut *tx)
                    .await
                    .expect("disable sequential scans");
                let explain = format!("EXPLAIN {sql}");
                let mut query = sqlx::query_scalar::<_, String>(&explain);
                for p in params {
                    query = query.bind(*p);
                }
                query.fetch_all(&mut *tx).await.expect("explain").join("\n")
            }
        }
    }
}

/// The PostgreSQL URL to test against, or `None` after saying loudly that it is skipped.
pub fn postgres_url() -> Option<String> {
    match std::env::var(POSTGRES_URL_ENV) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            if std::env::var(REQUIRE_POSTGRES_ENV).is_ok_and(|v| v != "0") {
                panic!("{REQUIRE_POSTGRES_ENV} is set but {POSTGRES_URL_ENV} is not");
            }
            static BANNER: Once = Once::new();
            BANNER.call_once(|| {
                // Straight to the process's stderr: libtest captures `eprintln!`.
                let _ = writeln!(
                    std::io::stderr(),
                    "\n*** SKIPPED: the PostgreSQL variants of the storage tests did not run, because \
                     {POSTGRES_URL_ENV} is not set. Only SQLite was tested. Set it, e.g. \
                     {POSTGRES_URL_ENV}=postgres://postgres@127.0.0.1:5432/test ***\n"
                );
            });
            None
        }
    }
}

/// A run of the thread: no input, an assistant of its own, queued behind the thread's other
/// runs, due now.
pub fn new_run(thread_id: ResourceId) -> crate::NewRun {
    crate::NewRun {
        run_id: Uuid::new_v4(),
        thread_id,
        assistant_id: ResourceId::generate(),
        assistant_read: None,
        kwargs: crate::JsonObject::new(),
        metadata: crate::JsonObject::new(),
        multitask_strategy: crate::MultitaskStrategy::Enqueue,
        run_after: Utc::now(),
        claim: None,
        if_thread_missing: crate::IfThreadMissing::Reject,
        cron_firing: None,
    }
}

/// Runs `test` once per backend (see [`TestDatabase::all`]), each on a fresh database. Every
/// backend runs even if an earlier one failed; then the failures are reported together, each
/// prefixed with its backend's name.
pub async fn for_each_backend<F, Fut>(test: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    run_on_each(TestDatabase::all().await, test).await
}

/// [`for_each_backend`], with PostgreSQL on a database of its own
/// ([`TestDatabase::postgres_alone`]) instead of a schema.
pub async fn for_each_backend_alone<F, Fut>(test: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut databases = vec![TestDatabase::sqlite()];
    if let Some(url) = postgres_url() {
        databases.push(TestDatabase::postgres_alone(&url).await);
    }
    run_on_each(databases, test).await
}

async fn run_on_each<F, Fut>(databases: Vec<TestDatabase>, test: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut failures = Vec::new();
    for database in databases {
        let name = database.backend().as_str();
        let db = database.open().await;
        // A task, so that a panic is caught and labelled instead of ending the loop.
        let outcome = tokio::spawn(test(db)).await;
        database.remove().await;
        if let Err(e) = outcome {
            let message = if e.is_panic() {
                let payload = e.into_panic();
                payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "(non-string panic)".to_owned())
            } else {
                e.to_string()
            };
            failures.push(format!("[{name}] {message}"));
        }
    }
    if !failures.is_empty() {
        panic!(
            "failed on {} backend(s):\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}
