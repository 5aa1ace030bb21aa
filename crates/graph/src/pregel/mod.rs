//! The Pregel loop: runs a graph in super-steps.
//!
//! Each step runs the triggered tasks concurrently; their writes are applied together at the
//! step's end in a deterministic order (pulled nodes by name, then `Send`s by position, as
//! LangGraph does), then a checkpoint is saved. A task's writes are saved as soon as it
//! finishes ("pending writes"), so a run resumed after a crash or an interrupt does not run
//! again the tasks of the unfinished step that had finished.

mod payloads;
mod snapshot;
pub(crate) mod state;
mod task;

use std::sync::Arc;

use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{
    new_checkpoint_id, ChannelBlob, CheckpointError, CheckpointRef, Checkpointer, PendingWrite,
};
use crate::context::{RunShared, TaskContext};
use crate::graph::{Graph, NodeSet, START};
use crate::node::{Goto, Interrupt, NodeError};
use crate::store::Store;
use crate::stream::{StreamEvent, StreamMode, StreamModes};

pub use snapshot::{fork, get_state, get_state_history, update_state, StateSnapshot, StateTask};
use state::{LoopState, BRANCH_TO, START_INPUT, TASKS};
use task::{Task, TaskKind};

/// Special pending-write channels.
pub(crate) const W_ERROR: &str = "__error__";
pub(crate) const W_INTERRUPT: &str = "__interrupt__";
pub(crate) const W_RESUME: &str = "__resume__";
pub(crate) const W_DONE: &str = "__done__";

/// When checkpoints are written (LangGraph's `durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Each checkpoint is saved before the next step starts.
    Sync,
    /// Each checkpoint is saved while the next step runs.
    #[default]
    Async,
    /// Only the last checkpoint of the run is saved.
    Exit,
}

impl Durability {
    /// Parse `sync|async|exit`.
    pub fn parse(s: &str) -> Option<Durability> {
        match s {
            "sync" => Some(Durability::Sync),
            "async" => Some(Durability::Async),
            "exit" => Some(Durability::Exit),
            _ => None,
        }
    }
}

/// What starts a run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunInput {
    /// New input values.
    Values(Value),
    /// LangGraph's `Command`: resume interrupts (a value for every pending interrupt, or
    /// `{interrupt_id: value}`), update the state, and/or go to nodes.
    Command {
        /// Resume value(s).
        resume: Option<Value>,
        /// State update applied before continuing.
        update: Option<Value>,
        /// Nodes to run next.
        goto: Vec<Goto>,
    },
    /// No input: continue from the checkpoint (e.g. after `interrupt_before`).
    Continue,
}

/// Per-run settings.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Thread to checkpoint into; `None` runs without checkpoints.
    pub thread_id: Option<String>,
    /// Start from this checkpoint instead of the latest (time travel / fork).
    pub checkpoint_id: Option<String>,
    /// The config nodes see: `{configurable: {...}, metadata: {...}}`. `metadata` is merged
    /// into checkpoint metadata and task/message stream metadata.
    pub config: Value,
    /// The run context.
    pub context: Value,
    /// Streamed modes.
    pub stream_modes: Vec<StreamMode>,
    /// Stream subgraph events too.
    pub stream_subgraphs: bool,
    /// Maximum number of steps (default 25).
    pub recursion_limit: usize,
    /// Overrides the graph's `interrupt_before`.
    pub interrupt_before: Option<NodeSet>,
    /// Overrides the graph's `interrupt_after`.
    pub interrupt_after: Option<NodeSet>,
    /// When checkpoints are written.
    pub durability: Durability,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            thread_id: None,
            checkpoint_id: None,
            config: json!({}),
            context: json!({}),
            stream_modes: Vec::new(),
            stream_subgraphs: false,
            recursion_limit: 25,
            interrupt_before: None,
            interrupt_after: None,
            durability: Durability::Async,
        }
    }
}

/// What a run reaches besides its graph.
#[derive(Clone, Default)]
pub struct RunEnv {
    /// Checkpointer (needed with a thread id).
    pub checkpointer: Option<Arc<dyn Checkpointer>>,
    /// Long-term store.
    pub store: Option<Arc<dyn Store>>,
    /// Where stream events go.
    pub sink: Option<mpsc::Sender<StreamEvent>>,
    /// Cancels the run.
    pub cancel: CancellationToken,
}

/// How a run ended without error.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    /// Output values.
    pub values: Value,
    /// Pending interrupts (empty when the run finished).
    pub interrupts: Vec<Interrupt>,
    /// Nodes that would run next (non-empty when interrupted).
    pub next: Vec<String>,
    /// The last checkpoint, when checkpointing.
    pub checkpoint: Option<CheckpointRef>,
}

