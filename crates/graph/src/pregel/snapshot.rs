//! Thread state views (`get_state`, history) and state edits (`update_state`, fork).

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::state::{LoopState, START_INPUT, TASKS};
use super::task::{normalise_writes, prepare_parts, route, route_place};
use super::{finished, W_ERROR, W_INTERRUPT};
use crate::checkpoint::{
    new_checkpoint_id, ChannelBlob, Checkpoint, CheckpointError, CheckpointRef, CheckpointTuple,
    Checkpointer, ListFilter,
};
use crate::context::{RunShared, TaskContext};
use crate::graph::{Graph, END, START};
use crate::node::{Command, Goto, Interrupt, NodeError};
use crate::stream::StreamModes;

/// A task of a thread's next step, as thread state shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct StateTask {
    /// Task id.
    pub id: String,
    /// Node name.
    pub name: String,
    /// `["__pregel_pull", name]` or `["__pregel_push", i, false]`.
    pub path: Value,
    /// `{error, message}` when it failed.
    pub error: Option<Value>,
    /// Its pending interrupts.
    pub interrupts: Vec<Interrupt>,
    /// For a subgraph task: where its checkpoints are.
    pub checkpoint: Option<CheckpointRef>,
    /// Its writes when it already finished.
    pub result: Option<Value>,
    /// For a subgraph task, with [`get_state_with_subgraphs`]: the subgraph's own state.
    pub state: Option<Box<StateSnapshot>>,
}

/// A thread's state at a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct StateSnapshot {
    /// State values.
    pub values: Value,
    /// Nodes of the next step.
    pub next: Vec<String>,
    /// Tasks of the next step.
    pub tasks: Vec<StateTask>,
    /// Checkpoint metadata.
    pub metadata: Value,
    /// Checkpoint time.
    pub created_at: String,
    /// The checkpoint.
    pub checkpoint: CheckpointRef,
    /// Its parent.
    pub parent_checkpoint: Option<CheckpointRef>,
    /// Pending interrupts of all tasks.
    pub interrupts: Vec<Interrupt>,
}

impl StateSnapshot {
    /// The state of a thread (or subgraph) that has no checkpoint: no values, nothing next.
    /// Its checkpoint id is empty, and [`StateSnapshot::to_json`] shows it as LangGraph does
    /// such a state (checkpoint, metadata and time `null`).
    pub fn empty(thread_id: &str, checkpoint_ns: &str) -> Self {
        StateSnapshot {
            values: json!({}),
            next: Vec::new(),
            tasks: Vec::new(),
            metadata: Value::Null,
            created_at: String::new(),
            checkpoint: CheckpointRef {
                thread_id: thread_id.to_string(),
                checkpoint_ns: checkpoint_ns.to_string(),
                checkpoint_id: String::new(),
            },
            parent_checkpoint: None,
            interrupts: Vec::new(),
        }
    }

    /// Whether this is the state of no checkpoint ([`StateSnapshot::empty`]).
    pub fn is_empty(&self) -> bool {
        self.checkpoint.checkpoint_id.is_empty()
    }

    /// The JSON LangGraph's `/threads/{id}/state` returns.
    pub fn to_json(&self) -> Value {
        if self.is_empty() {
            return json!({
                "values": self.values, "next": [], "tasks": [], "metadata": null,
                "created_at": null, "checkpoint": null, "parent_checkpoint": null,
                "interrupts": [], "checkpoint_id": null, "parent_checkpoint_id": null,
            });
        }
        let cp = |r: &CheckpointRef| json!({"checkpoint_id": r.checkpoint_id, "thread_id": r.thread_id, "checkpoint_ns": r.checkpoint_ns});
        json!({
            "values": self.values,
            "next": self.next,
            "tasks": self.tasks.iter().map(|t| json!({
                "id": t.id, "name": t.name, "path": t.path, "error": t.error,
                "interrupts": t.interrupts.iter().map(Interrupt::to_state_json).collect::<Vec<_>>(),
                // With the subgraph's state inlined, the reference drops the pointer to it.
                "checkpoint": if t.state.is_some() { Value::Null } else {
                    t.checkpoint.as_ref().map_or(Value::Null, |c| json!({"thread_id": c.thread_id, "checkpoint_ns": c.checkpoint_ns}))
                },
                "state": t.state.as_ref().map(|s| s.to_json()),
                "result": t.result,
            })).collect::<Vec<_>>(),
            "metadata": self.metadata,
            "created_at": self.created_at,
            "checkpoint": cp(&self.checkpoint),
            "parent_checkpoint": self.parent_checkpoint.as_ref().map(cp),
            "interrupts": self.interrupts.iter().map(Interrupt::to_state_json).collect::<Vec<_>>(),
            "checkpoint_id": self.checkpoint.checkpoint_id,
            "parent_checkpoint_id": self.parent_checkpoint.as_ref().map(|p| p.checkpoint_id.clone()),
        })
    }
}

