//! Accepting connections and serving HTTP/1.1 on each, with hyper's HTTP/1 connection directly.
//!
//! `axum::serve` goes through hyper-util's `auto` builder, which first reads up to 24 bytes to
//! tell an HTTP/2 preface from HTTP/1 (HTTP/2 is not compiled in: it only ever served HTTP/1).
//! hyper then gets those bytes alone as its first read, and its read buffer (8 KiB) doubles to
//! take the rest of the request head: 16 KiB kept as long as the connection is open, the
//! largest part of what an idle event stream cost. Here the request head lands whole in hyper's
//! 8 KiB buffer. The rest is as `axum::serve` did it: `TCP_NODELAY`, `ConnectInfo`, accept
//! errors retried, upgrades (WebSockets), and a graceful stop.

use axum::extract::{ConnectInfo, Request};
use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Serves `app` on every connection `listener` accepts, until `stopping` is cancelled: then it
/// accepts no more, has each connection close once its response in progress is sent, and
/// returns when all are closed.
pub async fn serve(mut listener: TcpListener, app: Router, stopping: CancellationToken) {
    // Each connection holds a sender; the receiver learns that all are closed when the last
    // sender is dropped.
    let (open, mut all_closed) = mpsc::channel::<()>(1);
    loop {
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
            open.clone(),
        ));
    }
    drop(open);
    drop(listener);
    let _ = all_closed.recv().await;
}

/// Serves one connection until the client closes it, or, once `stopping`, until the response
/// in progress is sent.
async fn connection<S>(
    tcp: TcpStream,
    service: S,
    stopping: CancellationToken,
    _open: mpsc::Sender<()>,
) where
    S: hyper::service::HttpService<Incoming, ResBody = axum::body::Body> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = http1::Builder::new()
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