impl RunOutcome {
    /// The values as `/wait` returns them: with `__interrupt__` when interrupted.
    pub fn wait_values(&self) -> Value {
        let mut v = self.values.clone();
        if !self.interrupts.is_empty() {
            if let Value::Object(m) = &mut v {
                m.insert(
                    "__interrupt__".into(),
                    Value::Array(
                        self.interrupts
                            .iter()
                            .map(Interrupt::to_state_json)
                            .collect(),
                    ),
                );
            }
        }
        v
    }
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    /// A node failed (after its retries).
    #[error("{class}: {message}")]
    Node {
        /// Error class, e.g. `ValueError`.
        class: String,
        /// Message.
        message: String,
    },
    /// The step limit was reached.
    #[error("Recursion limit of {0} reached without hitting a stop condition. You can increase the limit by setting the `recursion_limit` config key.")]
    Recursion(usize),
    /// The run was cancelled.
    #[error("run cancelled")]
    Cancelled,
    /// The input was not usable.
    #[error("{0}")]
    InvalidInput(String),
    /// The checkpointer failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl RunError {
    /// The error class clients see (`{"error": class, "message": ...}`).
    pub fn class(&self) -> &str {
        match self {
            RunError::Node { class, .. } => class,
            RunError::Recursion(_) => "GraphRecursionError",
            RunError::Cancelled => "CancelledError",
            RunError::InvalidInput(_) => "InvalidUpdateError",
            RunError::Checkpoint(_) => "CheckpointError",
        }
    }