fn interrupts_of(v: &Value) -> Vec<Interrupt> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|i| Interrupt {
            id: i
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            value: i.get("value").cloned().unwrap_or(Value::Null),
        })
        .collect()
}

fn snapshot(graph: &Graph, t: &CheckpointTuple) -> StateSnapshot {
    let state = LoopState::from_checkpoint(graph, &t.checkpoint);
    let step = t.metadata.get("step").and_then(Value::as_i64).unwrap_or(-1);
    let ns = &t.at.checkpoint_ns;
    let mut tasks: Vec<StateTask> = prepare_parts(graph, &state, &t.checkpoint.id, ns, step + 1)
        .into_iter()
        .map(|task| {
            let writes: Vec<_> = t
                .pending_writes
                .iter()
                .filter(|w| w.task_id == task.id)
                .collect();
            // Thread state shows errors as Python's repr does: `ValueError('boom')`.
            let error = writes.iter().find(|w| w.channel == W_ERROR).map(|w| {
                let class = w.value["error"].as_str().unwrap_or("Error");
                let message = w.value["message"].as_str().unwrap_or_default();
                json!(format!("{class}('{}')", message.replace('\'', "\\'")))
            });
            let interrupts = writes
                .iter()
                .find(|w| w.channel == W_INTERRUPT)
                .map(|w| interrupts_of(&w.value))
                .unwrap_or_default();
            let result = finished(writes.iter().copied()).then(|| {
                Value::Object(
                    writes
                        .iter()
                        .filter(|w| {
                            graph.channel_index.contains_key(&w.channel)
                                && !crate::graph::is_hidden(&w.channel)
                        })
                        .map(|w| (w.channel.clone(), w.value.clone()))
                        .collect(),
                )
            });
            let is_sub = graph.nodes[task.node].subgraph.is_some();
            let path = task.path(graph);
            StateTask {
                checkpoint: is_sub.then(|| CheckpointRef {
                    thread_id: t.at.thread_id.clone(),
                    checkpoint_ns: if ns.is_empty() {
                        format!("{}:{}", task.name, task.id)
                    } else {
                        format!("{ns}|{}:{}", task.name, task.id)
                    },
                    checkpoint_id: String::new(),
                }),
                id: task.id,
                name: task.name,
                path,
                error,
                interrupts,
                result,
                state: None,
            }
        })
        .collect();
    let mut next: Vec<String> = tasks.iter().map(|t| t.name.clone()).collect();
    if state.start_input.is_some() {
        let id = super::task::task_id(&t.checkpoint.id, ns, step + 1, START, "pull");
        let writes: Vec<_> = t
            .pending_writes
            .iter()
            .filter(|w| w.task_id == id)
            .collect();
        let result = finished(writes.iter().copied()).then(|| {
            Value::Object(
                writes
                    .iter()
                    .filter(|w| !w.channel.starts_with("__"))
                    .map(|w| (w.channel.clone(), w.value.clone()))
                    .collect(),
            )
        });
        next.insert(0, START.into());
        tasks.insert(
            0,
            StateTask {
                id,
                name: START.into(),
                path: json!(["__pregel_pull", START]),
                error: None,
                interrupts: Vec::new(),
                checkpoint: None,
                result,
                state: None,
            },
        );
    }
    let interrupts = tasks.iter().flat_map(|t| t.interrupts.clone()).collect();
    StateSnapshot {
        values: state.project(graph, &graph.output_keys),
        next,
        tasks,
        metadata: t.metadata.clone(),
        created_at: t.checkpoint.ts.clone(),
        checkpoint: t.at.clone(),
        parent_checkpoint: t.parent_id.as_ref().map(|p| CheckpointRef {
            thread_id: t.at.thread_id.clone(),
            checkpoint_ns: t.at.checkpoint_ns.clone(),
            checkpoint_id: p.clone(),
        }),
        interrupts,
    }
}

