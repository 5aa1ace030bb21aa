//! The Pregel loop: runs a graph in super-steps.
//!
//! Each step runs the triggered tasks concurrently; their writes are applied together at the
//! step's end in a deterministic order (pulled nodes by name, then `Send`s by position, as
//! LangGraph does), then a checkpoint is saved. A task's writes are saved as soon as it
//! finishes ("pending writes"), so a run resumed after a crash or an interrupt does not run
//! again the tasks of the unfinished step that had finished.

mod input;
mod payloads;
mod persist;
mod run_types;
mod snapshot;
pub(crate) mod state;
mod task;

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::checkpoint::{
    ChannelBlob, CheckpointError, CheckpointRef, Checkpointer, PendingWrite, WriteReceipt,
};
use crate::context::{RunShared, TaskContext};
use crate::events::{run_input_json, EventScope, Traced};
use crate::graph::{Graph, NodeSet};
use crate::node::{Interrupt, NodeError};
use crate::stream::{StreamMode, StreamModes};

pub use run_types::{
    parse_stream_modes, Durability, RunConfig, RunEnv, RunError, RunInput, RunOutcome,
    DEFAULT_RECURSION_LIMIT,
};
pub use snapshot::{
    fork, get_state, get_state_history, get_state_with_subgraphs, inline_subgraph_states,
    prepare_update, prepare_update_at, update_state, NodeUpdate, PreparedUpdate, StateSnapshot,
    StateTask, UpdateError, INPUT,
};
pub use snapshot::{subgraph_at, without_task_ids};
use state::{LoopState, BRANCH_TO, START_INPUT, TASKS};
use task::{Task, TaskKind};

/// Special pending-write channels.
pub(crate) const W_ERROR: &str = "__error__";
pub(crate) const W_INTERRUPT: &str = "__interrupt__";
pub(crate) const W_RESUME: &str = "__resume__";
/// Marks a task that finished without writing anything; one that wrote is known finished by
/// its writes ([`finished`]). Marking every finished task cost 4 of the 10 pending writes a
/// 4-node chain saves per run.
pub(crate) const W_DONE: &str = "__done__";

/// Whether a task whose saved pending writes are `writes` finished: it wrote something other
/// than its error, interrupt or resume values (which a task that did not finish saves), or
/// marked that it wrote nothing ([`W_DONE`]).
pub(crate) fn finished<'w>(mut writes: impl Iterator<Item = &'w PendingWrite>) -> bool {
    writes.any(|w| !matches!(w.channel.as_str(), W_ERROR | W_INTERRUPT | W_RESUME))
}

/// The checkpoint a loop starts from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Origin<'a> {
    /// The thread's latest, if it has one.
    Latest,
    /// This one (time travel); it must exist.
    Checkpoint(&'a str),
    /// None: the thread is known to have no checkpoint, so it is not read.
    Fresh,
}

