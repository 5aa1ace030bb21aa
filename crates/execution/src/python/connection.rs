//! One connection to a worker: requests both ways, matched by id, and one-way events
//! (`docs/python-worker-protocol.md`, "Frames").
//!
//! Two tasks own the socket. The reader decodes frames and dispatches them in arrival order:
//! a reply to the request waiting for it, an event to [`WorkerCalls::event`], a request to
//! [`WorkerCalls::request`], whose synchronous part runs right there (so it sees frames in
//! the order the worker sent them: a run's events before the save that follows them) and
//! whose future is then awaited on a task of its own (so a slow answer holds up nothing).
//! The writer is the only one that writes: whole frames, in the order they were queued,
//! through a buffer flushed when the queue runs dry (the replies and requests of one burst
//! cost one system call, not one each).

use std::collections::HashMap;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use rmpv::Value;
use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::codec::FramedRead;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::frame::{from_body, to_body, Frame, FrameCodec};

/// Frames queued for the writer before senders wait: enough to keep the socket busy, few
/// enough that a worker that stops reading pushes back instead of growing memory.
const OUTGOING_QUEUE: usize = 256;

/// The writer's buffer: frames smaller than this are gathered until the queue is empty.
const WRITE_BUFFER: usize = 64 * 1024;

/// The answer to a request the worker made: a body for `ok`, or an error for `err`.
pub type Reply = BoxFuture<'static, Result<Value, RemoteError>>;

/// What Spindle does when the worker calls it (`cp.*`, `store.batch`, `run.events`, ...).
///
/// Both methods are called on the reader task, in the order the frames arrived. `request`
/// returns a future rather than being an `async fn` so the work that must follow arrival
/// order (queueing a save behind the events received before it) happens before it returns;
/// the future, awaited on a task of its own, is only the waiting.
pub trait WorkerCalls: Send + Sync + 'static {
    /// A `req` from the worker; the future's result is sent back as `ok` or `err`.
    fn request(&self, op: &str, body: Value) -> Reply;
    /// An `ev` from the worker (`run.events`, `run.done`). A future returned is awaited before
    /// the next frame is read: backpressure, when the run the events are for cannot take them
    /// yet (its stream is full), that keeps them in order with what follows.
    fn event(&self, op: &str, body: Value) -> Option<BoxFuture<'static, ()>>;
}

/// The `code` of an `err` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorCode {
    BadRequest,
    NotFound,
    /// The run attempt the call belongs to is no longer the live one.
    Fenced,
    Conflict,
    Internal,
    /// A code this side does not know, kept as sent.
    Other(String),
}