/// The state of a thread at a checkpoint (the latest when `checkpoint_id` is `None`).
/// `checkpoint_ns` selects a subgraph's state (`""` for the root).
pub async fn get_state(
    graph: &Graph,
    saver: &dyn Checkpointer,
    thread_id: &str,
    checkpoint_ns: &str,
    checkpoint_id: Option<&str>,
) -> Result<Option<StateSnapshot>, CheckpointError> {
    let sub = graph_for_ns(graph, checkpoint_ns);
    let g = sub.as_deref().unwrap_or(graph);
    Ok(saver
        .get_tuple(thread_id, checkpoint_ns, checkpoint_id)
        .await?
        .map(|t| snapshot(g, &t)))
}

/// [`get_state`] with each pending subgraph task's own state inlined (recursively), as
/// `/threads/{id}/state?subgraphs=true` shows it.
pub async fn get_state_with_subgraphs(
    graph: &Graph,
    saver: &dyn Checkpointer,
    thread_id: &str,
    checkpoint_ns: &str,
    checkpoint_id: Option<&str>,
) -> Result<Option<StateSnapshot>, CheckpointError> {
    let Some(mut snap) = get_state(graph, saver, thread_id, checkpoint_ns, checkpoint_id).await?
    else {
        return Ok(None);
    };
    inline_subgraph_states(graph, saver, &mut snap).await?;
    Ok(Some(snap))
}

/// Inlines the state of each subgraph task of `snap` (recursively): the latest checkpoint of
/// the task's namespace, or an empty state when the subgraph has not started.
pub async fn inline_subgraph_states(
    graph: &Graph,
    saver: &dyn Checkpointer,
    snap: &mut StateSnapshot,
) -> Result<(), CheckpointError> {
    let thread_id = snap.checkpoint.thread_id.clone();
    for task in snap.tasks.iter_mut() {
        let Some(ns) = task.checkpoint.as_ref().map(|c| c.checkpoint_ns.clone()) else {
            continue;
        };
        let child = Box::pin(get_state_with_subgraphs(
            graph, saver, &thread_id, &ns, None,
        ))
        .await?;
        // A subgraph that has not started yet shows an empty state, as in LangGraph.
        let child = child.unwrap_or_else(|| StateSnapshot::empty(&thread_id, &ns));
        task.state = Some(Box::new(child));
    }
    Ok(())
}

/// The subgraph that owns a namespace (`child:task|grandchild:task`).
fn graph_for_ns(graph: &Graph, ns: &str) -> Option<Arc<Graph>> {
    let mut current: Option<Arc<Graph>> = None;
    for part in ns.split('|').filter(|p| !p.is_empty()) {
        let name = part.split(':').next().unwrap_or_default();
        let g: &Graph = current.as_deref().unwrap_or(graph);
        match g
            .node_index
            .get(name)
            .and_then(|&i| g.nodes[i].subgraph.clone())
        {
            Some(sub) => current = Some(sub),
            None => break,
        }
    }
    current
}

/// States of a thread, newest first.
pub async fn get_state_history(
    graph: &Graph,
    saver: &dyn Checkpointer,
    thread_id: &str,
    checkpoint_ns: &str,
    filter: &ListFilter,
) -> Result<Vec<StateSnapshot>, CheckpointError> {
    let sub = graph_for_ns(graph, checkpoint_ns);
    let g = sub.as_deref().unwrap_or(graph);
    Ok(saver
        .list(thread_id, Some(checkpoint_ns), filter)
        .await?
        .iter()
        .map(|t| snapshot(g, t))
        .collect())
}

