//! State edits and the runs that follow them, as the reference server does them (captured
//! by `fixtures/capture_subgraph_edits.py`): a run given a checkpoint (time travel or not),
//! an edit of a subgraph's state while it waits at an interrupt, and an edit as the input.

mod common;

use std::sync::Arc;

use common::{texts, Harness};
use serde_json::{json, Value};
use spindle_graph::checkpoint::{CheckpointTuple, Checkpointer, ListFilter};
use spindle_graph::pregel::{self, NodeUpdate};
use spindle_graph::spec::{load_str, Format};
use spindle_graph::{Graph, NodeSet, RunInput, StreamEvent, StreamMode};

fn fixture() -> Value {
    let path = format!(
        "{}/tests/fixtures/ref/subgraph_edits.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
}

/// `(source, step, next)` of each state, newest first.
fn brief(states: &[Value]) -> Vec<(String, i64, Vec<String>)> {
    states
        .iter()
        .map(|s| {
            let next = s["next"].as_array().unwrap().iter();
            (
                s["metadata"]["source"].as_str().unwrap().to_string(),
                s["metadata"]["step"].as_i64().unwrap(),
                next.map(|n| n.as_str().unwrap().to_string()).collect(),
            )
        })
        .collect()
}

async fn history(g: &Graph, h: &Harness, ns: &str) -> Vec<Value> {
    pregel::get_state_history(g, h.saver.as_ref(), "t", ns, &ListFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|s| s.to_json())
        .collect()
}

/// The `debug` checkpoint events of the root graph: `(source, step, checkpoint id)`.
fn debug_checkpoints(events: &[StreamEvent]) -> Vec<(String, i64, String)> {
    events
        .iter()
        .filter(|e| e.mode == StreamMode::Debug && e.namespace.is_empty())
        .filter(|e| e.data["type"] == "checkpoint")
        .map(|e| {
            let p = &e.data["payload"];
            (
                p["metadata"]["source"].as_str().unwrap().to_string(),
                p["metadata"]["step"].as_i64().unwrap(),
                p["config"]["configurable"]["checkpoint_id"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

/// `(source, step)` of the debug checkpoint events the reference streamed under `key`.
fn reference_checkpoints(key: &str) -> Vec<(String, i64)> {
    fixture()[key]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "debug" && e["data"]["type"] == "checkpoint")
        .map(|e| {
            let md = &e["data"]["payload"]["metadata"];
            (
                md["source"].as_str().unwrap().to_string(),
                md["step"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// `chain` stopped before `b` on thread `t`.
async fn chain_before_b(h: &Harness) -> Arc<Graph> {
    let g = common::example("chain");
    let (out, _) = h
        .run(&g, Some("t"), RunInput::Values(json!({"n": 0})), &[], |c| {
            c.interrupt_before = NodeSet::from_value(&json!(["b"]))
        })
        .await;
    assert_eq!(out.unwrap().next, ["b"]);
    g
}

async fn latest(h: &Harness) -> CheckpointTuple {
    h.saver.get_tuple("t", "", None).await.unwrap().unwrap()
}

async fn edit(g: &Graph, h: &Harness, ns: &str, update: NodeUpdate) -> pregel::PreparedUpdate {
    let base = h.saver.get_tuple("t", ns, None).await.unwrap();
    let prepared = pregel::prepare_update_at(g, "t", ns, base.as_ref(), &[update])
        .await
        .unwrap();
    prepared.save(h.saver.as_ref()).await.unwrap();
    prepared
}

fn update(values: Value, as_node: Option<&str>) -> NodeUpdate {
    NodeUpdate {
        values,
        as_node: as_node.map(str::to_string),
        goto: Vec::new(),
    }
}

#[tokio::test]
async fn a_run_given_the_latest_edit_continues_from_it_without_a_fork() {
    let h = Harness::new();
    let g = chain_before_b(&h).await;
    let edited = edit(&g, &h, "", update(json!({"n": 10}), None)).await;
    let id = edited.at().checkpoint_id.clone();
    let (out, events) = h
        .run(
            &g,
            Some("t"),
            RunInput::Continue,
            &[StreamMode::Debug],
            |c| c.checkpoint_id = Some(id.clone()),
        )
        .await;
    assert_eq!(out.unwrap().values, json!({"n": 12}));
    // As the reference: the stream starts with the edit's own checkpoint, then the steps.
    let seen = debug_checkpoints(&events);
    assert_eq!(seen[0], ("update".to_string(), 2, id.clone()));
    let sources: Vec<_> = seen.iter().map(|(s, n, _)| (s.clone(), *n)).collect();
    assert_eq!(sources, reference_checkpoints("latest_update_stream"));
    let hist = brief(&history(&g, &h, "").await);
    assert!(hist.iter().all(|(s, _, _)| s != "fork"), "{hist:?}");
    assert_eq!(hist[2], ("update".to_string(), 2, vec!["b".to_string()]));
}

#[tokio::test]
async fn a_run_given_an_edit_the_thread_moved_past_forks() {
    let h = Harness::new();
    let g = chain_before_b(&h).await;
    let edited = edit(&g, &h, "", update(json!({"n": 10}), None)).await;
    let id = edited.at().checkpoint_id.clone();
    let (out, _) = h.run(&g, Some("t"), RunInput::Continue, &[], |_| {}).await;
    assert_eq!(out.unwrap().values, json!({"n": 12}));
    let (out, events) = h
        .run(
            &g,
            Some("t"),
            RunInput::Continue,
            &[StreamMode::Debug],
            |c| c.checkpoint_id = Some(id.clone()),
        )
        .await;
    assert_eq!(out.unwrap().values, json!({"n": 12}));
    let seen = debug_checkpoints(&events);
    assert_eq!((seen[0].0.as_str(), seen[0].1), ("fork", 3));
    let fork = h
        .saver
        .get_tuple("t", "", Some(&seen[0].2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fork.parent_id.as_deref(), Some(id.as_str()));
}

#[tokio::test]
async fn a_run_given_the_latest_step_forks_as_the_reference_does() {
    // The reference branches off any checkpoint a run names unless an edit made it: a run
    // given the latest `loop` checkpoint starts with a `fork` copy of it.
    let h = Harness::new();
    let g = chain_before_b(&h).await;
    let head = latest(&h).await;
    let id = head.checkpoint.id.clone();
    let (out, events) = h
        .run(
            &g,
            Some("t"),
            RunInput::Continue,
            &[StreamMode::Debug],
            |c| c.checkpoint_id = Some(id.clone()),
        )
        .await;
    assert_eq!(out.unwrap().values, json!({"n": 3}));
    let seen: Vec<_> = debug_checkpoints(&events)
        .into_iter()
        .map(|(s, n, _)| (s, n))
        .collect();
    assert_eq!(seen, reference_checkpoints("latest_loop_stream"));
    assert_eq!(seen[0], ("fork".to_string(), 2));
}

/// The twin of the reference's `nested_ask` (`fixtures/ref_extra/stream_graph.py`): `prep`,
/// then `child`, whose `c1` runs and whose `ask` waits at an interrupt.
const NESTED_ASK: &str = r#"
state: {messages: messages}
graphs:
  child:
    state: {messages: messages}
    nodes:
      c1: {kind: script, code: '#{ messages: [ai("c1")] }'}
      ask:
        kind: script
        code: |
          let v = interrupt(#{ question: "approve?" });
          #{ messages: [ai("decision: " + v)] }
    edges:
      - {from: START, to: c1}
      - {from: c1, to: ask}
      - {from: ask, to: END}
nodes:
  prep: {kind: script, code: '#{ messages: [ai("prep")] }'}
  child: {kind: subgraph, graph: child}
edges:
  - {from: START, to: prep}
  - {from: prep, to: child}
  - {from: child, to: END}
"#;

/// `nested_ask` run on thread `t` until `ask` waits; answers the graph and `child`'s namespace.
async fn nested_ask_waiting(h: &Harness) -> (Arc<Graph>, String) {
    let g = Arc::new(load_str(NESTED_ASK, "nested_ask.yaml", "nested_ask", Format::Yaml).unwrap());
    let input = json!({"messages": [{"role": "user", "content": "hi"}]});
    let (out, _) = h
        .run(&g, Some("t"), RunInput::Values(input), &[], |_| {})
        .await;
    assert_eq!(out.unwrap().interrupts.len(), 1);
    let state = pregel::get_state(&g, h.saver.as_ref(), "t", "", None)
        .await
        .unwrap()
        .unwrap();
    let ns = state.tasks[0]
        .checkpoint
        .as_ref()
        .unwrap()
        .checkpoint_ns
        .clone();
    (g, ns)
}

fn message(content: &str) -> Value {
    json!({"messages": [{"type": "ai", "content": content, "id": format!("id-{content}")}]})
}

#[tokio::test]
async fn a_subgraph_edited_at_its_interrupt_resumes_from_the_edit() {
    let f = fixture();
    let h = Harness::new();
    let (g, ns) = nested_ask_waiting(&h).await;
    let root_before = pregel::get_state(&g, h.saver.as_ref(), "t", "", None)
        .await
        .unwrap()
        .unwrap();

    let edited = edit(&g, &h, &ns, update(message("edited"), None)).await;
    assert_eq!(edited.at().checkpoint_ns, ns);
    // The subgraph's state: the edit as `c1` (the node that ran last), `ask` next, its
    // parents the root checkpoint its task runs from; the root is untouched.
    let sub = edited.snapshot(&g).to_json();
    let theirs = &f["sub_after_update"];
    assert_eq!(texts(&sub["values"]), texts(&theirs["values"]));
    assert_eq!(sub["next"], theirs["next"]);
    assert_eq!(sub["metadata"]["source"], theirs["metadata"]["source"]);
    assert_eq!(sub["metadata"]["step"], theirs["metadata"]["step"]);
    assert_eq!(
        sub["metadata"]["parents"],
        json!({"": root_before.checkpoint.checkpoint_id})
    );
    let root = pregel::get_state_with_subgraphs(&g, h.saver.as_ref(), "t", "", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(root.checkpoint, root_before.checkpoint);
    assert_eq!(root.interrupts, root_before.interrupts);
    let inlined = root.tasks[0].state.as_ref().unwrap();
    assert_eq!(inlined.checkpoint.checkpoint_id, edited.at().checkpoint_id);

    // Resumed: `ask` runs again from the edited state and takes the resume value.
    let (out, _) = h
        .run(
            &g,
            Some("t"),
            RunInput::Command {
                resume: Some(json!("yes")),
                update: None,
                goto: Vec::new(),
            },
            &[],
            |_| {},
        )
        .await;
    let out = out.unwrap();
    assert!(out.interrupts.is_empty() && out.next.is_empty());
    assert_eq!(texts(&out.values), texts(&f["sub_final"]["values"]));
    assert_eq!(
        texts(&out.values),
        ["hi", "prep", "c1", "edited", "decision: yes"]
    );
    let fixture_history = |k: &str| {
        let list: Vec<Value> = f[k].as_array().unwrap().clone();
        brief(&list)
    };
    assert_eq!(
        brief(&history(&g, &h, &ns).await),
        fixture_history("sub_final_sub_history")
    );
    assert_eq!(
        brief(&history(&g, &h, "").await),
        fixture_history("sub_final_history")
    );
}

#[tokio::test]
async fn a_subgraph_edited_as_its_last_node_ends_on_the_next_run() {
    let f = fixture();
    let h = Harness::new();
    let (g, ns) = nested_ask_waiting(&h).await;
    let edited = edit(&g, &h, &ns, update(message("x"), Some("ask"))).await;
    assert!(edited.snapshot(&g).next.is_empty());
    let (out, _) = h.run(&g, Some("t"), RunInput::Continue, &[], |_| {}).await;
    let out = out.unwrap();
    assert!(out.interrupts.is_empty() && out.next.is_empty());
    assert_eq!(texts(&out.values), texts(&f["sub_as_ask_continue"]));
}

#[tokio::test]
async fn a_subgraph_edit_names_a_subgraph_and_its_nodes() {
    let h = Harness::new();
    let (g, ns) = nested_ask_waiting(&h).await;
    let base = h.saver.get_tuple("t", &ns, None).await.unwrap();
    let refused = |ns: String, node: &'static str| {
        let (g, base) = (g.clone(), base.clone());
        async move {
            pregel::prepare_update_at(
                &g,
                "t",
                &ns,
                base.as_ref(),
                &[update(message("x"), Some(node))],
            )
            .await
            .unwrap_err()
            .to_string()
        }
    };
    // `prep` is the parent's node, not the subgraph's.
    assert_eq!(
        refused(ns.clone(), "prep").await,
        "Node prep does not exist"
    );
    assert_eq!(
        refused("nope:123".into(), "c1").await,
        "Subgraph nope not found"
    );
    assert_eq!(
        refused(format!("{ns}|deeper:1"), "c1").await,
        "Subgraph child|deeper not found"
    );
}

#[tokio::test]
async fn an_edit_as_the_input_is_a_runs_input_checkpoint() {
    let f = fixture();
    let g = common::example("chain");
    let h = Harness::new();
    let input = update(json!({"n": 5}), Some(pregel::INPUT));
    let prepared = pregel::prepare_update(&g, "t", None, std::slice::from_ref(&input))
        .await
        .unwrap();
    prepared.save(h.saver.as_ref()).await.unwrap();
    let first = prepared.snapshot(&g).to_json();
    let theirs = &f["input_history"][0];
    assert_eq!(
        brief(std::slice::from_ref(&first)),
        brief(std::slice::from_ref(theirs))
    );
    assert_eq!(first["values"], theirs["values"]);
    assert_eq!(first["tasks"][0]["name"], "__start__");
    // A run without input takes it as its input.
    let (out, _) = h.run(&g, Some("t"), RunInput::Continue, &[], |_| {}).await;
    assert_eq!(out.unwrap().values, f["input_run"]);
    let ours = history(&g, &h, "").await;
    let list: Vec<Value> = f["input_run_history"].as_array().unwrap().clone();
    assert_eq!(brief(&ours), brief(&list));
    // The start task shows the input as its result, as after a run's input.
    assert_eq!(ours.last().unwrap()["tasks"][0]["result"], json!({"n": 5}));

    // After a step: one step later, and the graph runs from its start again.
    let h = Harness::new();
    let step = pregel::prepare_update(&g, "t", None, &[update(json!({"n": 1}), Some("c"))])
        .await
        .unwrap();
    step.save(h.saver.as_ref()).await.unwrap();
    let again = pregel::prepare_update(&g, "t", Some(&step.tuple), std::slice::from_ref(&input))
        .await
        .unwrap();
    again.save(h.saver.as_ref()).await.unwrap();
    let list: Vec<Value> = f["input_after_c_history"].as_array().unwrap().clone();
    assert_eq!(brief(&history(&g, &h, "").await), brief(&list));
    let (out, _) = h.run(&g, Some("t"), RunInput::Continue, &[], |_| {}).await;
    assert_eq!(out.unwrap().values, f["input_after_c_run"]);

    // Only on its own, and only an object.
    let both = [input.clone(), update(json!({"n": 1}), Some("a"))];
    let err = pregel::prepare_update(&g, "t", None, &both)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Cannot apply multiple updates when updating as input"
    );
    let null = update(Value::Null, Some(pregel::INPUT));
    assert!(pregel::prepare_update(&g, "t", None, &[null])
        .await
        .is_err());
}

#[tokio::test]
async fn a_waiting_task_is_dropped_by_an_edit_as_the_input() {
    // As a run given input drops the tasks its thread left waiting (the reference keeps
    // them, and the next run then fails on two writes of `n` in one step).
    let h = Harness::new();
    let g = chain_before_b(&h).await;
    let base = latest(&h).await;
    let input = update(json!({"n": 100}), Some(pregel::INPUT));
    let prepared = pregel::prepare_update(&g, "t", Some(&base), &[input])
        .await
        .unwrap();
    prepared.save(h.saver.as_ref()).await.unwrap();
    assert_eq!(prepared.snapshot(&g).next, ["__start__"]);
    let (out, _) = h.run(&g, Some("t"), RunInput::Continue, &[], |_| {}).await;
    assert_eq!(out.unwrap().values, json!({"n": 103}));
}
