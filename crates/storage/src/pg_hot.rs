//! Connections for the hottest single statements (a thread's creation, a run's creation on an
//! idle thread), kept beside sqlx's pool so that they go back without a round trip.
//!
//! sqlx's pool tests every connection as it comes back (a `Sync` and its answer, which sqlx
//! 0.8 sends unconditionally, in `return_to_pool`): of the four round trips a waited run costs
//! the API (`POST /threads`, then the run's creation), two were these tests. A statement that
//! ran to its answer leaves its connection ready for the next (sqlx reads what is left of an
//! answer before the next statement), so these connections go back as they are; one whose
//! statement did not get that far (the caller's future dropped mid-statement, the connection
//! found broken) is closed instead. An idle one is tested before use only when in doubt, by the
//! pool's rule ([`pg_pool::usable`]). When all [`MAX_HOT`] are busy, the caller takes one
//! from the pool as before: the set never makes anyone wait.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, Postgres};
use sqlx::Connection;

use crate::error::{StorageError, StorageResult};
use crate::pg_pool;
use crate::ConnectionPool;

/// Connections in the set at most. The statements take a fraction of a millisecond, so a few
/// cover the concurrency two cores can give them; the pool takes the overflow.
const MAX_HOT: usize = 4;

/// The set: idle connections, and how many exist (idle or in use).
pub(crate) struct HotConnections {
    options: Arc<PgConnectOptions>,
    idle: Mutex<Vec<(PgConnection, Instant)>>,
    open: AtomicUsize,
}

impl HotConnections {
    /// An empty set connecting with `options` (the pool's) as it needs connections.
    pub(crate) fn new(options: Arc<PgConnectOptions>) -> Self {
        Self {
            options,
            idle: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
        }
    }

    /// A connection of the set (an idle one, or a new one while there are fewer than
    /// [`MAX_HOT`]), else one of `pool`. Give it back with [`HotConnection::release`].
    pub(crate) async fn acquire<'a>(&'a self, pool: &PgPool) -> StorageResult<HotConnection<'a>> {
        while let Some((conn, since)) = self.pop_idle() {
            let mut own = Own::new(self, conn);
            if pg_pool::usable(own.conn_mut(), since.elapsed()).await {
                return Ok(HotConnection::Own(own));
            }
            // Dropping `own` closes it; the next idle one is tried.
        }
        if self.reserve() {
            match PgConnection::connect_with(&self.options).await {
                Ok(conn) => return Ok(HotConnection::Own(Own::new(self, conn))),
                Err(error) => {
                    self.open.fetch_sub(1, Ordering::Relaxed);
                    tracing::warn!(%error, "could not open a PostgreSQL connection; using the pool's");
                }
            }
        }
        Ok(HotConnection::Pooled(pool.acquire().await?))
    }

    fn pop_idle(&self) -> Option<(PgConnection, Instant)> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Counts a connection about to be opened, if the set has room for it.
    fn reserve(&self) -> bool {
        self.open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |open| {
                (open < MAX_HOT).then_some(open + 1)
            })
            .is_ok()
    }

    /// Connections in the set (idle or in use).
    fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// The set as a pool in the process's metrics (`spindle_db_connections{pool="creation"}`).
    pub(crate) fn stats(&self) -> ConnectionPool {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).len();
        ConnectionPool {
            name: "creation",
            open: count(self.open()),
            idle: count(idle),
            max: count(MAX_HOT),
        }
    }
}

/// A connection of the set, or of the pool when the set had none to give.
pub(crate) enum HotConnection<'a> {
    Own(Own<'a>),
    Pooled(PoolConnection<Postgres>),
}

impl HotConnection<'_> {
    /// Gives the connection back after `result`, the outcome of its statement, and returns
    /// that: a set's connection goes back to the set as it is unless the error says the
    /// connection itself failed (then it is closed). Dropped without this, it is closed.
    pub(crate) fn release<T>(self, result: StorageResult<T>) -> StorageResult<T> {
        if let HotConnection::Own(mut own) = self {
            own.keep = match &result {
                Err(StorageError::Database(error)) => !pg_pool::lost_connection(error),
                _ => true,
            };
        }
        result
    }
}

impl Deref for HotConnection<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match self {
            HotConnection::Own(own) => own.conn.as_ref().expect("held until dropped"),
            HotConnection::Pooled(conn) => conn,
        }
    }
}

impl DerefMut for HotConnection<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            HotConnection::Own(own) => own.conn_mut(),
            HotConnection::Pooled(conn) => conn,
        }
    }
}

/// A connection taken from the set: back to it when dropped if `keep`, else closed.
pub(crate) struct Own<'a> {
    set: &'a HotConnections,
    conn: Option<PgConnection>,
    keep: bool,
}

impl<'a> Own<'a> {
    fn new(set: &'a HotConnections, conn: PgConnection) -> Self {
        Self {
            set,
            conn: Some(conn),
            keep: false,
        }
    }

