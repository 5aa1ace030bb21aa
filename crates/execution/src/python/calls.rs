//! What Spindle does when a worker calls it: `cp.*` on the checkpoint tables, `store.batch`
//! on the store, and a run's `run.events` / `run.done` to the run executing it.
//!
//! A run's saves go through that run's event pump (its `LoggedSaves`), queued on the
//! connection's reader task in arrival order, so each is stored with exactly the events the
//! worker sent before it: the rule the Rust engine's runs keep (see `logged_saves`).
//!
//! Fencing: a call that names a run attempt not executing in this process (it ended, was
//! cancelled, timed out, lost its lease) is answered `fenced`, and the worker stops it. The
//! storage refuses saves of a run deleted meanwhile (a rollback) on its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::FutureExt;
use rmpv::Value as Msg;
use serde::Deserialize;
use serde_json::Value;
use spindle_graph::checkpoint::{Checkpointer, QueuedWrite};
use spindle_graph::stream::StreamEvent;
use spindle_graph::EventSink;
use spindle_storage::{Scope, Storage};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::checkpoints::{self, GetBody, ListBody};
use super::connection::{RemoteError, Reply, WorkerCalls};
use super::frame::from_body;
use super::store_ops::{self, StoreOp};
use crate::store::StoreConfig;

/// A run attempt: `[run_id, attempt]` on the wire.
pub type RunKey = (Uuid, i32);

/// How a run ended, as its worker said (`run.done`).
#[derive(Debug, Clone, Deserialize)]
pub struct RunDone {
    pub status: String,
    #[serde(default)]
    pub error: Option<Value>,
    #[serde(default)]
    pub traceback: Option<String>,
    /// The exception's class and message, then those it came from, on one line (logged only).
    #[serde(default)]
    pub summary: Option<String>,
    /// The node whose task raised the error, when the worker could tell (logged only).
    #[serde(default)]
    pub node: Option<String>,
    /// `{values, next, interrupts}` of the run's last state, JSON bytes.
    #[serde(default, rename = "final")]
    pub final_state: Option<serde_bytes::ByteBuf>,
}

/// A run executing on a worker: where its events and saves go.
pub struct ActiveRun {
    pub sink: EventSink,
    /// The run's checkpointer: saves go through its event pump.
    pub saves: Arc<dyn Checkpointer>,
    /// The run's user, whose store the graph reaches.
    pub scope: Scope,
    pub done: oneshot::Sender<RunDone>,
}

/// What a call made for a run uses: the run's checkpointer and its user.
struct CallingRun {
    saves: Arc<dyn Checkpointer>,
    scope: Scope,
}

/// The worker calls of every worker of a pool.
pub struct SpindleCalls {
    storage: Arc<dyn Storage>,
    reads: Arc<dyn Checkpointer>,
    store: StoreConfig,
    runs: Mutex<HashMap<RunKey, ActiveRun>>,
}

impl SpindleCalls {
    pub fn new(storage: Arc<dyn Storage>, store: StoreConfig) -> Self {
        Self {
            reads: storage.checkpointer(),
            storage,
            store,
            runs: Mutex::new(HashMap::new()),
        }
    }

    /// From now on the run attempt's calls are answered, and its events and end go to `run`.
    pub fn begin(&self, key: RunKey, run: ActiveRun) {
        self.lock().insert(key, run);
    }