/// Why a state edit was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UpdateError {
    /// The values or node were not usable.
    #[error("{0}")]
    Invalid(String),
    /// The checkpointer failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

fn detached_ctx(node: &str) -> TaskContext {
    let run = Arc::new(RunShared {
        config: json!({}),
        context: json!({}),
        store: None,
        sink: None,
        modes: StreamModes::NONE,
        stream_subgraphs: false,
        cancel: Default::default(),
        checkpointer: None,
        seen_messages: Default::default(),
        accumulated_messages: Default::default(),
    });
    TaskContext::detached(run, node)
}

/// One node's part of a state edit: `values` as if `as_node` had returned them, and the nodes
/// it sends the graph to next (`goto`, as a `Command` returned by the node would).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeUpdate {
    /// The node's writes: an object, or a list of `[key, value]` pairs.
    pub values: Value,
    /// The node that "returned" them; see [`update_state`] for the default.
    pub as_node: Option<String>,
    /// Nodes (or `Send`s) to run next besides those the node's edges pick.
    pub goto: Vec<Goto>,
}

/// A checkpoint a state edit produced, not saved yet: the caller saves it with
/// [`Checkpointer::put`] (or in a database transaction of its own, with the thread's other
/// changes), and may chain another edit on it through [`PreparedUpdate::tuple`].
#[derive(Debug, Clone)]
pub struct PreparedUpdate {
    /// The checkpoint as saved (values travel in `blobs`).
    pub checkpoint: Checkpoint,
    /// `{source: "update", step, parents, writes}`.
    pub metadata: Value,
    /// The checkpoint it follows.
    pub parent_id: Option<String>,
    /// Blobs of the channels it changed.
    pub blobs: Vec<ChannelBlob>,
    /// The new checkpoint with its values materialised, as a load would return it once saved.
    pub tuple: CheckpointTuple,
}

impl PreparedUpdate {
    /// Where the new checkpoint lives.
    pub fn at(&self) -> &CheckpointRef {
        &self.tuple.at
    }

    /// The state of its namespace once the checkpoint is saved (`graph` is the root graph).
    pub fn snapshot(&self, graph: &Graph) -> StateSnapshot {
        let sub = graph_for_ns(graph, &self.tuple.at.checkpoint_ns);
        snapshot(sub.as_deref().unwrap_or(graph), &self.tuple)
    }

    /// Saves it.
    pub async fn save(&self, saver: &dyn Checkpointer) -> Result<(), CheckpointError> {
        saver
            .put(
                &self.tuple.at.thread_id,
                &self.tuple.at.checkpoint_ns,
                &self.checkpoint,
                &self.metadata,
                self.parent_id.as_deref(),
                &self.blobs,
            )
            .await
    }
}

/// LangGraph's `update_state(values, as_node)`: a new checkpoint (source `update`) as if
/// `as_node` had returned `values`; its edges decide what runs next. Without `as_node`, the
/// node that ran last is used (or `__start__` on an empty thread). With `checkpoint_id`, the
/// update applies to that checkpoint and forks the thread from there.
pub async fn update_state(
    graph: &Graph,
    saver: &dyn Checkpointer,
    thread_id: &str,
    checkpoint_id: Option<&str>,
    values: Value,
    as_node: Option<&str>,
) -> Result<CheckpointRef, UpdateError> {
    let loaded = saver.get_tuple(thread_id, "", checkpoint_id).await?;
    if checkpoint_id.is_some() && loaded.is_none() {
        return Err(UpdateError::Invalid("checkpoint not found".into()));
    }
    let update = NodeUpdate {
        values,
        as_node: as_node.map(str::to_string),
        goto: Vec::new(),
    };
    let prepared = prepare_update(graph, thread_id, loaded.as_ref(), &[update]).await?;
    prepared.save(saver).await?;
    Ok(prepared.at().clone())
}

