//! Starting a run: the one way every run begins, from the run routes and from crons when they
//! fire. The run is created pending in the queue (its multitask strategy applied in the same
//! transaction); with a free slot in this process it is created claimed and starts at once.

use std::sync::Arc;

use chrono::Utc;
use serde_json::{json, Map, Value};
use spindle_storage::{
    Assistant, AssistantRead, ClaimedRun, FiringId, IfThreadMissing, JsonObject, LoggedEvent,
    MultitaskStrategy, NewRun, ResourceId, Run, Scope, StorageResult, INHERITED_METADATA,
};
use tracing::Instrument;
use uuid::Uuid;

use crate::execute::keys;
use crate::worker::{RunWorkers, CLEANUP_BY_WORKER};

/// What a run is started with, its assistant already found and its parameters already checked.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub assistant: Assistant,
    /// The run's parameters, in the keys `execute` reads (see [`keys`]).
    pub kwargs: JsonObject,
    pub metadata: JsonObject,
    pub multitask_strategy: MultitaskStrategy,
    /// Seconds before the run may start.
    pub after_seconds: f64,
    /// Whether a thread that does not exist is created (else the run is refused).
    pub create_missing_thread: bool,
    pub stateless: Stateless,
    /// The cron firing this run is made for; creating the run ends it.
    pub cron_firing: Option<FiringId>,
}

/// Who removes the thread of a stateless run, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stateless {
    /// A run on a thread the client named.
    No,
    /// `on_completion=keep`: the thread stays.
    Keep,
    /// The handler that streams or waits deletes it once it has answered.
    DeleteAfterResponse,
    /// Nobody waits (`POST /runs`): the worker deletes it when the run ends.
    DeleteByWorker,
}

impl Stateless {
    /// The run's `temporary` kwarg, which tells its worker and its followers.
    fn kwarg(self) -> Option<&'static str> {
        match self {
            Stateless::No => None,
            Stateless::Keep => Some("keep"),
            Stateless::DeleteAfterResponse => Some("response"),
            Stateless::DeleteByWorker => Some(CLEANUP_BY_WORKER),
        }
    }
}

/// A run just created.
pub struct StartedRun {
    pub run: Run,
    /// The seq of the run's first event, logged at its creation when this process claimed it
    /// then.
    claimed_after: Option<i64>,
}

impl StartedRun {
    /// The run's first event, when this process claimed the run at its creation, whose
    /// transaction logged it: a stream of the new run can open with it before the worker has
    /// even started. Made only for the streams that send it, not for every run created.
    pub fn first_event(&self) -> Option<LoggedEvent> {
        let seq = self.claimed_after?;
        Some(crate::start_event(&self.run, seq))
    }
}

impl RunWorkers {
    /// Creates a run on `thread_id` (pending) and wakes a worker, or hands it to one of this
    /// process's free slots at once.
    pub async fn start_run(
        self: &Arc<Self>,
        scope: &Scope,
        thread_id: ResourceId,
        request: RunRequest,
    ) -> StorageResult<StartedRun> {
        let RunRequest {
            assistant,
            mut kwargs,
            metadata,
            multitask_strategy,
            after_seconds,
            create_missing_thread,
            stateless,
            cron_firing,
        } = request;
        if let Some(cleanup) = stateless.kwarg() {
            kwargs.insert(keys::TEMPORARY.into(), json!(cleanup));
        }
        let temporary = stateless != Stateless::No;
        let if_thread_missing = if temporary || create_missing_thread {
            IfThreadMissing::Create {
                metadata: new_thread_metadata(&assistant, &kwargs, &metadata),
            }
        } else {
            IfThreadMissing::Reject
        };
        inherit_assistant_metadata(&mut kwargs, &assistant);
        // With a free slot here, a run that can start now is created claimed and starts at once.
        let slot = self.reserve();
        let delay = chrono::Duration::milliseconds((after_seconds * 1000.0) as i64);
        let new = NewRun {
            run_id: Uuid::now_v7(),
            thread_id,
            assistant_id: assistant.assistant_id,
            assistant_read: Some(AssistantRead::of(&assistant)),
            kwargs,
            metadata,
            multitask_strategy,
            run_after: Utc::now() + delay,
            if_thread_missing,
            claim: slot.as_ref().map(|slot| slot.claim.clone()),
            cron_firing,
        };
        let span = tracing::info_span!("run.create", run_id = %new.run_id, thread_id = %thread_id);
        crate::trace::tag_with_metadata(&span, &new.metadata);
        let created = self.storage.create_run(scope, new).instrument(span).await?;
        self.cancel_local(&created.cancelled);
        let claimed_after = match (created.claimed, slot) {
            (Some(start), Some(slot)) => {
                let claimed = ClaimedRun {
                    run: created.run.clone(),
                    last_seq: start.last_seq,
                    thread_is_new: start.thread_is_new,
                    start_logged: true,
                };
                self.execute_now(slot, claimed, assistant);
                Some(start.last_seq)
            }
            _ => {
                self.wake();
                None
            }
        };
        Ok(StartedRun {
            run: created.run,
            claimed_after,
        })
    }
}

/// The metadata of a thread made for a run (stateless, or `if_not_exists=create`), as LangGraph
/// Platform makes it: the run's graph and assistant (as a run names them in an existing
/// thread's metadata), then its `config.metadata` and its own metadata over them. So what a
/// custom-auth handler stamped on the run (`metadata.owner`) is the thread's too, and its
/// owner can read the thread, join the run and list its runs under the handler's filter.
fn new_thread_metadata(
    assistant: &Assistant,
    kwargs: &Map<String, Value>,
    run_metadata: &Map<String, Value>,
) -> Map<String, Value> {
    let mut metadata = Map::new();
    metadata.insert("graph_id".into(), json!(assistant.fields.graph_id));
    metadata.insert(
        "assistant_id".into(),
        json!(assistant.assistant_id.to_string()),
    );
    if let Some(Value::Object(config_metadata)) =
        kwargs.get("config").and_then(|c| c.get("metadata"))
    {
        metadata.extend(config_metadata.clone());
    }
    metadata.extend(run_metadata.clone());
    metadata
}

/// The metadata a run's graph sees (`config.metadata`, which its checkpoints keep) starts from
/// its assistant's; storage adds its thread's when it creates the run; the run's own comes
/// over both (`execute::run_config`). This is how LangGraph Platform merges them, while the
/// run's record keeps the metadata and config it was created with.
fn inherit_assistant_metadata(kwargs: &mut Map<String, Value>, assistant: &Assistant) {
    if !assistant.fields.metadata.is_empty() {
        kwargs.insert(
            INHERITED_METADATA.into(),
            Value::Object(assistant.fields.metadata.clone()),
        );
    }
}