impl ErrorCode {
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Fenced => "fenced",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Internal => "internal",
            ErrorCode::Other(code) => code,
        }
    }

    fn parse(code: &str) -> ErrorCode {
        match code {
            "bad_request" => ErrorCode::BadRequest,
            "not_found" => ErrorCode::NotFound,
            "fenced" => ErrorCode::Fenced,
            "conflict" => ErrorCode::Conflict,
            "internal" => ErrorCode::Internal,
            other => ErrorCode::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `err` body, `{code, message, retryable}`: what either side answers a request it failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct RemoteError {
    pub code: ErrorCode,
    pub message: String,
    pub retryable: bool,
}

impl RemoteError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RemoteError {
            code,
            message: message.into(),
            retryable: false,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        RemoteError::new(ErrorCode::BadRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        RemoteError::new(ErrorCode::NotFound, message)
    }

    pub fn fenced(message: impl Into<String>) -> Self {
        RemoteError::new(ErrorCode::Fenced, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        RemoteError::new(ErrorCode::Internal, message)
    }

    pub fn retryable(mut self) -> Self {
        self.retryable = true;
        self
    }

    /// Reads an `err` body; one that does not have the shape still yields an error saying so.
    pub fn from_body(body: &Value) -> Self {
        let field = |key: &str| {
            body.as_map()
                .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(key)))
                .map(|(_, v)| v)
        };
        match field("code").and_then(Value::as_str) {
            Some(code) => RemoteError {
                code: ErrorCode::parse(code),
                message: field("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                retryable: field("retryable").and_then(Value::as_bool).unwrap_or(false),
            },
            None => RemoteError::internal(format!("malformed err body: {body}")),
        }
    }

    pub fn to_body(&self) -> Value {
        Value::Map(vec![
            ("code".into(), self.code.as_str().into()),
            ("message".into(), self.message.as_str().into()),
            ("retryable".into(), self.retryable.into()),
        ])
    }
}

/// Why a request to the worker got no answer body.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    /// The worker answered `err`.
    #[error("the worker refused the request: {0}")]
    Remote(#[from] RemoteError),
    /// The connection closed before the answer came; the reason says how it closed.
    #[error("the connection to the worker closed before it answered: {0}")]
    Closed(String),
    /// The request was never sent (it could not be encoded, or is over the frame limit).
    #[error("the request was not sent: {0}")]
    NotSent(String),
    /// The worker answered `ok` with a body of an unexpected shape.
    #[error("the worker's answer has an unexpected shape: {0}")]
    BadReply(String),
}

/// A connection to one worker. Clones share it; it closes when the last clone is dropped,
/// when [`Connection::close`] is called, or when the worker's end closes.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    _close_on_drop: Arc<DropGuard>,
}

type Waiter = oneshot::Sender<Result<Value, CallError>>;

/// What the handles and the two tasks share. The tasks hold this, not a `Connection`, so
/// they do not keep the connection open by themselves.
struct Shared {
    name: String,
    next_id: AtomicU64,
    pending: Mutex<Pending>,
    outgoing: mpsc::Sender<Bytes>,
    stop: CancellationToken,
    closed: watch::Sender<Option<String>>,
}

enum Pending {
    Open(HashMap<u64, Waiter>),
    /// Closed, and why: later requests fail at once with that reason.
    Closed(String),
}

impl Connection {
    /// Starts the reader and writer tasks over `io` (a `UnixStream`, normally). `name` is the
    /// worker's, for logs. Must be called inside a tokio runtime.
    pub fn new<S>(name: impl Into<String>, io: S, calls: Arc<dyn WorkerCalls>) -> Connection
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (outgoing, queued) = mpsc::channel(OUTGOING_QUEUE);
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            name: name.into(),
            next_id: AtomicU64::new(0),
            pending: Mutex::new(Pending::Open(HashMap::new())),
            outgoing,
            stop: stop.clone(),
            closed: watch::channel(None).0,
        });
        let (read, write) = tokio::io::split(io);
        tokio::spawn(write_frames(shared.clone(), write, queued));
        tokio::spawn(read_frames(shared.clone(), read, calls));
        Connection {
            shared,
            _close_on_drop: Arc::new(stop.drop_guard()),
        }
    }

    /// Sends `op` and waits for its answer. Dropping the future forgets the request (its
    /// answer, if it comes, is ignored).
    pub async fn request(&self, op: &str, body: Value) -> Result<Value, CallError> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let frame = Frame::Request {
            id,
            op: op.to_owned(),
            body,
        };
        let bytes = frame
            .to_bytes()
            .map_err(|e| CallError::NotSent(e.to_string()))?;
        let answer = self.shared.register(id)?;
        let _forget = ForgetOnDrop {
            shared: &self.shared,
            id,
        };
        self.shared.send(bytes).await?;
        match answer.await {
            Ok(result) => result,
            Err(_) => Err(CallError::Closed(self.shared.close_reason())),
        }
    }

    /// [`Connection::request`] with a typed body and answer.
    pub async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        op: &str,
        body: &B,
    ) -> Result<R, CallError> {
        let body = to_body(body).map_err(|e| CallError::NotSent(e.to_string()))?;
        let answer = self.request(op, body).await?;
        from_body(answer).map_err(|e| CallError::BadReply(format!("{op}: {e}")))
    }

    /// Queues a one-way event; frames queued by one task go out in the order queued.
    pub async fn send_event(&self, op: &str, body: Value) -> Result<(), CallError> {
        let frame = Frame::Event {
            op: op.to_owned(),
            body,
        };
        let bytes = frame
            .to_bytes()
            .map_err(|e| CallError::NotSent(e.to_string()))?;
        self.shared.send(bytes).await
    }

    /// Closes the connection: pending requests fail, the worker sees EOF.
    pub fn close(&self) {
        self.shared.close("closed by Spindle".into());
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.borrow().is_some()
    }

    /// Resolves when the connection has closed, with the reason.
    pub async fn closed(&self) -> String {
        let mut closed = self.shared.closed.subscribe();
        let reason = closed.wait_for(Option::is_some).await;
        match reason {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => self.shared.close_reason(),
        }
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("name", &self.shared.name)
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Removes a request's waiter when its caller stops waiting (answered, failed or dropped).
struct ForgetOnDrop<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        if let Pending::Open(waiters) = &mut *self.shared.lock_pending() {
            waiters.remove(&self.id);
        }
    }
}

