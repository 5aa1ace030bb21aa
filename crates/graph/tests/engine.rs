//! Engine semantics on small Rust-built graphs.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::Harness;
use serde_json::{json, Value};
use spindle_graph::builder::{node_fn, router_fn, GraphBuilder, NodeOptions};
use spindle_graph::channels::{ChannelKind, ChannelSpec};
use spindle_graph::checkpoint::{
    ChannelBlob, Checkpoint, CheckpointError, CheckpointTuple, Checkpointer, InMemoryCheckpointer,
    ListFilter, PendingWrite, QueuedWrite, WriteReceipt,
};
use spindle_graph::context::TaskContext;
use spindle_graph::node::{Command, CommandGraph, Goto, Node, NodeError, RetryPolicy};
use spindle_graph::pregel::{fork, get_state, get_state_history, update_state};
use spindle_graph::{Durability, Graph, NodeSet, RunInput, StreamMode, END, START};
use tokio::sync::{mpsc, oneshot, watch};

fn push(key: &'static str, v: &'static str) -> Arc<dyn Node> {
    node_fn(move |_| Ok(Command::update(json!({ key: [v] }))))
}

fn list_graph(b: GraphBuilder) -> Arc<Graph> {
    Arc::new(b.compile().unwrap())
}

fn values(v: Value) -> RunInput {
    RunInput::Values(v)
}

fn resume(v: Value) -> RunInput {
    RunInput::Command {
        resume: Some(v),
        update: None,
        goto: vec![],
    }
}

/// A node that asks `n` questions with `interrupt()` and writes the answers.
struct Asker(usize);

#[async_trait]
impl Node for Asker {
    async fn run(&self, _input: Value, ctx: &TaskContext) -> Result<Command, NodeError> {
        let mut answers = Vec::new();
        for i in 0..self.0 {
            answers.push(ctx.interrupt(json!({"q": i}))?);
        }
        Ok(Command::update(json!({"log": answers})))
    }
}

/// Sleeps, then appends its argument (for Send order tests).
struct SleepThenAppend;

#[async_trait]
impl Node for SleepThenAppend {
    async fn run(&self, input: Value, ctx: &TaskContext) -> Result<Command, NodeError> {
        let ms = input["ms"].as_u64().unwrap_or(0);
        ctx.sleep(Duration::from_millis(ms)).await?;
        Ok(Command::update(json!({"log": [input["id"].clone()]})))
    }
}

/// Counts runs; fails the first `fail_times` runs.
struct Flaky {
    runs: Arc<AtomicUsize>,
    fail_times: usize,
}

#[async_trait]
impl Node for Flaky {
    async fn run(&self, _input: Value, _ctx: &TaskContext) -> Result<Command, NodeError> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst);
        if n < self.fail_times {
            return Err(NodeError::new("ConnectionError", format!("attempt {n}")));
        }
        Ok(Command::update(json!({"log": ["flaky"]})))
    }
}

fn log_channel() -> ChannelSpec {
    ChannelSpec::new("log", ChannelKind::Append)
}

#[tokio::test]
async fn parallel_writes_apply_together_in_node_name_order() {
    let g = list_graph(
        GraphBuilder::new("p")
            .channel(log_channel())
            .node("b", push("log", "b"))
            .node("a", push("log", "a"))
            .edge(START, "b")
            .edge(START, "a"),
    );
    let h = Harness::new();
    let (out, events) = h
        .run(
            &g,
            Some("t"),
            values(json!({})),
            &[StreamMode::Values],
            |_| {},
        )
        .await;
    assert_eq!(out.unwrap().values, json!({"log": ["a", "b"]}));
    // One values event for the input, one for the single step that ran both nodes.
    assert_eq!(events.len(), 2);
}