impl<'a> Origin<'a> {
    /// From [`RunConfig::checkpoint_id`] and [`RunConfig::new_thread`].
    fn of(checkpoint_id: Option<&'a str>, new_thread: bool) -> Self {
        match (checkpoint_id, new_thread) {
            (Some(id), _) => Origin::Checkpoint(id),
            (None, true) => Origin::Fresh,
            (None, false) => Origin::Latest,
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
    run_root(graph, input, cfg, env, false)
        .await
        .map(|(outcome, _)| outcome)
}

/// Run a graph that the caller ends in the database: when the run went to its end (no
/// interrupt, nothing next) and its checkpointer applies saves in the order they are queued
/// ([`Checkpointer::queue`]), the saves still queued are not waited for but handed back with
/// the outcome. Whatever the caller then queues on the same database is applied after them,
/// so a run's end can be written right behind its last checkpoint instead of after its
/// commit; the caller must make that write conditional on the checkpoint
/// ([`RunOutcome::checkpoint`], always set with a receipt) being stored, and may await the
/// receipt to learn why it is not.
/// Any other outcome returns with every save done, as [`run`] does.
pub async fn run_leaving_saves(
    graph: &Arc<Graph>,
    input: RunInput,
    cfg: RunConfig,
    env: RunEnv,
) -> Result<(RunOutcome, Option<WriteReceipt>), RunError> {
    run_root(graph, input, cfg, env, true).await
}

async fn run_root(
    graph: &Arc<Graph>,
    input: RunInput,
    cfg: RunConfig,
    env: RunEnv,
    leave_saves: bool,
) -> Result<(RunOutcome, Option<WriteReceipt>), RunError> {
    // A graph with variants runs the one the run chooses (LangGraph's graph factories).
    let graph = &graph
        .for_run(&cfg.config, &cfg.context)
        .map_err(|message| RunError::Node {
            class: "ValueError".into(),
            message,
            node: None,
            location: None,
        })?;
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
        modes: StreamModes::requested(&cfg.stream_modes),
        stream_subgraphs: cfg.stream_subgraphs,
        cancel: env.cancel,
        checkpointer: env.checkpointer.clone(),
        seen_messages: Default::default(),
        accumulated_messages: Default::default(),
    });
    let trace = shared.wants_events().then(|| root_trace(graph, &shared));
    let saver = cfg.thread_id.as_ref().and(env.checkpointer);
    let origin = Origin::of(cfg.checkpoint_id.as_deref(), cfg.new_thread);
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
        steps_run: 0,
        durability: cfg.durability,
        behind: None,
        saves_ordered: true,
        leave_saves,
        steps_behind: 0,
        exit: Default::default(),
        events: trace.as_ref().map(|t| t.scope.clone()),
        null_resume: None,
    };
    if let Some(t) = &trace {
        let data = json!({"input": run_input_json(&input)});
        t.emit(&lp.run, "on_chain_start", data).await;
    }
    let out = lp.start(input, origin).await.map_err(|e| match e {
        LoopError::Run(r) => r,
        LoopError::Node(n) => RunError::from_node(n),
    })?;
    // An interrupted run ends normally too; a failed one has no end event, as in LangGraph.
    if let Some(t) = &trace {
        let data = json!({"output": out.values});
        t.emit(&lp.run, "on_chain_end", data).await;
    }
    Ok((out, lp.behind.take()))
}

/// The graph run itself in `events`: named after the graph, with the server's run id.
fn root_trace(graph: &Graph, run: &RunShared) -> Traced {
    let run_id = run
        .config
        .pointer("/configurable/run_id")
        .and_then(Value::as_str);
    Traced {
        name: graph.name.clone(),
        scope: EventScope::root(run_id),
        tags: Vec::new(),
        metadata: Value::Object(run.graph_metadata()),
    }
}

/// Run a graph as a node of another (namespace `node:task_id`), resuming its own
/// checkpoint when the parent task is being resumed.
pub(crate) async fn run_subgraph(
    graph: &Arc<Graph>,
    input: Value,
    ctx: &TaskContext,
) -> Result<Value, NodeError> {
    run_below(graph, input, ctx, None).await
}

/// Run a graph for one call a task makes (a graph called as a tool), in its own namespace
/// below the task's (`node:task_id|call`) so that calls running side by side stay apart. It
/// keeps no checkpoints: when the task runs again, the call runs again whole.
pub(crate) async fn run_graph_call(
    graph: &Arc<Graph>,
    input: Value,
    ctx: &TaskContext,
    call: &str,
) -> Result<Value, NodeError> {
    run_below(graph, input, ctx, Some(call)).await
}