    fn conn_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("held until dropped")
    }
}

impl Drop for Own<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if self.keep {
            let mut idle = self.set.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.push((conn, Instant::now()));
        } else {
            // Closing the socket is enough: PostgreSQL ends the session.
            drop(conn);
            self.set.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;
    use std::time::Duration;

    use sqlx::postgres::PgPoolOptions;

    use super::*;

    /// The set and a pool on the test database, or `None` (said on stderr) without one.
    async fn set_and_pool() -> Option<(HotConnections, PgPool)> {
        let Ok(url) = std::env::var("SPINDLE_TEST_POSTGRES_URL") else {
            eprintln!("skipped: SPINDLE_TEST_POSTGRES_URL is not set");
            return None;
        };
        let options = PgConnectOptions::from_str(&url).expect("parse the PostgreSQL URL");
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone())
            .await
            .expect("connect the pool");
        Some((HotConnections::new(Arc::new(options)), pool))
    }

    async fn backend_pid(conn: &mut PgConnection) -> StorageResult<i32> {
        Ok(sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(conn)
            .await?)
    }

    /// Runs `sql` on a connection of the set and gives it back after the outcome.
    async fn run(set: &HotConnections, pool: &PgPool, sql: &str) -> (i32, StorageResult<()>) {
        let mut conn = set.acquire(pool).await.expect("a connection");
        let pid = backend_pid(&mut conn).await.expect("its backend");
        let result = sqlx::query(sql)
            .execute(&mut *conn)
            .await
            .map(drop)
            .map_err(StorageError::from);
        (pid, conn.release(result))
    }

    #[tokio::test]
    async fn a_connection_goes_back_after_its_statement_even_a_failed_one() {
        let Some((set, pool)) = set_and_pool().await else {
            return;
        };
        let (first, ok) = run(&set, &pool, "SELECT 1").await;
        ok.expect("the statement");
        let (second, failed) = run(&set, &pool, "SELECT 1 / 0").await;
        assert!(failed.is_err(), "division by zero fails");
        let (third, ok) = run(&set, &pool, "SELECT 2").await;
        ok.expect("the connection still works after a failed statement");
        assert_eq!(
            (first, first),
            (second, third),
            "one connection, used three times"
        );
        assert_eq!(set.open(), 1);
        let stats = set.stats();
        assert_eq!((stats.open, stats.idle, stats.max), (1, 1, MAX_HOT as u32));
    }

    #[tokio::test]
    async fn a_connection_dropped_mid_statement_is_closed_not_reused() {
        let Some((set, pool)) = set_and_pool().await else {
            return;
        };
        let mut conn = set.acquire(&pool).await.expect("a connection");
        let pid = backend_pid(&mut conn).await.expect("its backend");
        let sleep = sqlx::query("SELECT pg_sleep(5)").execute(&mut *conn);
        assert!(tokio::time::timeout(Duration::from_millis(100), sleep)
            .await
            .is_err());
        drop(conn); // its caller gave up: the answer is still on its way
        assert_eq!(set.open(), 0, "closed");
        let (next, ok) = run(&set, &pool, "SELECT 1").await;
        ok.expect("a new connection");
        assert_ne!(next, pid);
    }

    #[tokio::test]
    async fn a_connection_found_dead_is_replaced() {
        let Some((set, pool)) = set_and_pool().await else {
            return;
        };
        let (pid, _) = run(&set, &pool, "SELECT 1").await;
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&pool)
            .await
            .expect("end its session");
        // PostgreSQL ended the session at once; the set learns it from the next statement (or,
        // had this process seen a failure since, from the test before use).
        let mut conn = set.acquire(&pool).await.expect("a connection");
        let result = backend_pid(&mut conn).await;
        if result.is_err() {
            let _ = conn.release(result);
            assert_eq!(set.open(), 0, "the dead one is closed");
            conn = set.acquire(&pool).await.expect("a connection");
        }
        let next = backend_pid(&mut conn).await.expect("a live connection");
        assert_ne!(next, pid);
        conn.release(Ok(())).expect("given back");
    }

    #[tokio::test]
    async fn the_pool_takes_the_overflow() {
        let Some((set, pool)) = set_and_pool().await else {
            return;
        };
        let mut held = Vec::new();
        for _ in 0..MAX_HOT {
            held.push(set.acquire(&pool).await.expect("a connection"));
        }
        assert!(held.iter().all(|c| matches!(c, HotConnection::Own(_))));
        let mut extra = set.acquire(&pool).await.expect("a connection");
        assert!(matches!(extra, HotConnection::Pooled(_)));
        backend_pid(&mut extra)
            .await
            .expect("the pool's connection works");
        assert_eq!(set.open(), MAX_HOT);
        assert_eq!(set.stats().idle, 0, "all in use");
    }
}
