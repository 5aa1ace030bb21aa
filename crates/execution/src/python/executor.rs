//! Executes a run of a Python graph on a worker of the pool: the Python side of the execution
//! boundary (the Rust engine is the other; `worker.rs` drives both the same way).
//!
//! The run's events and saves come back through the pool's [`SpindleCalls`], into the same
//! event pump and checkpointer a Rust run uses, so the queue, leases, streams, the durable
//! event log and the end of the run are the same for both.

use std::sync::Arc;
use std::time::Duration;

use rmpv::Value as Msg;
use serde::Serialize;
use serde_json::Value;
use spindle_graph::checkpoint::Checkpointer;
use spindle_graph::EventSink;
use spindle_storage::Scope;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::calls::{ActiveRun, RunDone, RunKey};
use super::connection::{CallError, ErrorCode};
use super::frame::to_body;
use super::pool::PythonPool;

/// How long a cancelled run's worker has to say it stopped before the run ends anyway.
const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// What `run.start` carries (`docs/python-worker-protocol.md`).
#[derive(Debug, Serialize)]
pub struct StartRun {
    pub graph_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<Value>,
    /// LangGraph's whole `RunnableConfig`.
    pub config: Value,
    pub context: Value,
    pub stream_mode: Vec<String>,
    pub subgraphs: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupt_before: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupt_after: Option<Value>,
    pub durability: String,
    pub checkpointer: bool,
}

/// How a run on a worker ended.
#[derive(Debug)]
pub enum PythonEnd {
    /// The worker said so (`run.done`).
    Done(RunDone),
    /// It was cancelled and its worker did not confirm in time (a blocked loop): the run is
    /// over for Spindle, and whatever the worker still sends for it is refused.
    CancelUnconfirmed,
    /// The worker died with the run (or could not be reached): the run goes back to the
    /// queue, to resume from its last checkpoint.
    WorkerLost(String),
    /// The worker refused it (a graph that failed to load): `{error, message}`.
    Refused(Value),
}

/// Where the run's events and saves go while it executes.
pub struct RunRoute {
    pub sink: EventSink,
    pub saves: Arc<dyn Checkpointer>,
    pub scope: Scope,
}

/// Runs `start` as attempt `key` on a worker; `cancel` stops it (a cancel request, a lost
/// lease, a time limit).
pub async fn execute(
    pool: &Arc<PythonPool>,
    key: RunKey,
    start: StartRun,
    route: RunRoute,
    cancel: &CancellationToken,
) -> PythonEnd {
    let slot = tokio::select! {
        slot = pool.acquire() => slot,
        () = cancel.cancelled() => return PythonEnd::Done(cancelled_before_start()),
    };
    let calls = pool.calls().clone();
    let (done_tx, mut done) = oneshot::channel();
    calls.begin(
        key,
        ActiveRun {
            sink: route.sink,
            saves: route.saves,
            scope: route.scope,
            done: done_tx,
        },
    );
    let end = run_on(&slot.worker, key, start, &mut done, cancel).await;
    calls.end(key);
    end
}

async fn run_on(
    worker: &super::pool::PoolWorker,
    key: RunKey,
    start: StartRun,
    done: &mut oneshot::Receiver<RunDone>,
    cancel: &CancellationToken,
) -> PythonEnd {
    let process = worker.process();
    let body = match start_body(key, &start) {
        Ok(body) => body,
        Err(message) => return PythonEnd::Refused(error_body("RunSetupError", &message)),
    };
    match process.connection().request("run.start", body).await {
        Ok(_) => {}
        Err(CallError::Remote(e)) if e.code == ErrorCode::NotFound => {
            return PythonEnd::Refused(error_body("GraphLoadError", &e.message))
        }
        Err(CallError::Remote(e)) => {
            return PythonEnd::Refused(error_body("RunSetupError", &e.message))
        }
        Err(e) => return PythonEnd::WorkerLost(format!("the worker did not take the run: {e}")),
    }
    tokio::select! {
        ended = &mut *done => match ended {
            Ok(ended) => PythonEnd::Done(ended),
            Err(_) => PythonEnd::WorkerLost("the run's route closed".into()),
        },
        exit = process.exited() => PythonEnd::WorkerLost(format!("worker {} {exit}", process.name())),
        () = cancel.cancelled() => cancel_on(worker, key, done).await,
    }
}

/// Asks the worker to stop the run and waits for its `run.done` (with what state it got to).
async fn cancel_on(
    worker: &super::pool::PoolWorker,
    key: RunKey,
    done: &mut oneshot::Receiver<RunDone>,
) -> PythonEnd {
    let process = worker.process();
    let body = Msg::Map(vec![(Msg::from("run"), run_msg(key))]);
    // The grace covers the request too: a worker whose loop is blocked answers neither.
    let confirmed = async {
        // `not_found`: it ended meanwhile; its run.done is on its way.
        let _ = process.connection().request("run.cancel", body).await;
        done.await
    };
    tokio::select! {
        ended = confirmed => match ended {
            Ok(ended) => PythonEnd::Done(ended),
            Err(_) => PythonEnd::CancelUnconfirmed,
        },
        exit = process.exited() => PythonEnd::WorkerLost(format!("worker {} {exit}", process.name())),
        () = tokio::time::sleep(CANCEL_GRACE) => {
            tracing::warn!(worker = %process.name(), "the Python worker did not confirm a cancel in time; the run ends anyway");
            PythonEnd::CancelUnconfirmed
        }
    }
}

fn cancelled_before_start() -> RunDone {
    RunDone {
        status: "cancelled".into(),
        error: None,
        traceback: None,
        summary: None,
        node: None,
        final_state: None,
    }
}

fn run_msg(key: RunKey) -> Msg {
    Msg::Array(vec![
        Msg::from(key.0.to_string()),
        Msg::from(i64::from(key.1)),
    ])
}

fn start_body(key: RunKey, start: &StartRun) -> Result<Msg, String> {
    let mut body = to_body(start).map_err(|e| e.to_string())?;
    if let Msg::Map(entries) = &mut body {
        entries.push((Msg::from("run"), run_msg(key)));
    }
    Ok(body)
}

pub fn error_body(class: &str, message: &str) -> Value {
    serde_json::json!({"error": class, "message": message})
}