async fn run_below(
    graph: &Arc<Graph>,
    input: Value,
    ctx: &TaskContext,
    call: Option<&str>,
) -> Result<Value, NodeError> {
    let run = ctx.run.clone();
    let thread_id = run
        .config
        .pointer("/configurable/thread_id")
        .and_then(Value::as_str)
        .map(str::to_string);
    let saver = match call {
        None => thread_id.as_ref().and(run.checkpointer.clone()),
        Some(_) => None,
    };
    let mut ns = ctx.task_ns();
    ns.extend(call.map(str::to_string));
    let trace = ctx.child_trace(&graph.name, "seq:step:1", || ctx.inner_metadata());
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
        // A subgraph counts its own steps against the run's limit, as LangGraph's do.
        recursion_limit: ctx.recursion_limit,
        steps_run: 0,
        durability: Durability::Sync,
        behind: None,
        saves_ordered: true,
        leave_saves: false,
        steps_behind: 0,
        exit: Default::default(),
        events: trace.as_ref().map(|t| t.scope.clone()),
        null_resume: None,
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
    let traced_input = trace.as_ref().map(|_| input.clone());
    if let (Some(t), Some(i)) = (&trace, &traced_input) {
        t.emit(&ctx.run, "on_chain_start", json!({"input": i}))
            .await;
    }
    let input = match existing {
        Some(t) => {
            let interrupted = t.pending_writes.iter().any(|w| w.channel == W_INTERRUPT);
            let edited = t.metadata.get("source").and_then(Value::as_str) == Some("update");
            match ctx.resume.last() {
                Some(v) if interrupted => RunInput::Command {
                    resume: Some(v.clone()),
                    update: None,
                    goto: Vec::new(),
                },
                // Its state was edited while it waited at an interrupt: the edit has no
                // interrupt to answer, so the resume value goes to the tasks that run next,
                // as LangGraph's null resume does.
                Some(v) if edited => {
                    lp.null_resume = Some(v.clone());
                    RunInput::Continue
                }
                _ => RunInput::Continue,
            }
        }
        None => RunInput::Values(input),
    };
    match lp.start(input, Origin::Latest).await {
        Ok(out) if out.interrupts.is_empty() && out.next.is_empty() => {
            if let (Some(t), Some(i)) = (trace, traced_input) {
                t.end(&ctx.run, "on_chain_end", out.values.clone(), i).await;
            }
            Ok(out.values)
        }
        Ok(out) if !out.interrupts.is_empty() => Err(NodeError::Interrupted(out.interrupts)),
        // A static interrupt inside a subgraph pauses the parent too.
        Ok(_) => Err(NodeError::Interrupted(Vec::new())),
        Err(LoopError::Node(e)) => Err(e),
        Err(LoopError::Run(RunError::Node {
            class,
            message,
            location,
            ..
        })) => Err(NodeError::Failed {
            class,
            message,
            location,
        }),
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
    /// Steps this invocation has run, against `recursion_limit` (scripts read what is left
    /// as `remaining_steps`).
    pub steps_run: usize,
    pub durability: Durability,
    /// Under `Durability::Async`, resolves when every save queued so far is done.
    pub behind: Option<WriteReceipt>,
    /// Whether every save queued so far went through the backend's own queue, so a write
    /// queued on the backend after them is applied after them.
    pub saves_ordered: bool,
    /// The root loop of [`run_leaving_saves`]: a run that goes to its end leaves its queued
    /// saves to the caller (when `saves_ordered`).
    pub leave_saves: bool,
    /// Steps whose saves were queued since `behind` was last waited for.
    pub steps_behind: usize,
    /// What `Durability::Exit` holds back until the run ends.
    pub exit: persist::ExitBuffer,
    /// This graph's run in `events`, when the run streams them.
    pub events: Option<EventScope>,
    /// The resume value for the tasks of the next step that have none of their own (a
    /// subgraph resumed after an edit of its state); used by that step only.
    pub null_resume: Option<Value>,
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

    /// Loads the checkpoint the run starts from; answers its metadata, `None` when there is
    /// none.
    async fn load(&mut self, origin: Origin<'_>) -> Result<Option<Value>, LoopError> {
        let checkpoint_id = match origin {
            Origin::Latest => None,
            Origin::Checkpoint(id) => Some(id),
            Origin::Fresh => return Ok(None),
        };
        let Some(saver) = self.saver.clone() else {
            return Ok(None);
        };
        let Some(t) = saver
            .get_tuple(self.thread(), &self.ns_str, checkpoint_id)
            .await?
        else {
            if let Some(id) = checkpoint_id {
                return Err(RunError::InvalidInput(format!("checkpoint {id} not found")).into());
            }
            return Ok(None);
        };
        self.step = t.metadata.get("step").and_then(Value::as_i64).unwrap_or(-1);
        self.checkpoint_id = Some(t.checkpoint.id.clone());
        self.parent_id = t.parent_id.clone();
        self.pending = t.pending_writes;
        self.state = LoopState::take_checkpoint(&self.graph, t.checkpoint);
        Ok(Some(t.metadata))
    }

    /// Whether a run given the loaded checkpoint (time travel) branches off with a `fork` copy
    /// of it. LangGraph's does, except from the thread's latest checkpoint when a state edit
    /// or an earlier fork made it (source `update` or `fork`): that one is already the start
    /// of its own branch, so the run continues from it as from the latest.
    async fn forks_from_loaded(&self, metadata: &Value) -> Result<bool, LoopError> {
        let source = metadata.get("source").and_then(Value::as_str);
        if !matches!(source, Some("update" | "fork")) {
            return Ok(true);
        }
        let Some(saver) = &self.saver else {
            return Ok(true);
        };
        let latest = saver.get_tuple(self.thread(), &self.ns_str, None).await?;
        Ok(latest.map(|t| t.checkpoint.id) != self.checkpoint_id)
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
                // A reducer's failure: its message names the key (and the script's line).
                LoopError::Run(RunError::Node {
                    class: "InvalidUpdateError".into(),
                    message: format!("graph '{}': {}", self.graph.name, e.message),
                    node: None,
                    location: None,
                })
            })?;
        for i in triggered {
            self.state.trig[i] = version;
        }
        // A join whose sources have all run triggers its target and starts over.
        for join in &self.graph.joins {
            let c = join.channel;
            let arrived = self.state.values[c].as_ref().and_then(Value::as_array);
            let complete = arrived.is_some_and(|a| {
                join.sources
                    .iter()
                    .all(|s| a.iter().any(|x| x.as_str() == Some(s.as_str())))
            });
            if !complete {
                continue;
            }
            if let Some(&t) = self.graph.node_index.get(&join.target) {
                self.state.trig[t] = version;
            }
            self.state.values[c] = Some(json!([]));
            self.state.versions[c] = version;
            self.state.depths[c] = 0;
            let name = &self.graph.channels[c].name;
            blobs.retain(|b| &b.channel != name);
            blobs.push(ChannelBlob {
                channel: name.clone(),
                version,
                value: crate::checkpoint::BlobValue::Full { value: json!([]) },
            });
        }
        let had_sends = !self.state.sends.is_empty();
        self.state.sends = new_sends;
        if had_sends || !self.state.sends.is_empty() {
            self.state.sends_version = version;
            blobs.push(self.state.bookkeeping_blob(TASKS));
            updated.push(TASKS.into());
        }
        if std::mem::take(&mut self.state.start_taken) {
            // The start input was consumed: record it as gone.
            self.state.start_version = version;
            blobs.push(self.state.bookkeeping_blob(START_INPUT));
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
            recursion_limit: self.recursion_limit,
            remaining_steps: self.recursion_limit.saturating_sub(self.steps_run),
            triggers,
            path,
            resume,
            interrupt_counter: Default::default(),
            checkpoint_id: self.checkpoint_id.clone(),
            parents: self.parents.clone(),
            events: self.events.as_ref().map(EventScope::child),
            model_call: Default::default(),
        }
    }

    /// Run steps until nothing is triggered, an interrupt, an error or the step limit.
    async fn steps(&mut self, mut skip_interrupt_before: bool) -> Result<RunOutcome, LoopError> {
        self.steps_run = 0;
        loop {
            if self.run.cancel.is_cancelled() {
                self.flush().await?;
                return Err(RunError::Cancelled.into());
            }
            let tasks = task::prepare(self);
            if tasks.is_empty() {
                break;
            }
            if self.steps_run >= self.recursion_limit {
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
            // Under `Durability::Async` the steps before may still be saving (in order) while
            // this one runs, as LangGraph does: a run of quick steps waits for its saves once,
            // at its end, instead of once per step. A crash loses at most the steps whose saves
            // were still queued, and the run resumes from the last one saved.
            self.bound_saves_behind().await?;
            let result = self.run_step(&tasks).await?;
            self.null_resume = None;
            if let Some((ti, err)) = result.error {
                let t = &tasks[ti];
                if let NodeError::ParentCommand(cmd) = err {
                    self.flush().await?;
                    return Err(LoopError::Node(NodeError::ParentCommand(cmd)));
                }
                if matches!(err, NodeError::Cancelled) {
                    // Not the task's fault: no error is recorded, so a later run retries it.
                    self.flush().await?;
                    self.save_exit().await?;
                    return Err(RunError::Cancelled.into());
                }
                let (class, message, location) = match &err {
                    NodeError::Failed {
                        class,
                        message,
                        location,
                    } => (class.clone(), message.clone(), location.clone()),
                    _ => ("Error".to_string(), err.to_string(), None),
                };
                self.save_writes(vec![PendingWrite {
                    task_id: t.id.clone(),
                    channel: W_ERROR.into(),
                    value: json!({"error": class, "message": message}),
                }])
                .await?;
                self.flush().await?;
                self.save_exit().await?;
                return Err(RunError::Node {
                    class,
                    message,
                    node: Some(t.name.clone()),
                    location,
                }
                .into());
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
            self.steps_run += 1;
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
        let next: Vec<String> = task::prepare(self)
            .iter()
            .map(|t| self.graph.nodes[t.node].name.clone())
            .collect();
        // Only a run that went to its end may leave its saves: its caller ends it from these
        // values, while an interrupted one is ended from its stored checkpoint.
        let went_to_end = interrupts.is_empty() && next.is_empty();
        let leave = self.leave_saves && self.saves_ordered && self.checkpoint_id.is_some();
        if !(went_to_end && leave) {
            self.flush().await?;
        }
        self.save_exit().await?;
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