    /// Its calls are fenced from now on. Whatever it had not delivered is dropped with it.
    pub fn end(&self, key: RunKey) {
        self.lock().remove(&key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunKey, ActiveRun>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run attempt a call names, if any: `Err(fenced)` when it is not executing here.
    fn run_of(&self, body: &Msg) -> Result<Option<CallingRun>, RemoteError> {
        let Some(key) = run_key(body)? else {
            return Ok(None);
        };
        match self.lock().get(&key) {
            Some(run) => Ok(Some(CallingRun {
                saves: run.saves.clone(),
                scope: run.scope.clone(),
            })),
            None => Err(RemoteError::fenced(format!(
                "run {} attempt {} is no longer executing here",
                key.0, key.1
            ))),
        }
    }

    fn save(&self, op: &str, body: Msg) -> Reply {
        // The run first, by reference: the body (the checkpoint's blobs) is then moved into
        // the save, not copied.
        let run = match self.run_of(&body) {
            Ok(run) => run,
            Err(e) => return ready(Err(e)),
        };
        let parsed = match op {
            "cp.put" => checkpoints::put_write(body),
            _ => checkpoints::writes_write(body).map(|w| (w, Msg::Nil)),
        };
        let (write, reply) = match parsed {
            Ok(parsed) => parsed,
            Err(e) => return ready(Err(e)),
        };
        let receipt = match run {
            // Queued now, on the reader task: behind the events that arrived before it.
            Some(run) => run
                .saves
                .queue(write)
                .unwrap_or_else(|write| apply_later(run.saves.clone(), *write)),
            // A state update outside any run.
            None => apply_later(self.reads.clone(), write),
        };
        Box::pin(async move {
            receipt.await.map_err(|e| save_failed(&e))?;
            Ok(reply)
        })
    }

    fn read(&self, op: &str, body: Msg) -> Reply {
        if let Err(e) = self.run_of(&body) {
            return ready(Err(e));
        }
        let reads = self.reads.clone();
        match op {
            "cp.get" => match checkpoints::parse::<GetBody>(op, body) {
                Ok(get) => Box::pin(async move {
                    let config = get.config;
                    let tuple = reads
                        .get_tuple(
                            &config.thread_id,
                            config.namespace(),
                            config.checkpoint_id.as_deref(),
                        )
                        .await
                        .map_err(|e| RemoteError::internal(e.to_string()))?;
                    match tuple {
                        Some(tuple) => checkpoints::tuple_msg(&tuple),
                        None => Ok(Msg::Nil),
                    }
                }),
                Err(e) => ready(Err(e)),
            },
            _ => match checkpoints::parse::<ListBody>(op, body) {
                Ok(list) => Box::pin(async move { list_tuples(reads.as_ref(), list).await }),
                Err(e) => ready(Err(e)),
            },
        }
    }

    fn store_batch(&self, body: Msg) -> Reply {
        let run = match self.run_of(&body) {
            Ok(run) => run,
            Err(e) => return ready(Err(e)),
        };
        #[derive(Deserialize)]
        struct Batch {
            ops: Vec<StoreOp>,
        }
        let batch: Batch = match checkpoints::parse("store.batch", body) {
            Ok(batch) => batch,
            Err(e) => return ready(Err(e)),
        };
        // Outside a run (a state read), the store is the local user's.
        let scope = run.map_or_else(|| Scope::new(Scope::LOCAL_USER), |run| run.scope);
        let storage = self.storage.clone();
        let config = self.store.clone();
        Box::pin(async move {
            let results = store_ops::batch(&storage, &config, &scope, batch.ops).await?;
            rmpv::ext::to_value(results).map_err(|e| RemoteError::internal(e.to_string()))
        })
    }

    /// A run's events, in the order they came, into its stream. When the stream is full the
    /// rest wait (and so does the connection: the order with later frames must hold).
    fn events(&self, body: Msg) -> Option<BoxFuture<'static, ()>> {
        let key = run_key(&body).ok().flatten()?;
        let sink = self.lock().get(&key)?.sink.clone();
        let events = decode_events(&body);
        let mut pending = events.into_iter();
        for event in pending.by_ref() {
            if let Err(event) = sink.try_send(event) {
                let rest: Vec<StreamEvent> = std::iter::once(event).chain(pending).collect();
                return Some(
                    async move {
                        for event in rest {
                            if !sink.send(event).await {
                                return;
                            }
                        }
                    }
                    .boxed(),
                );
            }
        }
        None
    }

    fn done(&self, body: Msg) {
        let Ok(Some(key)) = run_key(&body) else {
            tracing::warn!("a worker sent run.done without a run");
            return;
        };
        let done: RunDone = match from_body(body) {
            Ok(done) => done,
            Err(e) => RunDone {
                status: "error".into(),
                error: Some(serde_json::json!({
                    "error": "WorkerProtocolError",
                    "message": format!("the worker's run.done was not understood: {e}"),
                })),
                traceback: None,
                summary: None,
                node: None,
                final_state: None,
            },
        };
        // Taken out: nothing of the attempt is accepted after its end.
        if let Some(run) = self.lock().remove(&key) {
            let _ = run.done.send(done);
        }
    }
}

impl WorkerCalls for SpindleCalls {
    fn request(&self, op: &str, body: Msg) -> Reply {
        match op {
            "cp.put" | "cp.writes" => self.save(op, body),
            "cp.get" | "cp.list" => self.read(op, body),
            "store.batch" => self.store_batch(body),
            other => ready(Err(RemoteError::bad_request(format!(
                "unknown operation {other}"
            )))),
        }
    }