/// The checkpoint a state edit makes on top of `base` (`None`: an empty thread), without
/// saving it. Several updates are one super-step (LangGraph's `bulk_update_state` step): their
/// writes are applied together, and each must name its node. An update as [`INPUT`] writes
/// the input as a run's would (see [`prepare_update_at`]).
pub async fn prepare_update(
    graph: &Graph,
    thread_id: &str,
    base: Option<&CheckpointTuple>,
    updates: &[NodeUpdate],
) -> Result<PreparedUpdate, UpdateError> {
    prepare_update_at(graph, thread_id, "", base, updates).await
}

/// The node name of an edit that writes the graph's input, as a run's input would: LangGraph's
/// `as_node="__input__"`.
pub const INPUT: &str = "__input__";

/// [`prepare_update`] of the state at `checkpoint_ns`: `""` for the root graph (`graph`), or a
/// subgraph's namespace (`node:task_id[|node:task_id...]`), edited with the subgraph's own
/// nodes, as LangGraph's `update_state` on a subgraph's config does; `base` is then that
/// namespace's checkpoint. A run that resumes the subgraph's task continues from the edit.
///
/// An update as [`INPUT`] must be the only one: it makes an `input` checkpoint whose next
/// task is `__start__` with the values as input, dropping the tasks `base` left waiting, so a
/// run without input continues from there as if it had been given them.
pub async fn prepare_update_at(
    graph: &Graph,
    thread_id: &str,
    checkpoint_ns: &str,
    base: Option<&CheckpointTuple>,
    updates: &[NodeUpdate],
) -> Result<PreparedUpdate, UpdateError> {
    if updates.is_empty() {
        return Err(UpdateError::Invalid("No updates provided".into()));
    }
    let sub = match checkpoint_ns {
        "" => None,
        ns => Some(subgraph_at(graph, ns).ok_or_else(|| {
            UpdateError::Invalid(format!("Subgraph {} not found", without_task_ids(ns)))
        })?),
    };
    let graph = sub.as_deref().unwrap_or(graph);
    let at = CheckpointRef {
        thread_id: thread_id.to_string(),
        checkpoint_ns: checkpoint_ns.to_string(),
        checkpoint_id: String::new(),
    };
    if updates.iter().any(|u| u.as_node.as_deref() == Some(INPUT)) {
        let [update] = updates else {
            return Err(UpdateError::Invalid(
                "Cannot apply multiple updates when updating as input".into(),
            ));
        };
        return prepare_input(graph, at, base, &update.values);
    }
    let (mut state, step, parent) = base_of(graph, base);
    let base_state = state.state_object(graph);
    let mut all_writes: Vec<(String, Value)> = Vec::new();
    let mut routed: Vec<(String, Value)> = Vec::new();
    let mut slots = Vec::new();
    let mut md_writes = Map::new();
    for update in updates {
        let as_node = match (&update.as_node, updates.len()) {
            (Some(n), _) => n.clone(),
            (None, 1) => last_node(graph, &state),
            (None, _) => {
                return Err(UpdateError::Invalid(
                    "as_node is required when applying multiple updates".into(),
                ))
            }
        };
        let slot = node_slot(graph, &as_node)?;
        let pairs = Command::update(update.values.clone())
            .update_pairs()
            .map_err(node_err)?;
        let writes = normalise_writes(graph, pairs).map_err(node_err)?;
        if as_node != END {
            let ctx = detached_ctx(&as_node);
            // A route that fails on the edited state says which one, as in a run.
            let r = route(graph, slot, &base_state, &writes, &update.goto, &ctx)
                .await
                .map_err(|e| node_err(e.at(&route_place(graph, &as_node))))?;
            routed.extend(r);
        }
        md_writes.insert(
            as_node.clone(),
            Value::Object(writes.iter().cloned().collect()),
        );
        all_writes.extend(writes);
        slots.push(slot);
    }
    // As if the nodes had run: their own triggers are consumed.
    for slot in slots.into_iter().filter(|&s| s < graph.nodes.len()) {
        state.seen[slot] = state.trig[slot];
    }
    // Pending `Send`s and a waiting input belonged to the step the update replaces.
    state.sends.clear();
    state.start_input = None;
    let version = state.next_version();
    let idx_writes: Vec<(usize, Value)> = all_writes
        .iter()
        .filter_map(|(k, v)| graph.channel_index.get(k).map(|&i| (i, v.clone())))
        .collect();
    let (mut blobs, updated) = state
        .apply(graph, &idx_writes, version)
        .map_err(|e| UpdateError::Invalid(e.message))?;
    for (ch, arg) in &routed {
        if let Some(node) = ch.strip_prefix(super::state::BRANCH_TO) {
            if let Some(&i) = graph.node_index.get(node) {
                state.trig[i] = version;
            }
        } else if ch == super::state::TASKS {
            // A `Send` in `goto`: the node runs next with its own argument.
            if let (Some(node), Some(a)) = (arg.get("node").and_then(Value::as_str), arg.get("arg"))
            {
                state.sends.push((node.to_string(), a.clone()));
            }
        }
    }
    if state.sends_version > 0 || !state.sends.is_empty() {
        state.sends_version = version;
        blobs.push(state.bookkeeping_blob(super::state::TASKS));
    }
    if state.start_version > 0 {
        state.start_version = version;
        blobs.push(state.bookkeeping_blob(super::state::START_INPUT));
    }
    let metadata = edit_metadata("update", step + 1, base, Value::Object(md_writes));
    Ok(prepared(
        graph, at, &state, blobs, updated, metadata, parent,
    ))
}

