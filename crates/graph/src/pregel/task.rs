//! Tasks of a step: which run, what they see, how they run (retries, cancellation), and how
//! their results become writes.

use serde_json::{json, Value};

use super::state::{BRANCH_TO, TASKS};
use super::{finished, payloads, Loop, W_DONE, W_RESUME};
use crate::channels::{apply_writes, ChannelKind};
use crate::checkpoint::PendingWrite;
use crate::context::TaskContext;
use crate::graph::{Graph, END};
use crate::messages::coerce_messages;
use crate::node::{Command, CommandGraph, Goto, NodeError};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TaskKind {
    /// Triggered by an edge; reads the state.
    Pull,
    /// Created by a `Send`; reads its argument.
    Push(usize),
}

#[derive(Debug, Clone)]
pub(crate) struct Task {
    pub id: String,
    pub name: String,
    pub node: usize,
    pub kind: TaskKind,
    pub triggers: Vec<String>,
}

impl Task {
    /// LangGraph applies writes sorted by task path: pulled nodes by name, then pushes.
    pub fn sort_key(&self) -> (u8, &str, usize) {
        match self.kind {
            TaskKind::Pull => (0, self.name.as_str(), 0),
            TaskKind::Push(i) => (1, "", i),
        }
    }

    pub fn path(&self, graph: &Graph) -> Value {
        match self.kind {
            TaskKind::Pull => json!(["__pregel_pull", graph.nodes[self.node].name]),
            TaskKind::Push(i) => json!(["__pregel_push", i, false]),
        }
    }
}

/// Deterministic task ids: the same checkpoint always yields the same tasks, so resumes and
/// interrupt ids line up.
pub(crate) fn task_id(checkpoint_id: &str, ns: &str, step: i64, name: &str, slot: &str) -> String {
    let key = format!("{checkpoint_id}|{ns}|{step}|{name}|{slot}");
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, key.as_bytes()).to_string()
}

/// The tasks of the next step: `Send`s first, then triggered nodes in declaration order.
pub(crate) fn prepare(lp: &Loop) -> Vec<Task> {
    prepare_parts(
        &lp.graph,
        &lp.state,
        lp.checkpoint_id.as_deref().unwrap_or(""),
        &lp.ns_str,
        lp.step + 1,
    )
}

/// [`prepare`] from a restored state, for thread state views.
pub(crate) fn prepare_parts(
    graph: &Graph,
    state: &super::state::LoopState,
    cid: &str,
    ns: &str,
    step: i64,
) -> Vec<Task> {
    let mut tasks = Vec::new();
    for (i, (node, _)) in state.sends.iter().enumerate() {
        if let Some(&idx) = graph.node_index.get(node) {
            tasks.push(Task {
                id: task_id(cid, ns, step, node, &format!("push{i}")),
                name: node.clone(),
                node: idx,
                kind: TaskKind::Push(i),
                triggers: vec!["__pregel_push".into()],
            });
        }
    }
    for (i, n) in graph.nodes.iter().enumerate() {
        if state.trig[i] > state.seen[i] {
            tasks.push(Task {
                id: task_id(cid, ns, step, &n.name, "pull"),
                name: n.name.clone(),
                node: i,
                kind: TaskKind::Pull,
                triggers: vec![format!("{BRANCH_TO}{}", n.name)],
            });
        }
    }
    tasks
}

/// Coerce writes to message channels (ids assigned now, so the `updates` event, the state and
/// the `messages` stream agree on them) and drop keys the graph does not have.
pub(crate) fn normalise_writes(
    graph: &Graph,
    pairs: Vec<(String, Value)>,
) -> Result<Vec<(String, Value)>, NodeError> {
    let mut out = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        let Some(&i) = graph.channel_index.get(&k) else {
            continue;
        };
        if let ChannelKind::Messages = graph.channels[i].kind {
            let mut msgs = coerce_messages(&v)
                .map_err(|e| NodeError::invalid_update(format!("At key '{k}': {}", e.0)))?;
            for m in msgs.iter_mut() {
                if let Value::Object(o) = m {
                    if !matches!(o.get("id"), Some(Value::String(_))) {
                        o.insert("id".into(), json!(crate::messages::new_message_id()));
                    }
                }
            }
            let v = if v.is_array() && !is_pair(&v) {
                Value::Array(msgs)
            } else {
                msgs.into_iter().next().unwrap_or(Value::Null)
            };
            out.push((k, v));
        } else {
            out.push((k, v));
        }
    }
    Ok(out)
}