#[tokio::test]
async fn two_writes_to_a_last_value_key_in_one_step_fail() {
    let g = list_graph(
        GraphBuilder::new("p")
            .channel(ChannelSpec::new("x", ChannelKind::LastValue))
            .node("a", node_fn(|_| Ok(Command::update(json!({"x": 1})))))
            .node("b", node_fn(|_| Ok(Command::update(json!({"x": 2})))))
            .edge(START, "a")
            .edge(START, "b"),
    );
    let (out, _) = Harness::new()
        .run(&g, None, values(json!({})), &[], |_| {})
        .await;
    let e = out.unwrap_err();
    assert_eq!(e.class(), "InvalidUpdateError");
    assert!(
        e.message()
            .contains("At key 'x': Can receive only one value per step"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn send_results_follow_send_order_not_finish_order() {
    let g = list_graph(
        GraphBuilder::new("s")
            .channel(log_channel())
            .node("work", Arc::new(SleepThenAppend))
            .branch(
                START,
                router_fn(|_| {
                    Ok([(1, 30), (2, 1), (3, 15)]
                        .iter()
                        .map(|(id, ms)| Goto::Send {
                            node: "work".into(),
                            arg: json!({"id": id, "ms": ms}),
                        })
                        .collect())
                }),
                None,
                Some(vec!["work".into()]),
            )
            .edge("work", END),
    );
    let (out, _) = Harness::new()
        .run(&g, Some("t"), values(json!({})), &[], |_| {})
        .await;
    assert_eq!(out.unwrap().values["log"], json!([1, 2, 3]));
}

#[tokio::test]
async fn several_interrupts_in_one_node_resume_one_by_one() {
    let g = list_graph(
        GraphBuilder::new("i")
            .channel(log_channel())
            .node("ask", Arc::new(Asker(2)))
            .edge(START, "ask")
            .edge("ask", END),
    );
    let h = Harness::new();
    let (out, _) = h.run(&g, Some("t"), values(json!({})), &[], |_| {}).await;
    let first = out.unwrap().interrupts;
    assert_eq!(first[0].value, json!({"q": 0}));
    let (out, _) = h.run(&g, Some("t"), resume(json!("A")), &[], |_| {}).await;
    let second = out.unwrap().interrupts;
    assert_eq!(second[0].value, json!({"q": 1}));
    assert_ne!(first[0].id, second[0].id, "each interrupt has its own id");
    let (out, _) = h.run(&g, Some("t"), resume(json!("B")), &[], |_| {}).await;
    let out = out.unwrap();
    assert!(out.interrupts.is_empty());
    assert_eq!(out.values["log"], json!(["A", "B"]));
}

#[tokio::test]
async fn parallel_interrupts_resume_by_id() {
    let g = list_graph(
        GraphBuilder::new("i")
            .channel(log_channel())
            .node("x", Arc::new(Asker(1)))
            .node("y", Arc::new(Asker(1)))
            .edge(START, "x")
            .edge(START, "y"),
    );
    let h = Harness::new();
    let (out, _) = h.run(&g, Some("t"), values(json!({})), &[], |_| {}).await;
    let ints = out.unwrap().interrupts;
    assert_eq!(ints.len(), 2);
    let map = json!({ ints[0].id.clone(): "one", ints[1].id.clone(): "two" });
    let (out, _) = h.run(&g, Some("t"), resume(map), &[], |_| {}).await;
    let mut log: Vec<String> = serde_json::from_value(out.unwrap().values["log"].clone()).unwrap();
    log.sort();
    assert_eq!(log, ["one", "two"]);
}

/// Counts its runs and writes nothing.
struct Quiet(Arc<AtomicUsize>);

#[async_trait]
impl Node for Quiet {
    async fn run(&self, _input: Value, _ctx: &TaskContext) -> Result<Command, NodeError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Command::update(json!({})))
    }
}

/// A step that failed is resumed without running its finished tasks again. A finished task is
/// known by its writes; only one that wrote nothing saves the `__done__` mark.
#[tokio::test]
async fn resume_after_a_failed_step_does_not_rerun_finished_tasks() {
    let ok_runs = Arc::new(AtomicUsize::new(0));
    let quiet_runs = Arc::new(AtomicUsize::new(0));
    let bad_runs = Arc::new(AtomicUsize::new(0));
    let g = list_graph(
        GraphBuilder::new("c")
            .channel(log_channel())
            .node(
                "ok",
                Arc::new(Flaky {
                    runs: ok_runs.clone(),
                    fail_times: 0,
                }),
            )
            .node("quiet", Arc::new(Quiet(quiet_runs.clone())))
            .node(
                "bad",
                Arc::new(Flaky {
                    runs: bad_runs.clone(),
                    fail_times: 1,
                }),
            )
            .edge(START, "ok")
            .edge(START, "quiet")
            .edge(START, "bad"),
    );
    let h = Harness::new();
    let (out, _) = h
        .run(&g, Some("t"), values(json!({})), &[], |c| {
            c.durability = Durability::Sync
        })
        .await;
    assert_eq!(out.unwrap_err().class(), "ConnectionError");
    let latest = h
        .saver
        .get_tuple("t", "", None)
        .await
        .unwrap()
        .expect("a checkpoint");
    let mut saved: Vec<&str> = latest
        .pending_writes
        .iter()
        .map(|w| w.channel.as_str())
        .collect();
    saved.sort();
    assert_eq!(
        saved,
        ["__done__", "__error__", "log"],
        "{:?}",
        latest.pending_writes
    );

    let (out, _) = h.run(&g, Some("t"), RunInput::Continue, &[], |_| {}).await;
    assert_eq!(out.unwrap().values["log"], json!(["flaky", "flaky"]));
    assert_eq!(
        ok_runs.load(Ordering::SeqCst),
        1,
        "known finished by its write"
    );
    assert_eq!(
        quiet_runs.load(Ordering::SeqCst),
        1,
        "known finished by its mark"
    );
    assert_eq!(bad_runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn retry_policy_retries_listed_errors() {
    let runs = Arc::new(AtomicUsize::new(0));
    let policy = RetryPolicy {
        max_attempts: 3,
        initial_interval: Duration::from_millis(1),
        ..Default::default()
    };
    let g = list_graph(
        GraphBuilder::new("r")
            .channel(log_channel())
            .node_with(
                "f",
                Arc::new(Flaky {
                    runs: runs.clone(),
                    fail_times: 2,
                }),
                NodeOptions {
                    retry: Some(policy.clone()),
                    ..Default::default()
                },
            )
            .edge(START, "f"),
    );
    let (out, _) = Harness::new()
        .run(&g, None, values(json!({})), &[], |_| {})
        .await;
    assert_eq!(out.unwrap().values["log"], json!(["flaky"]));
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    let runs = Arc::new(AtomicUsize::new(0));
    let only_value_errors = RetryPolicy {
        retry_on: vec!["ValueError".into()],
        ..policy
    };
    let g = list_graph(
        GraphBuilder::new("r")
            .channel(log_channel())
            .node_with(
                "f",
                Arc::new(Flaky {
                    runs: runs.clone(),
                    fail_times: 2,
                }),
                NodeOptions {
                    retry: Some(only_value_errors),
                    ..Default::default()
                },
            )
            .edge(START, "f"),
    );
    let (out, _) = Harness::new()
        .run(&g, None, values(json!({})), &[], |_| {})
        .await;
    assert_eq!(out.unwrap_err().class(), "ConnectionError");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn recursion_limit_stops_endless_loops() {
    let g = list_graph(
        GraphBuilder::new("loop")
            .channel(ChannelSpec::new("n", ChannelKind::Add))
            .node("a", node_fn(|_| Ok(Command::update(json!({"n": 1})))))
            .edge(START, "a")
            .edge("a", "a"),
    );
    let (out, _) = Harness::new()
        .run(&g, Some("t"), values(json!({})), &[], |c| {
            c.recursion_limit = 5
        })
        .await;
    let e = out.unwrap_err();
    assert_eq!(e.class(), "GraphRecursionError");
    assert!(e
        .message()
        .starts_with("Recursion limit of 5 reached without hitting a stop condition."));
}

#[tokio::test]
async fn cancellation_stops_a_sleeping_node() {
    let g = common::example("slow");
    let h = Harness::new();
    let cancel = tokio_util::sync::CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        c2.cancel();
    });
    let started = std::time::Instant::now();
    let env = spindle_graph::RunEnv {
        checkpointer: Some(h.saver.clone()),
        cancel,
        ..Default::default()
    };
    let cfg = spindle_graph::RunConfig {
        thread_id: Some("t".into()),
        ..Default::default()
    };
    let out = spindle_graph::pregel::run(&g, values(json!({"delay_ms": 10_000})), cfg, env).await;
    assert_eq!(out.unwrap_err().class(), "CancelledError");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The interrupted task is still next, with no error recorded against it.
    let s = get_state(&g, h.saver.as_ref(), "t", "", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.next, ["a"]);
    assert!(s.tasks[0].error.is_none());
}

/// A run told its thread is new starts from nothing without reading the thread (the
/// server knows a thread's first run from its storage); a checkpoint to start from still wins.
#[tokio::test]
async fn a_run_on_a_thread_known_to_be_new_does_not_read_it() {
    let g = list_graph(
        GraphBuilder::new("s")
            .channel(log_channel())
            .node("a", push("log", "a"))
            .edge(START, "a"),
    );
    let h = Harness::new();
    let run = |new_thread: bool, checkpoint_id: Option<String>| {
        let env = spindle_graph::RunEnv {
            checkpointer: Some(h.saver.clone()),
            ..Default::default()
        };
        let cfg = spindle_graph::RunConfig {
            thread_id: Some("t".into()),
            checkpoint_id,
            new_thread,
            ..Default::default()
        };
        spindle_graph::pregel::run(&g, values(json!({})), cfg, env)
    };
    let first = run(false, None).await.unwrap();
    assert_eq!(first.values["log"], json!(["a"]));
    let first_id = first.checkpoint.unwrap().checkpoint_id;
    // Read: the log goes on from the first run's state.
    let read = run(false, None).await.unwrap();
    assert_eq!(read.values["log"], json!(["a", "a"]));
    // Not read: the thread is taken to be empty.
    let fresh = run(true, None).await.unwrap();
    assert_eq!(fresh.values["log"], json!(["a"]));
    let history = get_state_history(&g, h.saver.as_ref(), "t", "", &Default::default())
        .await
        .unwrap();
    let roots = history
        .iter()
        .filter(|s| s.parent_checkpoint.is_none())
        .count();
    assert_eq!(roots, 2, "the fresh run's first checkpoint has no parent");
    // Time travel reads the checkpoint it names, new thread or not.
    let forked = run(true, Some(first_id)).await.unwrap();
    assert_eq!(forked.values["log"], json!(["a", "a"]));
}

#[tokio::test]
async fn static_interrupts_pause_and_continue() {
    let b = || {
        GraphBuilder::new("s")
            .channel(log_channel())
            .node("a", push("log", "a"))
            .node("b", push("log", "b"))
            .edge(START, "a")
            .edge("a", "b")
    };
    let h = Harness::new();
    let g = list_graph(b().interrupt_before(NodeSet::Some(vec!["b".into()])));
    let (out, _) = h.run(&g, Some("t1"), values(json!({})), &[], |_| {}).await;
    let out = out.unwrap();
    assert_eq!(out.next, ["b"]);
    assert_eq!(out.values["log"], json!(["a"]));
    let (out, _) = h.run(&g, Some("t1"), RunInput::Continue, &[], |_| {}).await;
    assert_eq!(out.unwrap().values["log"], json!(["a", "b"]));

    let g = list_graph(b());
    let (out, _) = h
        .run(&g, Some("t2"), values(json!({})), &[], |c| {
            c.interrupt_after = Some(NodeSet::All)
        })
        .await;
    assert_eq!(out.unwrap().next, ["b"]);
}

#[tokio::test]
async fn command_goto_routes_without_edges() {
    let g = list_graph(
        GraphBuilder::new("g")
            .channel(log_channel())
            .node(
                "a",
                node_fn(
                    |_| Ok(Command::update(json!({"log": ["a"]})).goto(Goto::Node("c".into()))),
                ),
            )
            .node("b", push("log", "b"))
            .node("c", push("log", "c"))
            .edge(START, "a"),
    );
    let (out, _) = Harness::new()
        .run(&g, None, values(json!({})), &[], |_| {})
        .await;
    assert_eq!(out.unwrap().values["log"], json!(["a", "c"]));
}

#[tokio::test]
async fn command_to_parent_updates_the_parent() {
    let child = Arc::new(
        GraphBuilder::new("child")
            .channel(log_channel())
            .node(
                "c",
                node_fn(|_| {
                    Ok(Command {
                        update: Some(json!({"log": ["from child"]})),
                        goto: vec![Goto::Node("after".into())],
                        graph: CommandGraph::Parent,
                    })
                }),
            )
            .edge(START, "c")
            .compile()
            .unwrap(),
    );
    let g = list_graph(
        GraphBuilder::new("parent")
            .channel(log_channel())
            .node_with(
                "sub",
                Arc::new(spindle_graph::nodes::SubgraphNode {
                    graph: child.clone(),
                    input_map: None,
                    output_map: None,
                }),
                NodeOptions {
                    retry: None,
                    subgraph: Some(child),
                    ..Default::default()
                },
            )
            .node("after", push("log", "after"))
            .edge(START, "sub"),
    );
    let (out, _) = Harness::new()
        .run(&g, Some("t"), values(json!({})), &[], |_| {})
        .await;
    assert_eq!(out.unwrap().values["log"], json!(["from child", "after"]));
}

#[tokio::test]
async fn interrupt_inside_a_subgraph_resumes_there() {
    let child = Arc::new(
        GraphBuilder::new("child")
            .channel(log_channel())
            .node("before", push("log", "before"))
            .node("ask", Arc::new(Asker(1)))
            .edge(START, "before")
            .edge("before", "ask")
            .compile()
            .unwrap(),
    );
    let g = list_graph(
        GraphBuilder::new("parent")
            .channel(log_channel())
            .node_with(
                "sub",
                Arc::new(spindle_graph::nodes::SubgraphNode {
                    graph: child.clone(),
                    input_map: None,
                    output_map: None,
                }),
                NodeOptions {
                    retry: None,
                    subgraph: Some(child),
                    ..Default::default()
                },
            )
            .edge(START, "sub"),
    );
    let h = Harness::new();
    let (out, _) = h.run(&g, Some("t"), values(json!({})), &[], |_| {}).await;
    let out = out.unwrap();
    assert_eq!(out.interrupts.len(), 1);
    assert_eq!(out.next, ["sub"]);
    // The subgraph's checkpoints live under `sub:<task id>`.
    let all = h
        .saver
        .list("t", None, &ListFilter::default())
        .await
        .unwrap();
    assert!(all.iter().any(|t| t.at.checkpoint_ns.starts_with("sub:")));
    let (out, _) = h
        .run(&g, Some("t"), resume(json!("yes")), &[], |_| {})
        .await;
    let out = out.unwrap();
    assert!(out.interrupts.is_empty());
    // `before` ran once: the subgraph resumed from its own checkpoint.
    assert_eq!(out.values["log"], json!(["before", "yes"]));
}

#[tokio::test]
async fn update_state_as_node_and_fork() {
    let g = common::example("chain");
    let h = Harness::new();
    let (out, _) = h
        .run(&g, Some("t"), values(json!({"n": 0})), &[], |_| {})
        .await;
    assert_eq!(out.unwrap().values, json!({"n": 3}));

    // Update as `b`: the next node is `c`.
    let r = update_state(&g, h.saver.as_ref(), "t", None, json!({"n": 10}), Some("b"))
        .await
        .unwrap();
    let s = get_state(&g, h.saver.as_ref(), "t", "", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.checkpoint.checkpoint_id, r.checkpoint_id);
    assert_eq!(s.values, json!({"n": 10}));
    assert_eq!(s.next, ["c"]);
    assert_eq!(s.metadata["source"], "update");
    let (out, _) = h.run(&g, Some("t"), RunInput::Continue, &[], |_| {}).await;
    assert_eq!(out.unwrap().values, json!({"n": 11}));

    // Fork from the checkpoint after `a` and run again from there.
    let hist = get_state_history(&g, h.saver.as_ref(), "t", "", &ListFilter::default())
        .await
        .unwrap();
    let sources: Vec<_> = hist
        .iter()
        .map(|s| s.metadata["source"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        sources,
        ["loop", "update", "loop", "loop", "loop", "loop", "input"]
    );
    let after_a = hist.iter().find(|s| s.next == ["b"]).unwrap();
    assert_eq!(after_a.values, json!({"n": 1}));
    let f = fork(&g, h.saver.as_ref(), "t", &after_a.checkpoint.checkpoint_id)
        .await
        .unwrap();
    let fs = get_state(&g, h.saver.as_ref(), "t", "", Some(&f.checkpoint_id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fs.metadata["source"], "fork");
    assert_eq!(
        fs.parent_checkpoint.unwrap().checkpoint_id,
        after_a.checkpoint.checkpoint_id
    );
    let (out, _) = h
        .run(&g, Some("t"), RunInput::Continue, &[], |c| {
            c.checkpoint_id = Some(f.checkpoint_id.clone())
        })
        .await;
    assert_eq!(out.unwrap().values, json!({"n": 3}));
    // The old branch is intact.
    let old = get_state(
        &g,
        h.saver.as_ref(),
        "t",
        "",
        Some(&hist[0].checkpoint.checkpoint_id),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(old.values, json!({"n": 11}));
}

#[tokio::test]
async fn checkpoint_metadata_has_source_step_writes_parents() {
    let g = common::example("chain");
    let h = Harness::new();
    h.run(&g, Some("t"), values(json!({"n": 0})), &[], |c| {
        c.config = json!({"metadata": {"run_id": "r1"}})
    })
    .await
    .0
    .unwrap();
    let hist = h
        .saver
        .list("t", Some(""), &ListFilter::default())
        .await
        .unwrap();
    let steps: Vec<i64> = hist
        .iter()
        .map(|t| t.metadata["step"].as_i64().unwrap())
        .collect();
    assert_eq!(steps, [3, 2, 1, 0, -1]);
    assert_eq!(hist[0].metadata["writes"], json!({"c": {"n": 3}}));
    assert_eq!(hist[4].metadata["writes"], json!({"__start__": {"n": 0}}));
    assert_eq!(hist[0].metadata["parents"], json!({}));
    assert_eq!(hist[0].metadata["run_id"], "r1");
    let limited = h
        .saver
        .list(
            "t",
            Some(""),
            &ListFilter {
                before: Some(hist[1].at.checkpoint_id.clone()),
                limit: Some(2),
                metadata: Some(json!({"source": "loop"})),
            },
        )
        .await
        .unwrap();
    let steps: Vec<i64> = limited
        .iter()
        .map(|t| t.metadata["step"].as_i64().unwrap())
        .collect();
    assert_eq!(steps, [1, 0]);
}

#[tokio::test]
async fn durability_exit_saves_only_the_end() {
    let g = common::example("chain");
    let h = Harness::new();
    h.run(&g, Some("t"), values(json!({"n": 0})), &[], |c| {
        c.durability = Durability::Exit
    })
    .await
    .0
    .unwrap();
    let all = h
        .saver
        .list("t", None, &ListFilter::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    let s = get_state(&g, h.saver.as_ref(), "t", "", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.values, json!({"n": 3}));
    assert!(s.next.is_empty());
}

#[tokio::test]
async fn copy_and_delete_threads() {
    let g = common::example("chain");
    let h = Harness::new();
    h.run(&g, Some("a"), values(json!({"n": 0})), &[], |_| {})
        .await
        .0
        .unwrap();
    h.saver.copy_thread("a", "b").await.unwrap();
    let s = get_state(&g, h.saver.as_ref(), "b", "", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.values, json!({"n": 3}));
    h.saver.delete_thread("a").await.unwrap();
    assert!(get_state(&g, h.saver.as_ref(), "a", "", None)
        .await
        .unwrap()
        .is_none());
    assert!(get_state(&g, h.saver.as_ref(), "b", "", None)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn long_threads_write_only_what_changed() {
    let g = common::example("echo");
    let h = Harness::new();
    let msgs: Vec<Value> = (0..1000).map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("message number {i}")})).collect();
    h.run(&g, Some("t"), values(json!({"messages": msgs})), &[], |c| {
        c.durability = Durability::Sync
    })
    .await
    .0
    .unwrap();
    let before = h.saver.bytes_written();
    h.run(
        &g,
        Some("t"),
        values(json!({"messages": [{"role": "user", "content": "one more"}]})),
        &[],
        |c| c.durability = Durability::Sync,
    )
    .await
    .0
    .unwrap();
    let per_turn = h.saver.bytes_written() - before;
    assert!(
        per_turn < 8_000,
        "a turn on a 1,000-message thread wrote {per_turn} bytes"
    );
    let s = get_state(&g, h.saver.as_ref(), "t", "", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.values["messages"].as_array().unwrap().len(), 1003);
}

#[test]
fn graphs_and_runs_can_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<Graph>();
    send_sync::<spindle_graph::checkpoint::InMemoryCheckpointer>();
    let g = common::example("echo");
    let fut = spindle_graph::pregel::run(
        &g,
        RunInput::Continue,
        Default::default(),
        Default::default(),
    );
    send(&fut);
}

#[tokio::test]
async fn the_in_memory_checkpointer_passes_the_conformance_suite() {
    let saver = spindle_graph::checkpoint::InMemoryCheckpointer::new();
    spindle_graph::checkpoint::conformance::check(&saver)
        .await
        .unwrap();
}

#[tokio::test]
async fn static_interrupt_inside_a_subgraph_pauses_the_parent() {
    let child = Arc::new(
        GraphBuilder::new("child")
            .channel(log_channel())
            .node("x", push("log", "x"))
            .node("y", push("log", "y"))
            .edge(START, "x")
            .edge("x", "y")
            .interrupt_before(NodeSet::Some(vec!["y".into()]))
            .compile()
            .unwrap(),
    );
    let g = list_graph(
        GraphBuilder::new("parent")
            .channel(log_channel())
            .node_with(
                "sub",
                Arc::new(spindle_graph::nodes::SubgraphNode {
                    graph: child.clone(),
                    input_map: None,
                    output_map: None,
                }),
                NodeOptions {
                    retry: None,
                    subgraph: Some(child),
                    ..Default::default()
                },
            )
            .edge(START, "sub"),
    );
    let h = Harness::new();
    let (out, _) = h.run(&g, Some("t"), values(json!({})), &[], |_| {}).await;
    let out = out.unwrap();
    assert_eq!(out.next, ["sub"]);
    let (out, _) = h.run(&g, Some("t"), RunInput::Continue, &[], |_| {}).await;
    let out = out.unwrap();
    assert!(out.next.is_empty());
    assert_eq!(out.values["log"], json!(["x", "y"]));
}

#[tokio::test]
async fn a_run_that_died_after_its_input_checkpoint_resumes_with_the_input() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let g = list_graph(
        GraphBuilder::new("g")
            .channel(log_channel())
            .node("a", push("log", "a"))
            .branch(
                START,
                router_fn(move |_| {
                    // The first attempt dies while routing from `__start__`.
                    if c2.fetch_add(1, Ordering::SeqCst) == 0 {
                        Err(NodeError::new("SystemExit", "worker died"))
                    } else {
                        Ok(vec![Goto::Node("a".into())])
                    }
                }),
                None,
                Some(vec!["a".into()]),
            ),
    );
    let h = Harness::new();
    let (out, _) = h
        .run(&g, Some("t"), values(json!({"log": ["input"]})), &[], |c| {
            c.durability = Durability::Sync
        })
        .await;
    assert_eq!(out.unwrap_err().class(), "SystemExit");
    let s = get_state(&g, h.saver.as_ref(), "t", "", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.next, ["__start__"]);
    let (out, _) = h.run(&g, Some("t"), RunInput::Continue, &[], |_| {}).await;
    assert_eq!(out.unwrap().values["log"], json!(["input", "a"]));
}

#[tokio::test]
async fn durability_exit_keeps_interrupts_for_resume() {
    let g = common::example("approval");
    let h = Harness::new();
    let input = values(json!({"messages": [{"role": "user", "content": "go"}]}));
    let (out, _) = h
        .run(&g, Some("t"), input, &[], |c| {
            c.durability = Durability::Exit
        })
        .await;
    assert_eq!(out.unwrap().interrupts.len(), 1);
    let s = get_state(&g, h.saver.as_ref(), "t", "", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.interrupts.len(), 1, "the interrupt was saved at exit");
    assert!(
        s.parent_checkpoint.is_none(),
        "no dangling parent: nothing else was saved"
    );
    let (out, _) = h
        .run(&g, Some("t"), resume(json!("ok")), &[], |c| {
            c.durability = Durability::Exit
        })
        .await;
    assert_eq!(common::texts(&out.unwrap().values), ["go", "decision: ok"]);
    let hist = get_state_history(&g, h.saver.as_ref(), "t", "", &ListFilter::default())
        .await
        .unwrap();
    assert_eq!(hist.len(), 2);
    assert_eq!(
        hist[0].parent_checkpoint.as_ref().unwrap().checkpoint_id,
        hist[1].checkpoint.checkpoint_id
    );
}

#[tokio::test]
async fn joins_wait_for_every_source() {
    // a fans out to b and c; b takes two steps (b -> b2). `merge` waits for both b2 and c.
    let yaml = r#"
state: {log: append}
nodes:
  a: {kind: script, code: '#{ log: "a" }'}
  b: {kind: script, code: '#{ log: "b" }'}
  b2: {kind: script, code: '#{ log: "b2" }'}
  c: {kind: script, code: '#{ log: "c" }'}
  merge: {kind: script, code: '#{ log: "merge" }'}
edges:
  - {from: START, to: a}
  - {from: a, to: [b, c]}
  - {from: b, to: b2}
  - {from: [b2, c], to: merge}
"#;
    let g = Arc::new(
        spindle_graph::spec::load_str(yaml, "j.yaml", "j", spindle_graph::spec::Format::Yaml)
            .unwrap(),
    );
    let h = Harness::new();
    let (out, _) = h.run(&g, Some("t"), values(json!({})), &[], |_| {}).await;
    assert_eq!(
        out.unwrap().values,
        json!({"log": ["a", "b", "c", "b2", "merge"]})
    );
    let drawn = g.drawable(spindle_graph::XRay::Off);
    assert!(drawn["edges"]
        .as_array()
        .unwrap()
        .contains(&json!({"source": "c", "target": "merge"})));
    // The hidden channel does not leak into schemas or history.
    assert_eq!(
        g.schemas().state_schema["properties"]
            .as_object()
            .unwrap()
            .len(),
        1
    );
    let hist = get_state_history(&g, h.saver.as_ref(), "t", "", &ListFilter::default())
        .await
        .unwrap();
    assert!(hist
        .iter()
        .all(|s| !s.to_json().to_string().contains("__join__")));
}

/// `__start__` holds the input until the start step takes it; its version moves when the
/// input arrives and once when it is taken, as LangGraph's ephemeral channel does, not at
/// every step after (each move would store one more blob).
#[tokio::test]
async fn the_start_channel_moves_when_the_input_arrives_and_when_it_is_taken() {
    let g = common::example("chain");
    let h = Harness::new();
    for _ in 0..2 {
        h.run(&g, Some("t"), values(json!({"n": 0})), &[], |_| {})
            .await
            .0
            .unwrap();
    }
    let mut history = h
        .saver
        .list("t", Some(""), &ListFilter::default())
        .await
        .unwrap();
    history.reverse();
    let start_versions: Vec<u64> = history
        .iter()
        .map(|t| t.checkpoint.channel_versions["__start__"])
        .collect();
    // Per run: the input checkpoint, the start step's, then a, b and c.
    assert_eq!(start_versions.len(), 10);
    for run in start_versions.chunks(5) {
        assert!(
            run[0] < run[1],
            "taken at the start step: {start_versions:?}"
        );
        assert!(
            run[1..].iter().all(|&v| v == run[1]),
            "unchanged after: {start_versions:?}"
        );
    }
    assert!(start_versions[4] < start_versions[5], "the next input");
}

#[tokio::test]
async fn async_durability_saves_every_checkpoint_in_order() {
    let g = common::example("chain");
    let h = Harness::new();
    h.run(&g, Some("t"), values(json!({"n": 0})), &[], |c| {
        c.durability = Durability::Async
    })
    .await
    .0
    .unwrap();
    assert_one_chain_of(h.saver.as_ref(), 5).await;
}

/// Thread `t` holds `len` checkpoints, each the child of the one saved before it.
async fn assert_one_chain_of(saver: &dyn Checkpointer, len: usize) {
    let hist = saver
        .list("t", Some(""), &ListFilter::default())
        .await
        .unwrap();
    assert_eq!(hist.len(), len);
    for pair in hist.windows(2) {
        assert_eq!(
            pair[0].parent_id.as_deref(),
            Some(pair[1].at.checkpoint_id.as_str())
        );
    }
    assert!(hist[len - 1].parent_id.is_none());
}

/// A checkpointer whose queued saves are applied in order, by one task, once `open` is set:
/// until then every queued save of a run waits.
struct GatedSaver {
    inner: Arc<InMemoryCheckpointer>,
    queue: mpsc::UnboundedSender<GatedWrite>,
}

/// A queued save and where to say it is done.
type GatedWrite = (QueuedWrite, oneshot::Sender<Result<(), CheckpointError>>);

impl GatedSaver {
    fn new() -> (Arc<Self>, watch::Sender<bool>) {
        let inner = Arc::new(InMemoryCheckpointer::new());
        let (open, mut gate) = watch::channel(false);
        let (queue, mut queued) = mpsc::unbounded_channel::<GatedWrite>();
        let saver = inner.clone();
        tokio::spawn(async move {
            let _ = gate.wait_for(|open| *open).await;
            while let Some((write, done)) = queued.recv().await {
                let _ = done.send(write.apply(saver.as_ref()).await);
            }
        });
        (Arc::new(Self { inner, queue }), open)
    }
}

#[async_trait]
impl Checkpointer for GatedSaver {
    async fn put(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint: &Checkpoint,
        metadata: &Value,
        parent_id: Option<&str>,
        blobs: &[ChannelBlob],
    ) -> Result<(), CheckpointError> {
        let inner = &self.inner;
        inner
            .put(
                thread_id,
                checkpoint_ns,
                checkpoint,
                metadata,
                parent_id,
                blobs,
            )
            .await
    }

    async fn put_writes(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        writes: &[PendingWrite],
    ) -> Result<(), CheckpointError> {
        let inner = &self.inner;
        inner
            .put_writes(thread_id, checkpoint_ns, checkpoint_id, writes)
            .await
    }

    async fn get_tuple(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<CheckpointTuple>, CheckpointError> {
        self.inner
            .get_tuple(thread_id, checkpoint_ns, checkpoint_id)
            .await
    }

    async fn list(
        &self,
        thread_id: &str,
        checkpoint_ns: Option<&str>,
        filter: &ListFilter,
    ) -> Result<Vec<CheckpointTuple>, CheckpointError> {
        self.inner.list(thread_id, checkpoint_ns, filter).await
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), CheckpointError> {
        self.inner.delete_thread(thread_id).await
    }

    async fn copy_thread(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        self.inner.copy_thread(from, to).await
    }

    fn queue(&self, write: QueuedWrite) -> Result<WriteReceipt, Box<QueuedWrite>> {
        let (done, receipt) = oneshot::channel();
        self.queue
            .send((write, done))
            .map_err(|refused| Box::new(refused.0 .0))?;
        Ok(Box::pin(async move {
            receipt
                .await
                .unwrap_or_else(|_| Err(CheckpointError::Backend("the gated saver stopped".into())))
        }))
    }
}

/// Runs `graph` under `Durability::Async` on a saver whose saves wait until the gate opens;
/// returns the run and the `n` of each `values` event as it comes.
fn gated_async_run(
    graph: Arc<Graph>,
    saver: Arc<GatedSaver>,
    input: Value,
) -> (
    tokio::task::JoinHandle<Result<spindle_graph::RunOutcome, spindle_graph::RunError>>,
    mpsc::Receiver<spindle_graph::StreamEvent>,
) {
    let (sink, events) = mpsc::channel(10_000);
    let cfg = spindle_graph::RunConfig {
        thread_id: Some("t".into()),
        stream_modes: vec![StreamMode::Values],
        durability: Durability::Async,
        ..Default::default()
    };
    let env = spindle_graph::RunEnv {
        checkpointer: Some(saver),
        sink: Some(sink.into()),
        ..Default::default()
    };
    let run =
        tokio::spawn(
            async move { spindle_graph::pregel::run(&graph, values(input), cfg, env).await },
        );
    (run, events)
}

/// Runs chain (`n` from 0) with `run_leaving_saves` under `Durability::Async` on `saver`.
async fn chain_leaving_saves(
    saver: Arc<dyn Checkpointer>,
    interrupt_before: Option<NodeSet>,
) -> (spindle_graph::RunOutcome, Option<WriteReceipt>) {
    let cfg = spindle_graph::RunConfig {
        thread_id: Some("t".into()),
        durability: Durability::Async,
        interrupt_before,
        ..Default::default()
    };
    let env = spindle_graph::RunEnv {
        checkpointer: Some(saver),
        ..Default::default()
    };
    let graph = common::example("chain");
    spindle_graph::pregel::run_leaving_saves(&graph, values(json!({"n": 0})), cfg, env)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_run_leaving_saves_returns_before_they_are_done_with_their_receipt() {
    let (saver, open) = GatedSaver::new();
    let run = chain_leaving_saves(saver.clone(), None);
    let (done, saves) = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the run ended without waiting for its saves");
    assert_eq!(done.values, json!({"n": 3}));
    let saves = saves.expect("the queued saves are handed back");
    let saved = saver.inner.list("t", None, &ListFilter::default()).await;
    assert!(saved.unwrap().is_empty(), "nothing was saved yet");
    open.send(true).unwrap();
    saves.await.unwrap();
    assert_one_chain_of(saver.inner.as_ref(), 5).await;
    let latest = saver.inner.get_tuple("t", "", None).await.unwrap().unwrap();
    assert_eq!(
        Some(latest.at),
        done.checkpoint,
        "the outcome names the last save"
    );
}

#[tokio::test]
async fn a_run_leaving_saves_waits_for_them_when_it_stops_short_or_cannot_leave_them() {
    // Interrupted: the caller reads the stored checkpoint, so the run waits for it.
    let (saver, open) = GatedSaver::new();
    open.send(true).unwrap();
    let before_b = Some(NodeSet::Some(vec!["b".into()]));
    let (done, saves) = chain_leaving_saves(saver.clone(), before_b).await;
    assert_eq!(done.next, vec!["b".to_string()]);
    assert!(saves.is_none(), "an interrupted run waited for its saves");
    assert_one_chain_of(saver.inner.as_ref(), 3).await;

    // A backend without a queue of its own: the engine orders the saves, so nothing the
    // caller queues afterwards would be applied after them.
    let saver = Arc::new(InMemoryCheckpointer::new());
    let (done, saves) = chain_leaving_saves(saver.clone(), None).await;
    assert_eq!(done.values, json!({"n": 3}));
    assert!(saves.is_none(), "the run waited for its saves");
    assert_one_chain_of(saver.as_ref(), 5).await;
}

/// The `n` of the next `values` event, or `None` when none comes within `wait`.
async fn next_n(
    events: &mut mpsc::Receiver<spindle_graph::StreamEvent>,
    wait: Duration,
) -> Option<i64> {
    let event = tokio::time::timeout(wait, events.recv()).await.ok()??;
    event.data["n"].as_i64()
}

#[tokio::test]
async fn async_durability_runs_the_next_steps_while_earlier_ones_are_saved() {
    let (saver, open) = GatedSaver::new();
    let (run, mut events) =
        gated_async_run(common::example("chain"), saver.clone(), json!({"n": 0}));
    // Every step runs (the values after a, b and c) while not one save has been applied.
    for n in 0..=3 {
        assert_eq!(next_n(&mut events, Duration::from_secs(10)).await, Some(n));
    }
    let saved = saver
        .inner
        .list("t", None, &ListFilter::default())
        .await
        .unwrap();
    assert!(
        saved.is_empty(),
        "saves were applied before the gate opened"
    );
    // The run ends only once its saves are done, and they went in in order.
    assert!(!run.is_finished());
    open.send(true).unwrap();
    assert_eq!(run.await.unwrap().unwrap().values, json!({"n": 3}));
    assert_one_chain_of(saver.inner.as_ref(), 5).await;
}

#[tokio::test]
async fn async_durability_lets_a_run_go_only_so_far_ahead_of_its_saves() {
    let graph = list_graph(
        GraphBuilder::new("loop")
            .channel(ChannelSpec::new("n", ChannelKind::LastValue))
            .node(
                "inc",
                node_fn(|s| {
                    Ok(Command::update(
                        json!({"n": s["n"].as_i64().unwrap_or(0) + 1}),
                    ))
                }),
            )
            .edge(START, "inc")
            .branch(
                "inc",
                router_fn(|s| {
                    let next = if s["n"].as_i64() < Some(20) {
                        "inc"
                    } else {
                        END
                    };
                    Ok(vec![Goto::Node(next.into())])
                }),
                None,
                None,
            ),
    );
    let (saver, open) = GatedSaver::new();
    let (run, mut events) = gated_async_run(graph, saver, json!({"n": 0}));
    let mut seen = Vec::new();
    while let Some(n) = next_n(&mut events, Duration::from_millis(500)).await {
        seen.push(n);
    }
    // The input's values, then at most 16 steps ahead of the first save.
    assert!(
        (2..=18).contains(&seen.len()),
        "the run went {} steps ahead of its saves",
        seen.len()
    );
    open.send(true).unwrap();
    assert_eq!(run.await.unwrap().unwrap().values, json!({"n": 20}));
}