/// The state an edit starts from: `base`'s (with its step and id), or an empty thread's.
fn base_of(graph: &Graph, base: Option<&CheckpointTuple>) -> (LoopState, i64, Option<String>) {
    match base {
        Some(t) => (
            LoopState::from_checkpoint(graph, &t.checkpoint),
            t.metadata.get("step").and_then(Value::as_i64).unwrap_or(-1),
            Some(t.checkpoint.id.clone()),
        ),
        None => (LoopState::fresh(graph), -1, None),
    }
}

/// An edit's checkpoint metadata. `parents` (the checkpoints of the enclosing graphs) are
/// the base's: a subgraph's edit stays under the parent checkpoint its task runs from.
fn edit_metadata(source: &str, step: i64, base: Option<&CheckpointTuple>, writes: Value) -> Value {
    let parents = base
        .and_then(|t| t.metadata.get("parents"))
        .filter(|p| p.is_object())
        .cloned()
        .unwrap_or_else(|| json!({}));
    json!({"source": source, "step": step, "parents": parents, "writes": writes})
}

/// The new checkpoint of `state`, as saved and as a load would return it.
fn prepared(
    graph: &Graph,
    mut at: CheckpointRef,
    state: &LoopState,
    blobs: Vec<ChannelBlob>,
    updated: Vec<String>,
    metadata: Value,
    parent: Option<String>,
) -> PreparedUpdate {
    let id = new_checkpoint_id();
    let checkpoint = state.to_checkpoint(graph, id.clone(), updated);
    let mut materialised = checkpoint.clone();
    materialised.channel_values = state.materialised_values(graph);
    at.checkpoint_id = id;
    let tuple = CheckpointTuple {
        at,
        checkpoint: materialised,
        metadata: metadata.clone(),
        parent_id: parent.clone(),
        pending_writes: Vec::new(),
    };
    PreparedUpdate {
        checkpoint,
        metadata,
        parent_id: parent,
        blobs,
        tuple,
    }
}