fn is_pair(v: &Value) -> bool {
    matches!(
        v.as_array().map(Vec::as_slice),
        Some([Value::String(_), Value::String(_)])
    ) && coerce_messages(v).map(|m| m.len() == 1).unwrap_or(false)
}

/// The write that makes a goto happen.
pub(crate) fn goto_write(graph: &Graph, g: &Goto) -> Result<Option<(String, Value)>, NodeError> {
    let node = g.node();
    if node == END {
        return Ok(None);
    }
    if !graph.node_index.contains_key(node) {
        return Err(NodeError::invalid_update(format!(
            "At '{node}': there is no node with this name in graph `{}`",
            graph.name
        )));
    }
    Ok(Some(match g {
        Goto::Node(n) => (format!("{BRANCH_TO}{n}"), Value::Null),
        Goto::Send { node, arg } => (TASKS.to_string(), json!({"node": node, "arg": arg})),
    }))
}

/// Fixed edges and branches of the node at `slot` (`nodes.len()` for START), evaluated on
/// the state with the task's own writes applied.
pub(crate) async fn route(
    graph: &Graph,
    slot: usize,
    base_state: &Value,
    writes: &[(String, Value)],
    extra: &[Goto],
    ctx: &TaskContext,
) -> Result<Vec<(String, Value)>, NodeError> {
    let mut out = Vec::new();
    for g in extra {
        out.extend(goto_write(graph, g)?);
    }
    for t in &graph.out_edges[slot] {
        out.extend(goto_write(graph, &Goto::Node(t.clone()))?);
    }
    for &j in &graph.out_joins[slot] {
        let join = &graph.joins[j];
        let source = graph
            .nodes
            .get(slot)
            .map_or(crate::graph::START, |n| n.name.as_str());
        out.push((graph.channels[join.channel].name.clone(), json!(source)));
    }
    let branches = &graph.out_branches[slot];
    if branches.is_empty() {
        return Ok(out);
    }
    let fresh = fresh_state(graph, base_state, writes)?;
    for (i, &b) in branches.iter().enumerate() {
        let branch = &graph.branches[b];
        let from_node = slot < graph.nodes.len();
        let answers = route_one(branch, &fresh, from_node, i, ctx).await?;
        for a in answers {
            let a = match (&branch.path_map, a) {
                (Some(map), Goto::Node(key)) => {
                    let target = map.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone()).ok_or_else(|| {
                        NodeError::invalid_update(format!(
                            "the branch from `{}` answered `{key}`, which its path map does not name",
                            branch.source
                        ))
                    })?;
                    Goto::Node(target)
                }
                (_, a) => a,
            };
            out.extend(goto_write(graph, &a)?);
        }
    }
    Ok(out)
}

/// Ask one router, shown in `events` as a run below its node (routers of `__start__` are
/// hidden, as in LangGraph). In LangGraph a node is a sequence of its function, its writes
/// and its branches, so its `i`th branch is step `3 + i` of that sequence.
async fn route_one(
    branch: &crate::graph::Branch,
    state: &Value,
    from_node: bool,
    i: usize,
    ctx: &TaskContext,
) -> Result<Vec<Goto>, NodeError> {
    let trace = if from_node && ctx.traces() {
        let tag = format!("seq:step:{}", 3 + i);
        ctx.child_trace(branch.router.name(), &tag, || ctx.message_metadata())
    } else {
        None
    };
    let Some(trace) = trace else {
        return branch.router.route(state, ctx).await;
    };
    trace
        .emit(&ctx.run, "on_chain_start", json!({ "input": state }))
        .await;
    let answers = branch.router.route(state, ctx).await?;
    let output = crate::events::answers_json(&answers);
    trace
        .end(&ctx.run, "on_chain_end", output, state.clone())
        .await;
    Ok(answers)
}

fn fresh_state(
    graph: &Graph,
    base: &Value,
    writes: &[(String, Value)],
) -> Result<Value, NodeError> {
    if writes.is_empty() {
        return Ok(base.clone());
    }
    let mut state = base.clone();
    for (k, _) in writes {
        let Some(&i) = graph.channel_index.get(k) else {
            continue;
        };
        let ws: Vec<Value> = writes
            .iter()
            .filter(|(x, _)| x == k)
            .map(|(_, v)| v.clone())
            .collect();
        let mut cur = state.get(k).cloned();
        apply_writes(&graph.channels[i], &mut cur, &ws)
            .map_err(|e| NodeError::invalid_update(e.message))?;
        if let (Value::Object(m), Some(v)) = (&mut state, cur) {
            m.insert(k.clone(), v);
        }
    }
    Ok(state)
}

