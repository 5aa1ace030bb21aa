//! Wake-ups across processes on one PostgreSQL database, by `LISTEN`/`NOTIFY`.
//!
//! A process waits for what other processes commit (a run's events, a run to claim, a cancel,
//! a cron change) without polling: whoever commits it notifies, and each process's one
//! listening connection turns the notifications into [`Wakeup`]s. A notification is sent when
//! its transaction commits, never before, so a woken reader finds what it was woken for.
//! Notifications sent while the listener was disconnected are lost; it then says
//! [`Wakeup::Resync`], and whoever waits looks again once.

use sqlx::postgres::{PgListener, PgPool};
use sqlx::{Connection, PgConnection};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::{ResourceId, StorageResult, Wakeup};

/// A thread's log grew: payload `thread_id seq [origin]` lines, the thread's last logged seq
/// and, from a runs' writer, the process whose writer it was (whose own streams were handed
/// those events already).
pub(crate) const LOG: &str = "spindle_log";
/// A run may be claimable now (created pending, or its thread's active run ended). Also
/// sent, as a literal, by `spindle_write_group` (migration 0014).
pub(crate) const RUNS: &str = "spindle_runs";
/// Cancels of running runs: payload run ids, one per line.
pub(crate) const CANCEL: &str = "spindle_cancel";
/// Crons were created, changed or deleted.
pub(crate) const CRONS: &str = "spindle_crons";

/// Most bytes of one payload (PostgreSQL's limit is 8000).
const PAYLOAD_MAX: usize = 7900;