impl Shared {
    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        // A panic while holding this lock cannot leave the map half-changed: recover it.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self, id: u64) -> Result<oneshot::Receiver<Result<Value, CallError>>, CallError> {
        let (tx, rx) = oneshot::channel();
        match &mut *self.lock_pending() {
            Pending::Open(waiters) => {
                waiters.insert(id, tx);
                Ok(rx)
            }
            Pending::Closed(reason) => Err(CallError::Closed(reason.clone())),
        }
    }

    async fn send(&self, bytes: Bytes) -> Result<(), CallError> {
        if self.closed.borrow().is_some() {
            return Err(CallError::Closed(self.close_reason()));
        }
        self.outgoing
            .send(bytes)
            .await
            .map_err(|_| CallError::Closed(self.close_reason()))
    }

    fn close_reason(&self) -> String {
        match &*self.lock_pending() {
            Pending::Closed(reason) => reason.clone(),
            Pending::Open(_) => "the connection is closing".into(),
        }
    }

    /// Closes once: fails every pending request with `reason` and stops both tasks.
    fn close(&self, reason: String) {
        let waiters = {
            let mut pending = self.lock_pending();
            match std::mem::replace(&mut *pending, Pending::Closed(reason.clone())) {
                Pending::Open(waiters) => waiters,
                Pending::Closed(first) => {
                    *pending = Pending::Closed(first);
                    return;
                }
            }
        };
        tracing::debug!(worker = %self.name, %reason, "worker connection closed");
        for (_, waiter) in waiters {
            let _ = waiter.send(Err(CallError::Closed(reason.clone())));
        }
        self.stop.cancel();
        self.closed.send_replace(Some(reason));
    }

    /// Hands an `ok`/`err` to the request waiting for it.
    fn resolve(&self, re: u64, result: Result<Value, CallError>) {
        let waiter = match &mut *self.lock_pending() {
            Pending::Open(waiters) => waiters.remove(&re),
            Pending::Closed(_) => None,
        };
        match waiter {
            Some(waiter) => {
                let _ = waiter.send(result);
            }
            // The caller gave up on it (dropped its future); nothing is wrong with the frame.
            None => tracing::debug!(worker = %self.name, re, "reply to a request no one waits for"),
        }
    }
}

/// The reader task: frames in arrival order, until EOF, a bad frame, or close.
async fn read_frames<R: AsyncRead>(
    shared: Arc<Shared>,
    read: ReadHalf<R>,
    calls: Arc<dyn WorkerCalls>,
) {
    let mut frames = FramedRead::new(read, FrameCodec);
    let reason = loop {
        let next = tokio::select! {
            _ = shared.stop.cancelled() => break "closed by Spindle".to_owned(),
            next = frames.next() => next,
        };
        match next {
            Some(Ok(frame)) => {
                if let Some(wait) = dispatch(&shared, &calls, frame) {
                    wait.await;
                }
            }
            Some(Err(e)) => {
                tracing::warn!(worker = %shared.name, error = %e, "closing the worker connection after a bad frame");
                break format!("the worker sent a bad frame ({e})");
            }
            None => break "the worker closed its end of the socket".to_owned(),
        }
    };
    shared.close(reason);
}

