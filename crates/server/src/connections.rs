//! Accepting connections and serving HTTP/1.1 on each, with hyper's HTTP/1 connection directly.
//!
//! `axum::serve` goes through hyper-util's `auto` builder, which first reads up to 24 bytes to
//! tell an HTTP/2 preface from HTTP/1 (HTTP/2 is not compiled in: it only ever served HTTP/1).
//! hyper then gets those bytes alone as its first read, and its read buffer (8 KiB) doubles to
//! take the rest of the request head: 16 KiB kept as long as the connection is open, the
//! largest part of what an idle event stream cost. Here the request head lands whole in hyper's
//! 8 KiB buffer. The rest is as `axum::serve` did it: `TCP_NODELAY`, `ConnectInfo`, accept
//! errors retried, upgrades (WebSockets), and a graceful stop.
//!
//! Two bounds keep clients from holding the process's file descriptors ([`ConnectionLimits`]):
//! a request head (request line and headers) must arrive whole within a time, which also closes
//! a kept-alive connection left idle that long, and at most so many connections are served at
//! once; beyond it the next one waits in the listen backlog until one closes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request};
use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long a request head may take and how many connections are served at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A connection whose next request head has not arrived whole this long after it was
    /// accepted (or after its last response) is closed. Without it, a client sending its
    /// headers a byte at a time held its connection for as long as it liked.
    pub header_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
}

/// The default header timeout (hyper's own, which applies only when a timer is given).
pub const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 30;
/// The default connection cap, when the open-file limit allows it (see
/// [`ConnectionLimits::default`]). High: an idle stream costs about 21 KB, and a server holds
/// thousands of conversations' streams; the open-file limit is what the cap protects.
pub const DEFAULT_MAX_CONNECTIONS: usize = 100_000;
/// File descriptors left for what is not a client connection: database connections, SQLite's
/// files, the Python workers' pipes, webhook and model calls.
const RESERVED_DESCRIPTORS: usize = 256;

impl Default for ConnectionLimits {
    /// [`DEFAULT_MAX_CONNECTIONS`], or fewer when the process's open-file limit would run out
    /// first (`ulimit -n`, often 1,024).
    fn default() -> Self {
        let fit = open_file_limit().map_or(DEFAULT_MAX_CONNECTIONS, |limit| {
            limit.saturating_sub(RESERVED_DESCRIPTORS).max(16)
        });
        Self {
            header_timeout: Duration::from_secs(DEFAULT_HEADER_TIMEOUT_SECS),
            max_connections: fit.min(DEFAULT_MAX_CONNECTIONS),
        }
    }
}

/// The process's soft limit on open files, when it has one.
#[cfg(unix)]
fn open_file_limit() -> Option<usize> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (read == 0 && limit.rlim_cur != libc::RLIM_INFINITY)
        .then(|| usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX))
}

#[cfg(not(unix))]
fn open_file_limit() -> Option<usize> {
    None
}

/// Serves `app` on every connection `listener` accepts, until `stopping` is cancelled: then it
/// accepts no more, has each connection close once its response in progress is sent, and
/// returns when all are closed.
pub async fn serve(
    mut listener: TcpListener,
    app: Router,
    stopping: CancellationToken,
    limits: ConnectionLimits,
) {
    // Each connection holds a sender; the receiver learns that all are closed when the last
    // sender is dropped.
    let (open, mut all_closed) = mpsc::channel::<()>(1);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut full_since_warned: Option<Instant> = None;
    loop {
        // A free slot before accepting: at the cap, connections wait in the kernel's backlog
        // and cost this process nothing.
        let slot = tokio::select! {
            slot = free_slot(&slots, limits.max_connections, &mut full_since_warned) => slot,
            () = stopping.cancelled() => break,
        };
        let (tcp, remote) = tokio::select! {
            // Retries what a failed accept allows (as `axum::serve` does: at once after a
            // connection's own error, after a second when out of file descriptors).
            accepted = Listener::accept(&mut listener) => accepted,
            () = stopping.cancelled() => break,
        };
        // Without TCP_NODELAY a response written as headers then body waits for the client's
        // delayed ACK (~40 ms per request on a kept-alive connection).
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::warn!(error = %err, "cannot set TCP_NODELAY on a connection");
        }
        let service = app
            .clone()
            .map_request(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(remote));
                request
            });
        tokio::spawn(connection(
            tcp,
            TowerToHyperService::new(service),
            stopping.clone(),
            limits.header_timeout,
            (open.clone(), slot),
        ));
    }
    drop(open);
    drop(listener);
    let _ = all_closed.recv().await;
}

/// A permit to serve one more connection, once one is free. Says so (at most once a minute)
/// when the cap is reached, since clients then wait.
async fn free_slot(
    slots: &Arc<Semaphore>,
    max: usize,
    warned: &mut Option<Instant>,
) -> OwnedSemaphorePermit {
    if let Ok(slot) = slots.clone().try_acquire_owned() {
        return slot;
    }
    if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
        *warned = Some(Instant::now());
        tracing::warn!(
            max_connections = max,
            "the connection limit is reached; new connections wait until one closes \
             (--max-connections)"
        );
    }
    slots
        .clone()
        .acquire_owned()
        .await
        .expect("the connection semaphore is never closed")
}

/// Serves one connection until the client closes it, its next request head is late, or, once
/// `stopping`, until the response in progress is sent. `_held` (the open connections' count and
/// this connection's slot) is released when it ends.
async fn connection<S>(
    tcp: TcpStream,
    service: S,
    stopping: CancellationToken,
    header_timeout: Duration,
    _held: (mpsc::Sender<()>, OwnedSemaphorePermit),
) where
    S: hyper::service::HttpService<Incoming, ResBody = axum::body::Body> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = http1::Builder::new()
        // hyper applies its header timeout only with a timer.
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(tcp), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let served = tokio::select! {
        served = conn.as_mut() => served,
        () = stopping.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(err) = served {
        tracing::trace!(error = %err, "connection ended with an error");
    }
}