    fn event(&self, op: &str, body: Msg) -> Option<BoxFuture<'static, ()>> {
        match op {
            "run.events" => self.events(body),
            "run.done" => {
                self.done(body);
                None
            }
            other => {
                tracing::warn!(op = other, "a worker sent an unknown event");
                None
            }
        }
    }
}

fn ready(result: Result<Msg, RemoteError>) -> Reply {
    Box::pin(std::future::ready(result))
}

/// A save made by awaiting the checkpointer (no queue to keep order with).
fn apply_later(
    saver: Arc<dyn Checkpointer>,
    write: QueuedWrite,
) -> spindle_graph::checkpoint::WriteReceipt {
    // On a task of its own: the receipt must be `Sync`, the checkpointer's future is not.
    let saved = tokio::spawn(async move { write.apply(saver.as_ref()).await });
    Box::pin(async move {
        saved.await.unwrap_or_else(|e| {
            Err(spindle_graph::checkpoint::CheckpointError::Backend(
                format!("the save's task failed: {e}"),
            ))
        })
    })
}

/// A refused save: the run was deleted (a rollback) or its log failed; the attempt is over.
fn save_failed(error: &spindle_graph::checkpoint::CheckpointError) -> RemoteError {
    let message = error.to_string();
    if message.contains("rolled back") {
        RemoteError::fenced(message)
    } else {
        RemoteError::internal(message)
    }
}

/// `run` of a body: `[run_id, attempt]`, or absent.
fn run_key(body: &Msg) -> Result<Option<RunKey>, RemoteError> {
    let run = &body["run"];
    if run.is_nil() {
        return Ok(None);
    }
    let bad = || RemoteError::bad_request("`run` is [run_id, attempt]");
    let id = run[0].as_str().ok_or_else(bad)?;
    let attempt = run[1].as_i64().ok_or_else(bad)?;
    let id = Uuid::parse_str(id).map_err(|_| bad())?;
    Ok(Some((id, i32::try_from(attempt).map_err(|_| bad())?)))
}

/// The `[name, json_bytes]` pairs of a `run.events`, as stream events. One that cannot be
/// read is logged and left out, not fatal to the run.
fn decode_events(body: &Msg) -> Vec<StreamEvent> {
    let Some(pairs) = body["events"].as_array() else {
        return Vec::new();
    };
    let mut events = Vec::with_capacity(pairs.len());
    for pair in pairs {
        let name = pair[0].as_str().unwrap_or_default();
        let Msg::Binary(bytes) = &pair[1] else {
            tracing::warn!(
                event = name,
                "a worker's event has no JSON payload; left out"
            );
            continue;
        };
        let data: Value = match serde_json::from_slice(bytes) {
            Ok(data) => data,
            Err(e) => {
                tracing::warn!(event = name, error = %e, "a worker's event is not JSON; left out");
                continue;
            }
        };
        match StreamEvent::from_name(name, data) {
            Some(event) => events.push(event),
            None => tracing::warn!(
                event = name,
                "a worker's event names no stream mode; left out"
            ),
        }
    }
    events
}

async fn list_tuples(reads: &dyn Checkpointer, list: ListBody) -> Result<Msg, RemoteError> {
    let internal =
        |e: spindle_graph::checkpoint::CheckpointError| RemoteError::internal(e.to_string());
    let Some(config) = &list.config else {
        return Err(RemoteError::bad_request(
            "cp.list needs config.thread_id: Spindle lists one thread's checkpoints",
        ));
    };
    let tuples = match &config.checkpoint_id {
        Some(id) => reads
            .get_tuple(&config.thread_id, config.namespace(), Some(id))
            .await
            .map_err(internal)?
            .into_iter()
            .collect(),
        None => reads
            .list(
                &config.thread_id,
                config.checkpoint_ns.as_deref(),
                &list.filter(),
            )
            .await
            .map_err(internal)?,
    };
    let mut out = Vec::with_capacity(tuples.len());
    for tuple in &tuples {
        out.push(checkpoints::tuple_msg(tuple)?);
    }
    Ok(Msg::Array(out))
}
