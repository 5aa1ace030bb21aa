//! Stream payloads in LangGraph's shapes: task start/result, checkpoints, debug wrappers.

use serde_json::{json, Map, Value};

use super::task::{prepare, Task};
use super::Loop;
use crate::graph::Graph;
use crate::node::Interrupt;
use crate::stream::StreamMode;

fn run_metadata(lp: &Loop) -> Value {
    lp.run
        .config
        .get("metadata")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// `tasks` (and `debug` type `task`) at a task's start.
pub(crate) async fn emit_task_start(lp: &Loop, task: &Task, input: &Value) {
    let tasks = lp.run.wants(StreamMode::Tasks, &lp.ns);
    let debug = lp.run.wants(StreamMode::Debug, &lp.ns);
    if !tasks && !debug {
        return;
    }
    let payload = json!({
        "id": task.id,
        "name": lp.graph.nodes[task.node].name,
        "input": input,
        "triggers": task.triggers,
        "metadata": run_metadata(lp),
    });
    if tasks {
        lp.run
            .emit(&lp.ns, StreamMode::Tasks, with_no_interrupts(&payload))
            .await;
    }
    if debug {
        lp.run
            .emit(
                &lp.ns,
                StreamMode::Debug,
                debug_wrap(lp.step + 1, "task", payload),
            )
            .await;
    }
}

/// A task start as the `tasks` mode sends it: with `interrupts: []` after its name. The JS
/// client's `TasksStreamCreateEvent` declares `interrupts` required (LangGraph's own start
/// payload leaves it out, and so does its `debug` task payload, which stays as LangGraph's).
fn with_no_interrupts(payload: &Value) -> Value {
    let mut out = Map::new();
    for (key, value) in payload.as_object().into_iter().flatten() {
        out.insert(key.clone(), value.clone());
        if key == "name" {
            out.insert("interrupts".into(), json!([]));
        }
    }
    Value::Object(out)
}

/// `tasks` (and `debug` type `task_result`) at a task's end.
pub(crate) async fn emit_task_result(
    lp: &Loop,
    task: &Task,
    error: Option<Value>,
    result: &Value,
    interrupts: &[Interrupt],
) {
    let tasks = lp.run.wants(StreamMode::Tasks, &lp.ns);
    let debug = lp.run.wants(StreamMode::Debug, &lp.ns);
    if !tasks && !debug {
        return;
    }
    let result = if result.is_null() {
        json!({})
    } else {
        result.clone()
    };
    let payload = json!({
        "id": task.id,
        "name": lp.graph.nodes[task.node].name,
        "error": error,
        "result": result,
        "interrupts": interrupts.iter().map(Interrupt::to_stream_json).collect::<Vec<_>>(),
    });
    if tasks {
        lp.run
            .emit(&lp.ns, StreamMode::Tasks, payload.clone())
            .await;
    }
    if debug {
        lp.run
            .emit(
                &lp.ns,
                StreamMode::Debug,
                debug_wrap(lp.step + 1, "task_result", payload),
            )
            .await;
    }
}

fn debug_wrap(step: i64, kind: &str, payload: Value) -> Value {
    json!({
        "step": step,
        "timestamp": crate::checkpoint::now_rfc3339(),
        "type": kind,
        "payload": payload,
    })
}

/// The `config` of a checkpoint as LangGraph shows it.
pub(crate) fn checkpoint_config(lp: &Loop, checkpoint_id: &str) -> Value {
    let mut c = Map::new();
    c.insert("checkpoint_ns".into(), json!(lp.ns_str));
    if let Some(Value::Object(conf)) = lp.run.config.get("configurable") {
        for (k, v) in conf {
            if k != "checkpoint_id" && k != "checkpoint_ns" {
                c.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(t) = &lp.thread_id {
        c.insert("thread_id".into(), json!(t));
    }
    c.insert("checkpoint_id".into(), json!(checkpoint_id));
    json!({"configurable": c})
}

/// `checkpoints` and `debug` type `checkpoint` for the loop's current checkpoint.
pub(crate) async fn emit_checkpoint(lp: &Loop, metadata: &Value) {
    let cps = lp.run.wants(StreamMode::Checkpoints, &lp.ns);
    let debug = lp.run.wants(StreamMode::Debug, &lp.ns);
    if !cps && !debug {
        return;
    }
    let Some(id) = lp.checkpoint_id.as_deref() else {
        return;
    };
    let tasks = prepare(lp);
    let mut next: Vec<String> = tasks
        .iter()
        .map(|t| lp.graph.nodes[t.node].name.clone())
        .collect();
    let mut task_list: Vec<Value> = tasks
        .iter()
        .map(|t| {
            let interrupts: Vec<Value> = lp
                .pending
                .iter()
                .filter(|w| w.task_id == t.id && w.channel == super::W_INTERRUPT)
                .flat_map(|w| w.value.as_array().cloned().unwrap_or_default())
                .map(|i| json!({"value": i.get("value"), "id": i.get("id"), "response_schema": null}))
                .collect();
            // A subgraph task points at its own checkpoints.
            let state = if lp.graph.nodes[t.node].subgraph.is_some() {
                let ns = if lp.ns_str.is_empty() {
                    format!("{}:{}", t.name, t.id)
                } else {
                    format!("{}|{}:{}", lp.ns_str, t.name, t.id)
                };
                json!({"configurable": {"thread_id": lp.thread_id, "checkpoint_ns": ns}})
            } else {
                Value::Null
            };
            json!({"id": t.id, "name": lp.graph.nodes[t.node].name, "interrupts": interrupts, "state": state})
        })
        .collect();
    if lp.state.start_input.is_some() {
        let sid = super::task::task_id(id, &lp.ns_str, lp.step + 1, "__start__", "pull");
        next.insert(0, "__start__".into());
        task_list.insert(
            0,
            json!({"id": sid, "name": "__start__", "interrupts": [], "state": null}),
        );
    }
    // The stream shows LangGraph's own keys only; run metadata is in the saved checkpoint.
    let md = json!({
        "source": metadata.get("source"),
        "step": metadata.get("step"),
        "parents": metadata.get("parents"),
    });
    let values = lp.state.project(&lp.graph, &lp.graph.output_keys);
    let parent_config = lp.parent_id.as_deref().map(|p| checkpoint_config(lp, p));
    let payload = json!({
        "config": checkpoint_config(lp, id),
        "parent_config": parent_config,
        "values": values,
        "metadata": md,
        "next": next,
        "tasks": task_list,
    });
    if cps {
        lp.run
            .emit(&lp.ns, StreamMode::Checkpoints, payload.clone())
            .await;
    }
    if debug {
        let mut p = payload;
        // The debug form names a subgraph task's config `checkpoint` instead of `state`.
        if let Some(Value::Array(ts)) = p.get_mut("tasks") {
            for t in ts.iter_mut() {
                if let Value::Object(tm) = t {
                    if tm.get("state").is_some_and(|s| !s.is_null()) {
                        if let Some(s) = tm.remove("state") {
                            tm.insert("checkpoint".into(), s);
                        }
                    }
                }
            }
        }
        if let Value::Object(m) = &mut p {
            m.insert(
                "checkpoint".into(),
                json!({"checkpoint_id": id, "thread_id": lp.thread_id, "checkpoint_ns": lp.ns_str}),
            );
            m.insert(
                "parent_checkpoint".into(),
                match &lp.parent_id {
                    Some(pid) => json!({"checkpoint_id": pid, "thread_id": lp.thread_id, "checkpoint_ns": lp.ns_str}),
                    None => Value::Null,
                },
            );
        }
        lp.run
            .emit(
                &lp.ns,
                StreamMode::Debug,
                debug_wrap(lp.step, "checkpoint", p),
            )
            .await;
    }
}

/// `{node: update}` of a step, for checkpoint metadata `writes`.
pub(crate) fn writes_metadata(
    graph: &Graph,
    tasks: &[Task],
    done: &[(usize, Vec<(String, Value)>)],
) -> Value {
    let mut m = Map::new();
    for (ti, writes) in done {
        let name = &graph.nodes[tasks[*ti].node].name;
        let update: Map<String, Value> = writes
            .iter()
            .filter(|(k, _)| graph.channel_index.contains_key(k) && !crate::graph::is_hidden(k))
            .cloned()
            .collect();
        m.insert(name.clone(), Value::Object(update));
    }
    if m.is_empty() {
        Value::Null
    } else {
        Value::Object(m)
    }
}