/// Sends `lines` on `channel`, in as few notifications as the payload limit allows. Inside a
/// transaction they are delivered at its commit.
pub(crate) async fn notify(
    conn: &mut PgConnection,
    channel: &str,
    lines: impl IntoIterator<Item = String>,
) -> StorageResult<()> {
    for payload in payloads(lines) {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(channel)
            .bind(payload)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Tells every process's workers that a run may be claimable now (at the commit).
pub(crate) async fn notify_runs(conn: &mut PgConnection) -> StorageResult<()> {
    notify(conn, RUNS, [String::new()]).await
}

/// Tells every process's streams of a thread that it is gone (a seq past any, so that they
/// look, and find it deleted); in the caller's transaction, delivered at its commit.
pub(crate) async fn notify_thread_gone(
    conn: &mut PgConnection,
    thread_id: ResourceId,
) -> StorageResult<()> {
    notify(conn, LOG, [format!("{thread_id} {}", i64::MAX)]).await
}

/// Tells other processes that the thread's log grew to its current `event_seq` (in the
/// caller's transaction, delivered at its commit).
pub(crate) async fn notify_logged(
    conn: &mut PgConnection,
    thread_id: ResourceId,
) -> StorageResult<()> {
    sqlx::query(
        "SELECT pg_notify($1, thread_id || ' ' || event_seq) FROM threads WHERE thread_id = $2",
    )
    .bind(LOG)
    .bind(thread_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Notifications sent after their transactions commit, by one task on a connection of its own.
///
/// A `NOTIFY` takes a lock on the database's notification queue at its transaction's commit
/// and holds it until the commit is flushed, so notifying transactions, of every process,
/// commit one at a time, each waiting for its own WAL flush. The runs' writers notify for
/// nearly every group they commit, hundreds a second: in their transactions, that lock was
/// what they waited for most (`Lock:object` on `COMMIT` in pg_stat_activity). Here lines
/// queue, and the task sends all that is queued in one transaction that has nothing to make
/// durable (`synchronous_commit` off: it waits for no flush), holding the lock for an instant.
///
/// Sent after the commit, a notification still tells only of what is committed. One lost to a
/// crash between the commit and the send only delays a stream in another process until the
/// run's next events (the run is resumed elsewhere, which notifies): notifications whose loss
/// would leave work undone (a run to claim, a cancel) stay in their transactions.
pub(crate) struct Announcer {
    lines: mpsc::UnboundedSender<(&'static str, String)>,
}

/// Most lines one announcing transaction sends.
const ANNOUNCE_MAX: usize = 4096;

impl Announcer {
    /// Starts the announcing task on the current runtime; it stops when this is dropped.
    pub(crate) fn start(pool: PgPool) -> Self {
        let (lines, queued) = mpsc::unbounded_channel();
        tokio::spawn(announce(pool, queued));
        Self { lines }
    }

    /// Queues `line` for `channel`; the caller's transaction has committed.
    pub(crate) fn send(&self, channel: &'static str, line: String) {
        // The task ends only when this is dropped.
        let _ = self.lines.send((channel, line));
    }
}

async fn announce(pool: PgPool, mut queued: mpsc::UnboundedReceiver<(&'static str, String)>) {
    let mut conn = None;
    let mut lines = Vec::with_capacity(ANNOUNCE_MAX);
    while queued.recv_many(&mut lines, ANNOUNCE_MAX).await > 0 {
        let mut channels = Vec::new();
        let mut payloads_of = Vec::new();
        for channel in [LOG, RUNS, CANCEL, CRONS] {
            let of_channel = lines
                .iter()
                .filter(|(c, _)| *c == channel)
                .map(|(_, line)| line.clone());
            for payload in payloads(of_channel) {
                channels.push(channel);
                payloads_of.push(payload);
            }
        }
        lines.clear();
        // Once more on a new connection if the one kept failed (PostgreSQL restarted).
        for attempt in 1..=2 {
            match send_all(&pool, &mut conn, &channels, &payloads_of).await {
                Ok(()) => break,
                Err(error) => {
                    conn = None;
                    crate::pg_pool::doubt(&error);
                    if attempt == 2 {
                        tracing::warn!(%error, lost = payloads_of.len(),
                            "cannot tell other processes of new events; their streams catch up \
                             with the runs' next events");
                    }
                }
            }
        }
    }
}

async fn send_all(
    pool: &PgPool,
    conn: &mut Option<PgConnection>,
    channels: &[&str],
    payloads: &[String],
) -> sqlx::Result<()> {
    if conn.is_none() {
        let options = (*pool.connect_options())
            .clone()
            .options([("synchronous_commit", "off")]);
        *conn = Some(PgConnection::connect_with(&options).await?);
    }
    let conn = conn.as_mut().expect("connected above");
    sqlx::query("SELECT pg_notify(c, p) FROM UNNEST($1::text[], $2::text[]) AS n(c, p)")
        .bind(channels)
        .bind(payloads)
        .execute(conn)
        .await?;
    Ok(())
}

/// Lines joined into payloads under the limit (a line longer than it goes alone).
fn payloads(lines: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut payloads = Vec::new();
    // `None` until a line comes: an empty line is a notification of its own (`RUNS`).
    let mut current: Option<String> = None;
    for line in lines {
        match current.as_mut() {
            Some(payload) if payload.len() + 1 + line.len() <= PAYLOAD_MAX => {
                payload.push('\n');
                payload.push_str(&line);
            }
            _ => payloads.extend(current.replace(line)),
        }
    }
    payloads.extend(current);
    payloads
}

/// Listens on every channel and sends what arrives as [`Wakeup`]s, until `wakeups` is closed.
pub(crate) async fn listen(pool: PgPool, origin: String, wakeups: mpsc::UnboundedSender<Wakeup>) {
    let mut listener = loop {
        match connect(&pool).await {
            Ok(listener) => break listener,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for other processes' notifications; retrying");
                if wait_or_closed(&wakeups).await {
                    return;
                }
            }
        }
    };
    loop {
        let received = tokio::select! {
            received = listener.try_recv() => received,
            () = wakeups.closed() => return,
        };
        let sent = match received {
            Ok(Some(notification)) => {
                parse(notification.channel(), notification.payload(), &origin)
                    .into_iter()
                    .all(|wakeup| wakeups.send(wakeup).is_ok())
            }
            // The connection was lost (sqlx reconnects on the next call): what was sent
            // meanwhile is lost, so whoever waits looks again.
            Ok(None) => {
                tracing::warn!("the notification connection to PostgreSQL was lost; reconnecting");
                // The pool's connections may have gone with it (PostgreSQL restarted).
                crate::pg_pool::connection_lost();
                wakeups.send(Wakeup::Resync).is_ok()
            }
            Err(error) => {
                tracing::warn!(%error, "listening for notifications failed; retrying");
                crate::pg_pool::doubt(&error);
                if wait_or_closed(&wakeups).await {
                    return;
                }
                wakeups.send(Wakeup::Resync).is_ok()
            }
        };
        if !sent {
            return;
        }
    }
}

async fn connect(pool: &PgPool) -> sqlx::Result<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen_all([LOG, RUNS, CANCEL, CRONS]).await?;
    Ok(listener)
}

/// Waits a second before a retry; true when nobody listens any more.
async fn wait_or_closed(wakeups: &mpsc::UnboundedSender<Wakeup>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(std::time::Duration::from_secs(1)) => false,
        () = wakeups.closed() => true,
    }
}

/// A notification's wake-ups; malformed lines are skipped (nothing else sends on these
/// channels, but a stray `NOTIFY` must not stop the listener).
fn parse(channel: &str, payload: &str, origin: &str) -> Vec<Wakeup> {
    match channel {
        LOG => payload
            .lines()
            .filter_map(|line| {
                let mut parts = line.split(' ');
                let (thread, seq) = (parts.next()?, parts.next()?);
                if parts.next() == Some(origin) {
                    // This process's own runs' events: its streams have them.
                    return None;
                }
                Some(Wakeup::Logged {
                    thread_id: thread.parse().ok()?,
                    seq: seq.parse().ok()?,
                })
            })
            .collect(),
        RUNS => vec![Wakeup::RunsQueued],
        CANCEL => payload
            .lines()
            .filter_map(|line| Uuid::parse_str(line).ok())
            .map(|run_id| Wakeup::Cancel { run_id })
            .collect(),
        CRONS => vec![Wakeup::CronsChanged],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_stay_under_the_limit_and_keep_every_line() {
        let lines: Vec<String> = (0..1000).map(|i| format!("thread-{i} {i}")).collect();
        let payloads = payloads(lines.clone());
        assert!(payloads.len() > 1);
        assert!(payloads.iter().all(|p| p.len() <= PAYLOAD_MAX));
        let back: Vec<String> = payloads
            .iter()
            .flat_map(|p| p.lines().map(str::to_owned))
            .collect();
        assert_eq!(back, lines);
    }

    #[test]
    fn a_notification_without_a_payload_is_sent() {
        assert_eq!(payloads([String::new()]), vec![String::new()]);
        assert!(payloads(Vec::<String>::new()).is_empty());
    }

    #[test]
    fn notifications_parse_into_wake_ups() {
        let thread = ResourceId::generate();
        let run = Uuid::new_v4();
        let logged = |seq| Wakeup::Logged {
            thread_id: thread,
            seq,
        };
        assert_eq!(
            parse(LOG, &format!("{thread} 7\nnot a line\n{thread} x"), "me"),
            vec![logged(7)]
        );
        // A process's own writer's lines are its streams' already.
        assert_eq!(
            parse(LOG, &format!("{thread} 8 me\n{thread} 9 other"), "me"),
            vec![logged(9)]
        );
        assert_eq!(parse(RUNS, "", "me"), vec![Wakeup::RunsQueued]);
        assert_eq!(
            parse(CANCEL, &format!("{run}\nnope"), "me"),
            vec![Wakeup::Cancel { run_id: run }]
        );
        assert_eq!(parse(CRONS, "", "me"), vec![Wakeup::CronsChanged]);
        assert!(parse("other", "x", "me").is_empty());
    }
}