/// Pending writes recording a finished task: its writes, or [`W_DONE`] when it wrote nothing
/// (see [`finished`]).
pub(crate) fn pending_from(task_id: &str, writes: &[(String, Value)]) -> Vec<PendingWrite> {
    if writes.is_empty() {
        return vec![PendingWrite {
            task_id: task_id.to_string(),
            channel: W_DONE.into(),
            value: Value::Null,
        }];
    }
    writes
        .iter()
        .map(|(c, v)| PendingWrite {
            task_id: task_id.to_string(),
            channel: c.clone(),
            value: v.clone(),
        })
        .collect()
}

/// What a task reads: the state, or its `Send` argument.
pub(crate) fn task_input(lp: &Loop, task: &Task, state: &Value) -> Value {
    match &task.kind {
        TaskKind::Pull => state.clone(),
        TaskKind::Push(i) => lp
            .state
            .sends
            .get(*i)
            .map(|(_, a)| a.clone())
            .unwrap_or(Value::Null),
    }
}

/// Whether a task already finished in an earlier attempt of this step.
pub(crate) fn already_done(lp: &Loop, task: &Task) -> bool {
    finished(lp.pending.iter().filter(|w| w.task_id == task.id))
}

/// Run one task, or reuse its saved writes. Returns the writes and whether they are new.
pub(crate) async fn execute(
    lp: &Loop,
    task: &Task,
    state: &Value,
) -> (Result<Vec<(String, Value)>, NodeError>, bool) {
    let saved: Vec<&PendingWrite> = lp.pending.iter().filter(|w| w.task_id == task.id).collect();
    if finished(saved.iter().copied()) {
        let writes = saved
            .iter()
            .filter(|w| !w.channel.starts_with("__") || w.channel == TASKS)
            .map(|w| (w.channel.clone(), w.value.clone()))
            .collect();
        return (Ok(writes), false);
    }
    let resume: Vec<Value> = saved
        .iter()
        .find(|w| w.channel == W_RESUME)
        .and_then(|w| w.value.as_array().cloned())
        .unwrap_or_else(|| lp.null_resume.iter().cloned().collect());
    let graph = &lp.graph;
    let def = &graph.nodes[task.node];
    let input = match &task.kind {
        TaskKind::Pull => state.clone(),
        TaskKind::Push(i) => lp
            .state
            .sends
            .get(*i)
            .map(|(_, a)| a.clone())
            .unwrap_or(Value::Null),
    };
    let ctx = lp.task_context(
        &task.id,
        &def.name,
        task.triggers.clone(),
        task.path(graph),
        resume,
    );
    if ctx.streams_messages() {
        // Messages the node receives are not "new" when it returns them.
        if let Some(Value::Object(m)) = Some(&input) {
            for (k, v) in m {
                let is_msgs = graph
                    .channel_index
                    .get(k)
                    .is_some_and(|&i| matches!(graph.channels[i].kind, ChannelKind::Messages));
                if is_msgs {
                    if let (Some(list), Ok(mut seen)) = (v.as_array(), ctx.run.seen_messages.lock())
                    {
                        for msg in list {
                            if let Some(id) = msg.get("id").and_then(Value::as_str) {
                                seen.insert(id.to_string());
                            }
                        }
                    }
                }
            }
        }
    }
    let trace = ctx.node_trace().map(|t| NodeTrace {
        input: input.clone(),
        trace: t,
    });
    if let Some(t) = &trace {
        let data = json!({ "input": t.input });
        t.trace.emit(&ctx.run, "on_chain_start", data).await;
    }
    let outcome = run_with_retry(lp, task, input, &ctx).await;
    let outcome = match outcome {
        Ok(cmd) if cmd.graph == CommandGraph::Parent => {
            Err(NodeError::ParentCommand(Box::new(Command {
                graph: CommandGraph::Current,
                ..cmd
            })))
        }
        Err(NodeError::ParentCommand(cmd)) if def.subgraph.is_some() => Ok(*cmd),
        other => other,
    };
    let result = match outcome {
        Ok(cmd) => finish_command(lp, task, state, cmd, &ctx, trace.as_ref()).await,
        Err(e) => Err(e.at(&node_place(graph, &def.name))),
    };
    match &result {
        Ok(_) => {}
        Err(NodeError::Interrupted(ints)) => {
            lp.run
                .emit(
                    &lp.ns,
                    crate::stream::StreamMode::Updates,
                    json!({"__interrupt__": ints.iter().map(|i| i.to_stream_json()).collect::<Vec<_>>()}),
                )
                .await;
        }
        Err(NodeError::Failed { class, message, .. }) => {
            let err = json!({"error": class, "message": message});
            payloads::emit_task_result(lp, task, Some(err), &json!({}), &[]).await;
        }
        Err(_) => {}
    }
    (result, true)
}