/// Handles one frame; what it returns must be awaited before the next frame is handled.
fn dispatch(
    shared: &Arc<Shared>,
    calls: &Arc<dyn WorkerCalls>,
    frame: Frame,
) -> Option<BoxFuture<'static, ()>> {
    match frame {
        Frame::Ok { re, body } => shared.resolve(re, Ok(body)),
        Frame::Err { re, body } => shared.resolve(re, Err(RemoteError::from_body(&body).into())),
        Frame::Event { op, body } => {
            let handled = std::panic::catch_unwind(AssertUnwindSafe(|| calls.event(&op, body)));
            match handled {
                Ok(wait) => return wait,
                Err(_) => {
                    tracing::error!(worker = %shared.name, %op, "the handler of a worker event panicked")
                }
            }
        }
        Frame::Request { id, op, body } => {
            let started = std::panic::catch_unwind(AssertUnwindSafe(|| calls.request(&op, body)));
            let reply: Reply = match started {
                Ok(reply) => reply,
                Err(_) => Box::pin(async { Err(RemoteError::internal("the handler panicked")) }),
            };
            tokio::spawn(answer(shared.clone(), id, op, reply));
        }
    }
    None
}

/// Awaits one request's handler and queues its `ok` / `err`.
async fn answer(shared: Arc<Shared>, id: u64, op: String, reply: Reply) {
    let result = AssertUnwindSafe(reply)
        .catch_unwind()
        .await
        .unwrap_or_else(|_| {
            Err(RemoteError::internal(format!(
                "the handler of {op} panicked"
            )))
        });
    let frame = match result {
        Ok(body) => Frame::Ok { re: id, body },
        Err(error) => Frame::Err {
            re: id,
            body: error.to_body(),
        },
    };
    let bytes = frame.to_bytes().or_else(|e| {
        tracing::error!(worker = %shared.name, %op, error = %e, "answer to the worker not sendable");
        let error = RemoteError::internal(format!("the answer to {op} could not be sent: {e}"));
        Frame::Err {
            re: id,
            body: error.to_body(),
        }
        .to_bytes()
    });
    if let Ok(bytes) = bytes {
        let _ = shared.send(bytes).await; // closed: the worker is gone, nobody to answer
    }
}

/// The writer task: the only writer of the socket, so frames go out whole and in queue order.
async fn write_frames<W: AsyncWrite>(
    shared: Arc<Shared>,
    write: WriteHalf<W>,
    mut queued: mpsc::Receiver<Bytes>,
) {
    let mut write = BufWriter::with_capacity(WRITE_BUFFER, write);
    let failure = loop {
        let bytes = tokio::select! {
            _ = shared.stop.cancelled() => break None,
            bytes = queued.recv() => match bytes {
                Some(bytes) => bytes,
                None => break None,
            },
        };
        let written = tokio::select! {
            _ = shared.stop.cancelled() => break None,
            written = write_one(&mut write, &bytes, queued.is_empty()) => written,
        };
        if let Err(e) = written {
            break Some(e);
        }
    };
    if let Some(e) = &failure {
        tracing::warn!(worker = %shared.name, error = %e, "writing to the worker failed");
        shared.close(format!("writing to the worker failed: {e}"));
    }
    // The worker exits when it sees EOF.
    let _ = write.shutdown().await;
}

async fn write_one<W: AsyncWrite>(
    write: &mut BufWriter<WriteHalf<W>>,
    bytes: &[u8],
    flush: bool,
) -> std::io::Result<()> {
    write.write_all(bytes).await?;
    if flush {
        write.flush().await?;
    }
    Ok(())
}
