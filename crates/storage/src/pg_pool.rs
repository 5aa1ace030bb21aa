//! The PostgreSQL connection pool, and when a pooled connection is tested before it is used.
//!
//! sqlx tests every connection it hands out by default (`test_before_acquire`: a round trip
//! before the caller's statement), and tests it again when it comes back. A run creates a
//! thread, reads its assistant and is created through the pool: with both tests, nine round
//! trips for three statements. Measured on 2 cores (create + wait at 16 clients, `bench/pair.py`,
//! 3 alternating pairs), testing before use only when in doubt cut Spindle's CPU per run by
//! 14 % and PostgreSQL's by 8 %.
//!
//! The test is there for connections that died while pooled (PostgreSQL restarted, a proxy or
//! firewall dropped them): without it, their next statement fails. So a connection is still
//! tested when there is reason to doubt it: it has been idle long enough for something on the
//! way to drop it ([`IDLE_TEST`]), or it was last used before this process last saw a
//! connection fail ([`doubt`]: a statement that found its connection gone, the notification
//! listener losing its connection). After a restart the listener, which reads all the time,
//! usually notices first; otherwise the first statement that finds its connection dead fails
//! and the pooled connections are tested from then on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::Connection;

/// Connections of the pool (the writers and the listener have their own).
const MAX_CONNECTIONS: u32 = 16;
/// A connection idle this long is tested before use.
const IDLE_TEST: Duration = Duration::from_secs(10);

/// The pool's options: its size, and connections tested before use only when in doubt.
pub(crate) fn options() -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(Duration::from_secs(10))
        .test_before_acquire(false)
        // A dead connection is dropped, and the pool takes another.
        .before_acquire(|conn, meta| Box::pin(async move { Ok(usable(conn, meta.idle_for).await) }))
}

/// Whether a kept connection, idle for `idle_for`, may be used: at once unless in doubt, else
/// if it answers a test (a round trip). The pool's rule, and the creating task's
/// (`pg_creator`).
pub(crate) async fn usable(conn: &mut PgConnection, idle_for: Duration) -> bool {
    if !in_doubt(idle_for) {
        return true;
    }
    let alive = conn.ping().await.is_ok();
    if !alive {
        tracing::info!("a kept PostgreSQL connection was found closed; replacing it");
    }
    alive
}

/// Connects the pool to `url`.
pub(crate) async fn connect(url: &str) -> sqlx::Result<PgPool> {
    options().connect(url).await
}

/// When this process last saw a connection fail, in milliseconds since [`epoch`]; 0: never.
static LAST_FAILURE_MS: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds since [`epoch`], at least 1 (0 means never).
fn now_ms() -> u64 {
    (epoch().elapsed().as_millis() as u64).max(1)
}

/// Whether a pooled connection, idle for `idle_for`, is to be tested before use.
fn in_doubt(idle_for: Duration) -> bool {
    doubted(idle_for, now_ms(), LAST_FAILURE_MS.load(Ordering::Relaxed))
}

/// Whether a connection idle for `idle_for` at `now` is in doubt, the last failure seen at
/// `failed` (milliseconds since [`epoch`], 0: none): idle for long, or last used no later than
/// that failure (it may have died with the one that failed).
fn doubted(idle_for: Duration, now: u64, failed: u64) -> bool {
    let released = now.saturating_sub(idle_for.as_millis() as u64);
    idle_for >= IDLE_TEST || (failed != 0 && released <= failed)
}

/// Records `error` if it says a connection failed (rather than a statement): every
/// connection pooled before now is tested before its next use.
pub(crate) fn doubt(error: &sqlx::Error) {
    if lost_connection(error) {
        connection_lost();
    }
}

/// A connection of this process to PostgreSQL was lost (the listener's, say).
pub(crate) fn connection_lost() {
    LAST_FAILURE_MS.fetch_max(now_ms(), Ordering::Relaxed);
}

/// Whether `error` is the connection's failure, not the statement's: the transport, or
/// PostgreSQL ending the session (SQLSTATE classes 08, connection exception, and 57,
/// operator intervention: a shutdown, a terminated backend).
pub(crate) fn lost_connection(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn connections_are_tested_when_in_doubt_only() {
        // No failure seen: only a connection idle for long.
        assert!(!doubted(ms(3), 1_000, 0));
        assert!(doubted(IDLE_TEST, 1_000_000, 0));
        // A failure at 1,000 ms: connections released until then are tested, not those used
        // since.
        assert!(doubted(ms(3), 1_002, 1_000), "released at 999");
        assert!(doubted(ms(5), 1_005, 1_000), "released at 1,000");
        assert!(!doubted(ms(5), 1_020, 1_000), "used since, at 1,015");
    }

    /// The glue: a connection's failure puts the connections released before it in doubt.
    #[test]
    fn a_lost_connection_puts_pooled_ones_in_doubt() {
        doubt(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert!(LAST_FAILURE_MS.load(Ordering::Relaxed) > 0);
        assert!(in_doubt(ms(5_000)), "released before the failure");
    }

    #[test]
    fn only_failures_of_the_connection_count() {
        assert!(lost_connection(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::BrokenPipe
        ))));
        assert!(lost_connection(&sqlx::Error::PoolTimedOut));
        assert!(!lost_connection(&sqlx::Error::RowNotFound));
        assert!(!lost_connection(&sqlx::Error::ColumnNotFound("x".into())));
    }
}