/// An edit as [`INPUT`]: the `input` checkpoint a run given `values` would write (the input
/// waits in `__start__`; the step is the base's + 1, or -1 on an empty thread), so a run
/// without input goes on from it as that run would have.
fn prepare_input(
    graph: &Graph,
    at: CheckpointRef,
    base: Option<&CheckpointTuple>,
    values: &Value,
) -> Result<PreparedUpdate, UpdateError> {
    if !values.is_object() {
        return Err(UpdateError::Invalid(format!(
            "Received no input writes for {START}: the input must be an object, got {values}"
        )));
    }
    let (mut state, step, parent) = base_of(graph, base);
    // As a run's input does: the tasks the base left waiting are dropped.
    state.sends.clear();
    for i in 0..graph.nodes.len() {
        state.seen[i] = state.trig[i];
    }
    let version = state.next_version();
    state.start_input = Some(values.clone());
    state.start_version = version;
    let mut blobs = vec![state.bookkeeping_blob(START_INPUT)];
    if state.sends_version > 0 {
        state.sends_version = version;
        blobs.push(state.bookkeeping_blob(TASKS));
    }
    let step = if base.is_some() { step + 1 } else { -1 };
    let metadata = edit_metadata("input", step, base, json!({ START: values }));
    let updated = vec![START_INPUT.to_string()];
    Ok(prepared(
        graph, at, &state, blobs, updated, metadata, parent,
    ))
}

/// The subgraph at exactly `ns` (`child:task|grandchild:task`), every part naming a
/// subgraph node; `None` when a part does not.
pub fn subgraph_at(graph: &Graph, ns: &str) -> Option<Arc<Graph>> {
    let mut current: Option<Arc<Graph>> = None;
    for part in ns.split('|') {
        let name = part.split(':').next().unwrap_or_default();
        let g: &Graph = current.as_deref().unwrap_or(graph);
        let sub = g
            .node_index
            .get(name)
            .and_then(|&i| g.nodes[i].subgraph.clone())?;
        current = Some(sub);
    }
    current
}

/// A namespace without its task ids (`child|grandchild`), as LangGraph names a subgraph.
pub fn without_task_ids(ns: &str) -> String {
    ns.split('|')
        .map(|p| p.split(':').next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("|")
}

/// The node that ran most recently, or `__start__` when none has.
fn last_node(graph: &Graph, state: &LoopState) -> String {
    (0..graph.nodes.len())
        .filter(|&i| state.seen[i] > 0)
        .max_by_key(|&i| state.seen[i])
        .map_or_else(|| START.to_string(), |i| graph.nodes[i].name.clone())
}

/// The slot of a node (`__start__` is the slot after the last node).
fn node_slot(graph: &Graph, node: &str) -> Result<usize, UpdateError> {
    if node == START {
        return Ok(graph.nodes.len());
    }
    graph
        .node_index
        .get(node)
        .copied()
        .ok_or_else(|| UpdateError::Invalid(format!("Node {node} does not exist")))
}

fn node_err(e: NodeError) -> UpdateError {
    UpdateError::Invalid(match e {
        NodeError::Failed {
            message,
            location: Some(location),
            ..
        } => format!("{location}: {message}"),
        NodeError::Failed { message, .. } => message,
        other => other.to_string(),
    })
}

/// Copy a checkpoint as the new head of its thread (source `fork`, one step later, as
/// LangGraph's time travel does), so a run continues from it while the later history stays
/// listed. The copy points at the same channel versions, so it writes no blobs.
pub async fn fork(
    graph: &Graph,
    saver: &dyn Checkpointer,
    thread_id: &str,
    checkpoint_id: &str,
) -> Result<CheckpointRef, UpdateError> {
    let t = saver
        .get_tuple(thread_id, "", Some(checkpoint_id))
        .await?
        .ok_or_else(|| UpdateError::Invalid("checkpoint not found".into()))?;
    let state = LoopState::from_checkpoint(graph, &t.checkpoint);
    let id = new_checkpoint_id();
    let cp = state.to_checkpoint(graph, id.clone(), Vec::new());
    let mut md = match &t.metadata {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    let step = md.get("step").and_then(Value::as_i64).unwrap_or(-1);
    md.insert("source".into(), json!("fork"));
    md.insert("step".into(), json!(step + 1));
    md.insert("writes".into(), Value::Null);
    saver
        .put(
            thread_id,
            "",
            &cp,
            &Value::Object(md),
            Some(checkpoint_id),
            &[],
        )
        .await?;
    Ok(CheckpointRef {
        thread_id: thread_id.to_string(),
        checkpoint_ns: String::new(),
        checkpoint_id: id,
    })
}