/// A node's run in `events` and the input it started with.
pub(crate) struct NodeTrace {
    trace: crate::events::Traced,
    input: Value,
}

async fn finish_command(
    lp: &Loop,
    task: &Task,
    state: &Value,
    cmd: Command,
    ctx: &TaskContext,
    trace: Option<&NodeTrace>,
) -> Result<Vec<(String, Value)>, NodeError> {
    let graph = &lp.graph;
    let node_name = &graph.nodes[task.node].name;
    let pairs = cmd
        .update_pairs()
        .map_err(|e| e.at(&node_place(graph, node_name)))?;
    let writes = normalise_writes(graph, pairs).map_err(|e| e.at(&node_place(graph, node_name)))?;
    // Messages the node returned without streaming them are streamed now, whole.
    if ctx.streams_messages() {
        for (k, v) in &writes {
            let is_msgs = graph
                .channel_index
                .get(k)
                .is_some_and(|&i| matches!(graph.channels[i].kind, ChannelKind::Messages));
            if !is_msgs {
                continue;
            }
            let list = match v {
                Value::Array(items) => items.clone(),
                other => vec![other.clone()],
            };
            for m in list {
                let id = m
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                if m.get("type").and_then(Value::as_str) == Some("remove") || ctx.message_seen(&id)
                {
                    continue;
                }
                ctx.write_message(m).await;
            }
        }
    }
    let update_json = if writes.is_empty() && cmd.update.as_ref().is_none_or(Value::is_null) {
        Value::Null
    } else {
        Value::Object(writes.iter().cloned().collect())
    };
    lp.run
        .emit(
            &lp.ns,
            crate::stream::StreamMode::Updates,
            json!({ node_name: update_json }),
        )
        .await;
    let routed = route(graph, task.node, state, &writes, &cmd.goto, ctx)
        .await
        .map_err(|e| e.at(&route_place(graph, node_name)))?;
    // The node's output comes after its routers ran, as LangGraph's node sequence does.
    if let Some(t) = trace {
        let chunk = json!({ "chunk": update_json });
        t.trace.emit(&ctx.run, "on_chain_stream", chunk).await;
        t.trace
            .end(
                &ctx.run,
                "on_chain_end",
                update_json.clone(),
                t.input.clone(),
            )
            .await;
    }
    let result = if update_json.is_null() {
        json!({})
    } else {
        update_json
    };
    payloads::emit_task_result(lp, task, None, &result, &[]).await;
    let mut all = writes;
    all.extend(routed);
    Ok(all)
}

/// Where a node's failure happened, as its error message says.
pub(crate) fn node_place(graph: &Graph, node: &str) -> String {
    format!("graph '{}', node '{node}'", graph.name)
}

/// Where a failure of the routing after `node` (its edges' route scripts, its gotos) happened.
pub(crate) fn route_place(graph: &Graph, node: &str) -> String {
    format!("graph '{}', route from '{node}'", graph.name)
}

async fn run_with_retry(
    lp: &Loop,
    task: &Task,
    input: Value,
    ctx: &TaskContext,
) -> Result<Command, NodeError> {
    let def = &lp.graph.nodes[task.node];
    let max_attempts = def.retry.as_ref().map_or(1, |p| p.max_attempts.max(1));
    let mut attempt = 1u32;
    let mut input = Some(input);
    loop {
        // Only keep a copy of the input when another attempt may need it.
        let this = if attempt < max_attempts {
            input.clone().unwrap_or(Value::Null)
        } else {
            input.take().unwrap_or(Value::Null)
        };
        let fut = def.runner.run(this, ctx);
        let out = tokio::select! {
            _ = lp.run.cancel.cancelled() => Err(NodeError::Cancelled),
            r = fut => r,
        };
        match (&out, &def.retry) {
            (Err(NodeError::Failed { class, .. }), Some(policy))
                if attempt < policy.max_attempts && policy.retries(class) =>
            {
                attempt += 1;
                ctx.sleep(policy.wait_before(attempt)).await?;
                ctx.interrupt_counter
                    .store(0, std::sync::atomic::Ordering::SeqCst);
            }
            _ => return out,
        }
    }
}