    /// The message clients see.
    pub fn message(&self) -> String {
        match self {
            RunError::Node { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    fn from_node(e: NodeError) -> RunError {
        match e {
            NodeError::Failed { class, message } => RunError::Node { class, message },
            NodeError::Cancelled => RunError::Cancelled,
            NodeError::Interrupted(_) => RunError::Node {
                class: "GraphInterrupt".into(),
                message: "interrupt outside a task".into(),
            },
            NodeError::ParentCommand(_) => RunError::Node {
                class: "InvalidUpdateError".into(),
                message: "Command(graph=PARENT) used in the root graph".into(),
            },
        }
    }
}

/// Run a graph.
pub async fn run(
    graph: &Arc<Graph>,
    input: RunInput,
    cfg: RunConfig,
    env: RunEnv,
) -> Result<RunOutcome, RunError> {
    // Subgraphs find their thread in `configurable.thread_id`, as LangGraph nodes do.
    let mut config = match cfg.config.clone() {
        Value::Object(m) => Value::Object(m),
        _ => json!({}),
    };
    if let (Some(t), Value::Object(m)) = (&cfg.thread_id, &mut config) {
        let conf = m.entry("configurable").or_insert_with(|| json!({}));
        if let Value::Object(c) = conf {
            c.entry("thread_id").or_insert_with(|| json!(t));
        }
    }
    let shared = Arc::new(RunShared {
        config,
        context: cfg.context.clone(),
        store: env.store,
        sink: env.sink,
        modes: StreamModes::of(&cfg.stream_modes),
        stream_subgraphs: cfg.stream_subgraphs,
        cancel: env.cancel,
        checkpointer: env.checkpointer.clone(),
        seen_messages: Default::default(),
    });
    let saver = cfg.thread_id.as_ref().and(env.checkpointer);
    let mut lp = Loop {
        graph: graph.clone(),
        run: shared,
        ns: Vec::new(),
        ns_str: String::new(),
        thread_id: cfg.thread_id.clone(),
        saver,
        state: LoopState::fresh(graph),
        step: -2,
        checkpoint_id: None,
        parent_id: None,
        parents: Map::new(),
        pending: Vec::new(),
        interrupt_before: cfg
            .interrupt_before
            .unwrap_or_else(|| graph.interrupt_before.clone()),
        interrupt_after: cfg
            .interrupt_after
            .unwrap_or_else(|| graph.interrupt_after.clone()),
        recursion_limit: cfg.recursion_limit,
        durability: cfg.durability,
        inflight: None,
        exit_channels: Default::default(),
    };
    lp.start(input, cfg.checkpoint_id.as_deref())
        .await
        .map_err(|e| match e {
            LoopError::Run(r) => r,
            LoopError::Node(n) => RunError::from_node(n),
        })
}

/// Run a graph as a node of another (namespace `node:task_id`), resuming its own
/// checkpoint when the parent task is being resumed.
pub(crate) async fn run_subgraph(
    graph: &Arc<Graph>,
    input: Value,
    ctx: &TaskContext,
) -> Result<Value, NodeError> {
    let run = ctx.run.clone();
    let thread_id = run
        .config
        .pointer("/configurable/thread_id")
        .and_then(Value::as_str)
        .map(str::to_string);
    let saver = thread_id.as_ref().and(run.checkpointer.clone());
    let ns = ctx.task_ns();
    let mut parents = ctx.parents.clone();
    if let Some(pid) = &ctx.checkpoint_id {
        parents.insert(ctx.graph_ns.join("|"), json!(pid));
    }
    let mut lp = Loop {
        graph: graph.clone(),
        run,
        ns_str: ns.join("|"),
        ns,
        thread_id,
        saver,
        state: LoopState::fresh(graph),
        step: -2,
        checkpoint_id: None,
        parent_id: None,
        parents,
        pending: Vec::new(),
        interrupt_before: graph.interrupt_before.clone(),
        interrupt_after: graph.interrupt_after.clone(),
        recursion_limit: 10_000,
        durability: Durability::Sync,
        inflight: None,
        exit_channels: Default::default(),
    };
    // A saved checkpoint in this namespace means the parent task is running again (resume
    // or crash recovery): continue it instead of starting over.
    let existing = match &lp.saver {
        Some(s) => s
            .get_tuple(
                lp.thread_id.as_deref().unwrap_or_default(),
                &lp.ns_str,
                None,
            )
            .await
            .map_err(|e| NodeError::new("CheckpointError", e.to_string()))?,
        None => None,
    };
    let input = match existing {
        Some(t) => {
            let interrupted = t.pending_writes.iter().any(|w| w.channel == W_INTERRUPT);
            match ctx.resume.last() {
                Some(v) if interrupted => RunInput::Command {
                    resume: Some(v.clone()),
                    update: None,
                    goto: Vec::new(),
                },
                _ => RunInput::Continue,
            }
        }
        None => RunInput::Values(input),
    };
    match lp.start(input, None).await {
        Ok(out) if out.interrupts.is_empty() && out.next.is_empty() => Ok(out.values),
        Ok(out) if !out.interrupts.is_empty() => Err(NodeError::Interrupted(out.interrupts)),
        // A static interrupt inside a subgraph pauses the parent too.
        Ok(_) => Err(NodeError::Interrupted(Vec::new())),
        Err(LoopError::Node(e)) => Err(e),
        Err(LoopError::Run(RunError::Node { class, message })) => {
            Err(NodeError::Failed { class, message })
        }
        Err(LoopError::Run(RunError::Cancelled)) => Err(NodeError::Cancelled),
        Err(LoopError::Run(other)) => {
            Err(NodeError::new(other.class().to_string(), other.message()))
        }
    }
}

pub(crate) enum LoopError {
    Run(RunError),
    /// Errors that subgraphs pass up as they are (parent commands, cancellation).
    Node(NodeError),
}

impl From<RunError> for LoopError {
    fn from(e: RunError) -> Self {
        LoopError::Run(e)
    }
}

impl From<CheckpointError> for LoopError {
    fn from(e: CheckpointError) -> Self {
        LoopError::Run(RunError::Checkpoint(e))
    }
}

/// The loop over one graph (the root or a subgraph).
pub(crate) struct Loop {
    pub graph: Arc<Graph>,
    pub run: Arc<RunShared>,
    pub ns: Vec<String>,
    pub ns_str: String,
    pub thread_id: Option<String>,
    pub saver: Option<Arc<dyn Checkpointer>>,
    pub state: LoopState,
    pub step: i64,
    pub checkpoint_id: Option<String>,
    pub parent_id: Option<String>,
    /// `parents` metadata of checkpoints in this namespace.
    pub parents: Map<String, Value>,
    /// Writes saved against the current checkpoint by tasks of the next step.
    pub pending: Vec<PendingWrite>,
    pub interrupt_before: NodeSet,
    pub interrupt_after: NodeSet,
    pub recursion_limit: usize,
    pub durability: Durability,
    pub inflight: Option<tokio::task::JoinHandle<Result<(), CheckpointError>>>,
    /// Channels changed since the last save, for `Durability::Exit`.
    pub exit_channels: std::collections::BTreeSet<String>,
}

/// What one step produced.
struct StepResult {
    /// (task index, writes) of tasks that finished.
    done: Vec<(usize, Vec<(String, Value)>)>,
    interrupts: Vec<(usize, Vec<Interrupt>)>,
    error: Option<(usize, NodeError)>,
}

impl Loop {
    fn thread(&self) -> &str {
        self.thread_id.as_deref().unwrap_or_default()
    }

    async fn load(&mut self, checkpoint_id: Option<&str>) -> Result<bool, LoopError> {
        let Some(saver) = self.saver.clone() else {
            return Ok(false);
        };
        let Some(t) = saver
            .get_tuple(self.thread(), &self.ns_str, checkpoint_id)
            .await?
        else {
            if let Some(id) = checkpoint_id {
                return Err(RunError::InvalidInput(format!("checkpoint {id} not found")).into());
            }
            return Ok(false);
        };
        self.step = t.metadata.get("step").and_then(Value::as_i64).unwrap_or(-1);
        self.checkpoint_id = Some(t.checkpoint.id.clone());
        self.parent_id = t.parent_id.clone();
        self.pending = t.pending_writes;
        self.state = LoopState::take_checkpoint(&self.graph, t.checkpoint);
        Ok(true)
    }

    async fn start(
        &mut self,
        input: RunInput,
        checkpoint_id: Option<&str>,
    ) -> Result<RunOutcome, LoopError> {
        let loaded = self.load(checkpoint_id).await?;
        // Forking from an older checkpoint: new checkpoints hang below it, and writes saved
        // against it belong to the old branch.
        let forked = checkpoint_id.is_some();
        let mut skip_interrupt_before = false;
        match input {
            RunInput::Values(v) => {
                let Value::Object(_) = &v else {
                    return Err(RunError::InvalidInput(format!(
                        "Expected dict as the run input, got {v}"
                    ))
                    .into());
                };
                self.pending.clear();
                self.state.sends.clear();
                for i in 0..self.graph.nodes.len() {
                    self.state.seen[i] = self.state.trig[i];
                }
                self.input_checkpoint(v).await?;
                self.start_step().await?;
            }
            RunInput::Command {
                resume,
                update,
                goto,
            } => {
                if !loaded && resume.is_some() {
                    return Err(RunError::InvalidInput(
                        "Cannot resume: the thread has no checkpoint".into(),
                    )
                    .into());
                }
                if forked {
                    self.pending
                        .retain(|w| w.channel == W_INTERRUPT || w.channel == W_RESUME);
                }
                if update.is_some() || !goto.is_empty() {
                    self.command_step(update, goto).await?;
                } else {
                    self.emit_resume_start().await;
                }
                if let Some(r) = resume {
                    self.record_resume(r).await?;
                }
                skip_interrupt_before = true;
            }
            RunInput::Continue => {
                if forked {
                    // Time travel: like LangGraph, branch off with a `fork` checkpoint (a copy
                    // one step later) and run the old checkpoint's next tasks from there.
                    self.pending.clear();
                    self.emit_values().await;
                    self.step += 1;
                    self.put_checkpoint("fork", Value::Null, Vec::new(), Vec::new())
                        .await?;
                } else {
                    self.emit_resume_start().await;
                }
                skip_interrupt_before = true;
            }
        }
        // A run that died between its input checkpoint and the start step left the input
        // waiting in `__start__`: consume it now.
        if self.state.start_input.is_some() {
            self.start_step().await?;
        }
        self.steps(skip_interrupt_before).await
    }

    /// On resume the reference first shows the state it resumes from.
    async fn emit_resume_start(&mut self) {
        if self.checkpoint_id.is_none() {
            return;
        }
        self.emit_values().await;
        if self.run.wants(StreamMode::Checkpoints, &self.ns)
            || self.run.wants(StreamMode::Debug, &self.ns)
        {
            if let (Some(saver), Some(id)) = (&self.saver, &self.checkpoint_id) {
                if let Ok(Some(t)) = saver.get_tuple(self.thread(), &self.ns_str, Some(id)).await {
                    self.emit_checkpoint(&t.metadata).await;
                }
            }
        }
    }

    /// Map a resume value to the interrupted tasks, as `__resume__` writes.
    async fn record_resume(&mut self, resume: Value) -> Result<(), LoopError> {
        let interrupted: Vec<(String, Vec<Value>)> = self
            .pending
            .iter()
            .filter(|w| w.channel == W_INTERRUPT)
            .map(|w| {
                (
                    w.task_id.clone(),
                    w.value.as_array().cloned().unwrap_or_default(),
                )
            })
            .collect();
        let by_id = resume.as_object().filter(|m| {
            !m.is_empty()
                && m.keys().all(|k| {
                    interrupted.iter().any(|(_, ints)| {
                        ints.iter()
                            .any(|i| i.get("id").and_then(Value::as_str) == Some(k))
                    })
                })
        });
        let mut new_writes = Vec::new();
        for (task_id, ints) in interrupted {
            let value = match by_id {
                Some(map) => {
                    let hit = ints.iter().find_map(|i| {
                        i.get("id")
                            .and_then(Value::as_str)
                            .and_then(|id| map.get(id))
                    });
                    match hit {
                        Some(v) => v.clone(),
                        None => continue,
                    }
                }
                None => resume.clone(),
            };
            let mut prior: Vec<Value> = self
                .pending
                .iter()
                .find(|w| w.task_id == task_id && w.channel == W_RESUME)
                .and_then(|w| w.value.as_array().cloned())
                .unwrap_or_default();
            prior.push(value);
            new_writes.push(PendingWrite {
                task_id: task_id.clone(),
                channel: W_RESUME.into(),
                value: Value::Array(prior),
            });
        }
        for w in &new_writes {
            self.pending.retain(|p| {
                !(p.task_id == w.task_id && (p.channel == W_RESUME || p.channel == W_INTERRUPT))
            });
            self.pending.push(w.clone());
        }
        self.save_writes(new_writes).await
    }

    async fn save_writes(&mut self, writes: Vec<PendingWrite>) -> Result<(), LoopError> {
        if writes.is_empty() || self.durability == Durability::Exit {
            return Ok(());
        }
        let (Some(saver), Some(cid)) = (self.saver.clone(), self.checkpoint_id.clone()) else {
            return Ok(());
        };
        self.flush().await?;
        saver
            .put_writes(self.thread(), &self.ns_str, &cid, &writes)
            .await?;
        Ok(())
    }

    /// Wait for an asynchronous checkpoint write still in flight.
    async fn flush(&mut self) -> Result<(), LoopError> {
        if let Some(h) = self.inflight.take() {
            h.await
                .map_err(|e| RunError::Checkpoint(CheckpointError::Backend(e.to_string())))??;
        }
        Ok(())
    }

    fn base_metadata(&self, source: &str, writes: Value) -> Value {
        let mut m = match self.run.config.get("metadata") {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        m.insert("source".into(), json!(source));
        m.insert("step".into(), json!(self.step));
        m.insert("parents".into(), Value::Object(self.parents.clone()));
        m.insert("writes".into(), writes);
        Value::Object(m)
    }

    /// Save a new checkpoint of the current state and stream it.
    async fn put_checkpoint(
        &mut self,
        source: &str,
        writes_meta: Value,
        mut blobs: Vec<ChannelBlob>,
        updated: Vec<String>,
    ) -> Result<(), LoopError> {
        let id = new_checkpoint_id();
        let checkpoint = self.state.to_checkpoint(&self.graph, id.clone(), updated);
        let metadata = self.base_metadata(source, writes_meta);
        let parent = self.checkpoint_id.replace(id);
        self.parent_id = parent.clone();
        self.pending.clear();
        if let Some(saver) = self.saver.clone() {
            match self.durability {
                Durability::Exit => {
                    for b in &blobs {
                        self.exit_channels.insert(b.channel.clone());
                    }
                }
                Durability::Sync | Durability::Async => {
                    self.flush().await?;
                    let thread = self.thread().to_string();
                    let ns = self.ns_str.clone();
                    let cp = checkpoint.clone();
                    let md = metadata.clone();
                    if self.durability == Durability::Sync {
                        saver
                            .put(&thread, &ns, &cp, &md, parent.as_deref(), &blobs)
                            .await?;
                    } else {
                        let blobs = std::mem::take(&mut blobs);
                        self.inflight = Some(tokio::spawn(async move {
                            saver
                                .put(&thread, &ns, &cp, &md, parent.as_deref(), &blobs)
                                .await
                        }));
                    }
                }
            }
        }
        self.emit_checkpoint(&metadata).await;
        Ok(())
    }

    /// Under `Durability::Exit`, write the final checkpoint with full copies of every channel
    /// that changed during the run (intermediate deltas were never saved).
    async fn save_exit(&mut self) -> Result<(), LoopError> {
        if self.durability != Durability::Exit || self.exit_channels.is_empty() {
            return Ok(());
        }
        let Some(saver) = self.saver.clone() else {
            return Ok(());
        };
        let mut blobs = Vec::new();
        for name in std::mem::take(&mut self.exit_channels) {
            if name == TASKS || name == START_INPUT {
                blobs.push(self.state.bookkeeping_blob(&name));
                continue;
            }
            if let Some(&i) = self.graph.channel_index.get(&name) {
                self.state.depths[i] = 0;
                blobs.push(ChannelBlob {
                    channel: name,
                    version: self.state.versions[i],
                    value: match &self.state.values[i] {
                        Some(v) => crate::checkpoint::BlobValue::Full { value: v.clone() },
                        None => crate::checkpoint::BlobValue::Empty,
                    },
                });
            }
        }
        let id = self.checkpoint_id.clone().unwrap_or_else(new_checkpoint_id);
        let cp = self.state.to_checkpoint(&self.graph, id, Vec::new());
        let md = self.base_metadata("loop", Value::Null);
        saver
            .put(
                self.thread(),
                &self.ns_str,
                &cp,
                &md,
                self.parent_id.as_deref(),
                &blobs,
            )
            .await?;
        Ok(())
    }

    /// The `input` checkpoint: the input waits in `__start__`.
    async fn input_checkpoint(&mut self, input: Value) -> Result<(), LoopError> {
        self.step += 1;
        let v = self.state.next_version();
        self.state.start_input = Some(input.clone());
        self.state.start_version = v;
        let blob = self.state.bookkeeping_blob(START_INPUT);
        let mut tasks_blob = Vec::new();
        if self.state.sends_version > 0 {
            self.state.sends_version = v;
            tasks_blob.push(self.state.bookkeeping_blob(TASKS));
        }
        let mut blobs = vec![blob];
        blobs.extend(tasks_blob);
        self.put_checkpoint(
            "input",
            json!({START: input}),
            blobs,
            vec![START_INPUT.into()],
        )
        .await
    }

    /// The start step: the input's keys become writes from `__start__`, then `__start__`'s
    /// edges fire. It is not streamed as a task, as in LangGraph.
    async fn start_step(&mut self) -> Result<(), LoopError> {
        let input = self.state.start_input.take().unwrap_or(json!({}));
        let mut writes = Vec::new();
        for (k, v) in input.as_object().into_iter().flatten() {
            if self.graph.input_keys.iter().any(|x| x == k) {
                writes.push((k.clone(), v.clone()));
            }
        }
        // Saved like any task's writes, so history shows the input as the start task's result.
        let start_id = task::task_id(
            self.checkpoint_id.as_deref().unwrap_or_default(),
            &self.ns_str,
            self.step + 1,
            START,
            "pull",
        );
        self.save_writes(task::pending_from(&start_id, &writes))
            .await?;
        let writes = task::normalise_writes(&self.graph, writes)
            .map_err(|e| LoopError::Run(RunError::from_node(e)))?;
        let goto = Vec::new();
        self.apply_start_like(writes, goto, true).await
    }

    /// `Command(update, goto)` as run input: applied like a start step, without its edges.
    async fn command_step(
        &mut self,
        update: Option<Value>,
        goto: Vec<Goto>,
    ) -> Result<(), LoopError> {
        let cmd = crate::node::Command {
            update,
            goto: goto.clone(),
            graph: Default::default(),
        };
        let pairs = cmd
            .update_pairs()
            .map_err(|e| LoopError::Run(RunError::from_node(e)))?;
        let writes = task::normalise_writes(&self.graph, pairs)
            .map_err(|e| LoopError::Run(RunError::from_node(e)))?;
        self.apply_start_like(writes, goto, false).await
    }

    async fn apply_start_like(
        &mut self,
        writes: Vec<(String, Value)>,
        goto: Vec<Goto>,
        follow_start_edges: bool,
    ) -> Result<(), LoopError> {
        let slot = self.graph.nodes.len();
        // The state is only needed when `__start__` has conditional edges.
        let base = if follow_start_edges && !self.graph.out_branches[slot].is_empty() {
            self.state.state_object(&self.graph)
        } else {
            Value::Null
        };
        let mut routed = Vec::new();
        if follow_start_edges {
            let ctx = self.task_context(
                "__start__",
                START,
                Vec::new(),
                json!(["__pregel_pull", START]),
                Vec::new(),
            );
            routed = task::route(&self.graph, slot, &base, &writes, &[], &ctx)
                .await
                .map_err(|e| LoopError::Run(RunError::from_node(e)))?;
        }
        for g in goto {
            routed.extend(
                task::goto_write(&self.graph, &g)
                    .map_err(|e| LoopError::Run(RunError::from_node(e)))?,
            );
        }
        let mut all = writes.clone();
        all.extend(routed);
        let version = self.state.next_version();
        self.step += 1;
        let (blobs, updated) = self.apply_all(&[all], version)?;
        self.emit_values().await;
        let source = if follow_start_edges { "loop" } else { "update" };
        let meta_writes = if follow_start_edges {
            Value::Null
        } else {
            json!({START: Value::Object(writes.into_iter().collect())})
        };
        self.put_checkpoint(source, meta_writes, blobs, updated)
            .await
    }

    /// Apply the writes of several tasks (already in deterministic order).
    fn apply_all(
        &mut self,
        per_task: &[Vec<(String, Value)>],
        version: u64,
    ) -> Result<(Vec<ChannelBlob>, Vec<String>), LoopError> {
        let mut state_writes = Vec::new();
        let mut new_sends = Vec::new();
        let mut triggered = Vec::new();
        for writes in per_task {
            for (ch, v) in writes {
                if let Some(&i) = self.graph.channel_index.get(ch) {
                    state_writes.push((i, v.clone()));
                } else if ch == TASKS {
                    if let (Some(node), Some(arg)) =
                        (v.get("node").and_then(Value::as_str), v.get("arg"))
                    {
                        new_sends.push((node.to_string(), arg.clone()));
                    }
                } else if let Some(node) = ch.strip_prefix(BRANCH_TO) {
                    if let Some(&i) = self.graph.node_index.get(node) {
                        triggered.push(i);
                    }
                }
            }
        }
        let (mut blobs, mut updated) = self
            .state
            .apply(&self.graph, &state_writes, version)
            .map_err(|e| {
                LoopError::Run(RunError::Node {
                    class: "InvalidUpdateError".into(),
                    message: e.message,
                })
            })?;
        for i in triggered {
            self.state.trig[i] = version;
        }
        let had_sends = !self.state.sends.is_empty();
        self.state.sends = new_sends;
        if had_sends || !self.state.sends.is_empty() {
            self.state.sends_version = version;
            blobs.push(self.state.bookkeeping_blob(TASKS));
            updated.push(TASKS.into());
        }
        if self.state.start_version > 0 && self.state.start_input.is_none() {
            // The start input was consumed: record it as gone.
            if !blobs.iter().any(|b| b.channel == START_INPUT) {
                self.state.start_version = version;
                blobs.push(self.state.bookkeeping_blob(START_INPUT));
            }
        }
        Ok((blobs, updated))
    }

    pub(crate) fn task_context(
        &self,
        task_id: &str,
        node: &str,
        triggers: Vec<String>,
        path: Value,
        resume: Vec<Value>,
    ) -> TaskContext {
        TaskContext {
            run: self.run.clone(),
            graph_ns: self.ns.clone(),
            task_id: task_id.to_string(),
            node: node.to_string(),
            step: self.step + 1,
            triggers,
            path,
            resume,
            interrupt_counter: Default::default(),
            checkpoint_id: self.checkpoint_id.clone(),
            parents: self.parents.clone(),
        }
    }

    /// Run steps until nothing is triggered, an interrupt, an error or the step limit.
    async fn steps(&mut self, mut skip_interrupt_before: bool) -> Result<RunOutcome, LoopError> {
        let mut steps_run = 0usize;
        loop {
            if self.run.cancel.is_cancelled() {
                self.flush().await?;
                return Err(RunError::Cancelled.into());
            }
            let tasks = task::prepare(self);
            if tasks.is_empty() {
                break;
            }
            if steps_run >= self.recursion_limit {
                self.flush().await?;
                return Err(RunError::Recursion(self.recursion_limit).into());
            }
            if !skip_interrupt_before
                && tasks.iter().any(|t| {
                    self.interrupt_before
                        .contains(&self.graph.nodes[t.node].name)
                })
            {
                self.run
                    .emit(&self.ns, StreamMode::Updates, json!({"__interrupt__": []}))
                    .await;
                return self.finish(Vec::new()).await;
            }
            skip_interrupt_before = false;
            let result = self.run_step(&tasks).await?;
            if let Some((ti, err)) = result.error {
                let t = &tasks[ti];
                if let NodeError::ParentCommand(cmd) = err {
                    self.flush().await?;
                    return Err(LoopError::Node(NodeError::ParentCommand(cmd)));
                }
                let (class, message) = match &err {
                    NodeError::Failed { class, message } => (class.clone(), message.clone()),
                    NodeError::Cancelled => ("CancelledError".to_string(), "cancelled".to_string()),
                    _ => ("Error".to_string(), err.to_string()),
                };
                self.save_writes(vec![PendingWrite {
                    task_id: t.id.clone(),
                    channel: W_ERROR.into(),
                    value: json!({"error": class, "message": message}),
                }])
                .await?;
                self.flush().await?;
                self.save_exit().await?;
                if matches!(err, NodeError::Cancelled) {
                    return Err(RunError::Cancelled.into());
                }
                return Err(RunError::Node { class, message }.into());
            }
            if !result.interrupts.is_empty() {
                let all: Vec<Interrupt> = result
                    .interrupts
                    .iter()
                    .flat_map(|(_, i)| i.clone())
                    .collect();
                let mut values = self.state.project(&self.graph, &self.graph.output_keys);
                if let Value::Object(m) = &mut values {
                    m.insert(
                        "__interrupt__".into(),
                        Value::Array(all.iter().map(Interrupt::to_stream_json).collect()),
                    );
                }
                self.run.emit(&self.ns, StreamMode::Values, values).await;
                for (ti, ints) in &result.interrupts {
                    payloads::emit_task_result(self, &tasks[*ti], None, &Value::Null, ints).await;
                }
                return self.finish(all).await;
            }
            // Apply in LangGraph's order: pulled tasks by node name, then pushes by position.
            let mut order: Vec<usize> = (0..result.done.len()).collect();
            order.sort_by(|a, b| {
                tasks[result.done[*a].0]
                    .sort_key()
                    .cmp(&tasks[result.done[*b].0].sort_key())
            });
            let per_task: Vec<Vec<(String, Value)>> =
                order.iter().map(|i| result.done[*i].1.clone()).collect();
            for t in &tasks {
                if let TaskKind::Pull = t.kind {
                    self.state.seen[t.node] = self.state.trig[t.node];
                }
            }
            let version = self.state.next_version();
            self.step += 1;
            steps_run += 1;
            let (blobs, updated) = self.apply_all(&per_task, version)?;
            self.emit_values().await;
            let meta_writes = payloads::writes_metadata(&self.graph, &tasks, &result.done);
            self.put_checkpoint("loop", meta_writes, blobs, updated)
                .await?;
            if tasks.iter().any(|t| {
                self.interrupt_after
                    .contains(&self.graph.nodes[t.node].name)
            }) && !task::prepare(self).is_empty()
            {
                self.run
                    .emit(&self.ns, StreamMode::Updates, json!({"__interrupt__": []}))
                    .await;
                return self.finish(Vec::new()).await;
            }
        }
        self.finish(Vec::new()).await
    }

    async fn finish(&mut self, interrupts: Vec<Interrupt>) -> Result<RunOutcome, LoopError> {
        self.flush().await?;
        self.save_exit().await?;
        let next = if interrupts.is_empty() {
            task::prepare(self)
                .iter()
                .map(|t| self.graph.nodes[t.node].name.clone())
                .collect()
        } else {
            task::prepare(self)
                .iter()
                .map(|t| self.graph.nodes[t.node].name.clone())
                .collect()
        };
        Ok(RunOutcome {
            values: self.state.project(&self.graph, &self.graph.output_keys),
            interrupts,
            next,
            checkpoint: self
                .checkpoint_id
                .as_ref()
                .filter(|_| self.saver.is_some())
                .map(|id| CheckpointRef {
                    thread_id: self.thread().to_string(),
                    checkpoint_ns: self.ns_str.clone(),
                    checkpoint_id: id.clone(),
                }),
        })
    }

    /// Run the tasks of one step concurrently, reusing writes saved by tasks that already
    /// finished (resume, crash recovery).
    async fn run_step(&mut self, tasks: &[Task]) -> Result<StepResult, LoopError> {
        let state = self.state.state_object(&self.graph);
        // Every task is announced before any runs, as LangGraph does.
        let announce = self.run.wants(StreamMode::Tasks, &self.ns)
            || self.run.wants(StreamMode::Debug, &self.ns);
        for t in tasks.iter().filter(|_| announce) {
            if !task::already_done(self, t) {
                let input = task::task_input(self, t, &state);
                payloads::emit_task_start(self, t, &input).await;
            }
        }
        let mut futs = Vec::with_capacity(tasks.len());
        for t in tasks {
            futs.push(task::execute(self, t, &state));
        }
        let outcomes = futures::future::join_all(futs).await;
        let mut result = StepResult {
            done: Vec::new(),
            interrupts: Vec::new(),
            error: None,
        };
        let mut to_save = Vec::new();
        for (i, (outcome, fresh)) in outcomes.into_iter().enumerate() {
            match outcome {
                Ok(writes) => {
                    if fresh {
                        to_save.extend(task::pending_from(&tasks[i].id, &writes));
                    }
                    result.done.push((i, writes));
                }
                Err(NodeError::Interrupted(ints)) => {
                    to_save.push(PendingWrite {
                        task_id: tasks[i].id.clone(),
                        channel: W_INTERRUPT.into(),
                        value: Value::Array(ints.iter().map(Interrupt::to_state_json).collect()),
                    });
                    result.interrupts.push((i, ints));
                }
                Err(e) => {
                    if result.error.is_none() {
                        result.error = Some((i, e));
                    }
                }
            }
        }
        self.save_writes(to_save).await?;
        Ok(result)
    }

    /// The `values` event; the state is only copied when someone listens.
    async fn emit_values(&self) {
        if self.run.wants(StreamMode::Values, &self.ns) {
            let values = self.state.project(&self.graph, &self.graph.output_keys);
            self.run.emit(&self.ns, StreamMode::Values, values).await;
        }
    }

    async fn emit_checkpoint(&self, metadata: &Value) {
        payloads::emit_checkpoint(self, metadata).await;
    }
}

/// Convert stream mode names; unknown names are reported.
pub fn parse_stream_modes(names: &[String]) -> Result<Vec<StreamMode>, String> {
    names
        .iter()
        .map(|n| StreamMode::parse(n).ok_or_else(|| format!("unknown stream mode `{n}`")))
        .collect()
}
