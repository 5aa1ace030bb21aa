//! The `messages` (accumulated) and `events` stream modes of the example graphs compared with
//! what the reference server sent for the Python twins (`tests/fixtures/ref/stream_modes.json`,
//! from `capture_stream_modes.py`). Ids and timestamps are normalised; run ids become `run0`,
//! `run1`, ... in order of appearance, so the tree of runs (`parent_ids`) is compared too.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{example, norm, norm_str, Harness};
use serde_json::{json, Map, Value};
use spindle_graph::{Graph, RunInput, RunOutcome, StreamEvent, StreamMode};

const THREAD: &str = "0b2a3f3e-6f39-4d7a-9a51-3c1f4d8e2b10";
const RUN_ID: &str = "1f0a4a8e-2d6b-4c1e-9f3a-5b7c9d1e3f50";

fn fixture(key: &str) -> Vec<Value> {
    let path = format!(
        "{}/tests/fixtures/ref/stream_modes.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let all: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    all[key]
        .as_array()
        .unwrap_or_else(|| panic!("no fixture {key}"))
        .iter()
        .filter(|e| e["event"] != "metadata" && e["event"] != "error")
        .map(|e| (e["event"].as_str().unwrap().to_string(), e["data"].clone()))
        .map(|(event, data)| json!({"event": event, "data": data}))
        .collect()
}

/// Metadata keys the engine sets; the rest is the server's (versions, plan, host, ...).
const META_KEYS: [&str; 8] = [
    "langgraph_step",
    "langgraph_node",
    "langgraph_triggers",
    "langgraph_path",
    "langgraph_checkpoint_ns",
    "checkpoint_ns",
    "ls_integration",
    "ls_model_type",
];

fn meta_view(md: &Value) -> Value {
    let mut out = Map::new();
    for k in META_KEYS {
        if let Some(v) = md.get(k) {
            out.insert(k.to_string(), norm(v));
        }
    }
    Value::Object(out)
}

/// Labels run ids `run0`, `run1`, ... in order of first appearance.
#[derive(Default)]
struct Runs(HashMap<String, String>);

impl Runs {
    fn label(&mut self, id: &Value) -> Value {
        let id = id.as_str().unwrap_or_default().to_string();
        let n = self.0.len();
        json!(self.0.entry(id).or_insert_with(|| format!("run{n}")))
    }
}

/// One event as compared: `messages/metadata` keeps the engine's metadata keys, `events`
/// dicts get their run ids labelled.
fn view(event: &str, data: &Value, runs: &mut Runs) -> Value {
    match event {
        "messages/metadata" => {
            let (id, md) = data.as_object().unwrap().iter().next().unwrap();
            json!([event, {norm_str(id): meta_view(&md["metadata"])}])
        }
        "events" => {
            let mut d = data.as_object().unwrap().clone();
            let run = runs.label(&d["run_id"]);
            d.insert("run_id".into(), run);
            let parents: Vec<Value> = d["parent_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| runs.label(p))
                .collect();
            d.insert("parent_ids".into(), json!(parents));
            let md = meta_view(&d["metadata"]);
            d.insert("metadata".into(), md);
            let data = norm(&d["data"]);
            d.insert("data".into(), data);
            json!([event, Value::Object(d)])
        }
        _ => json!([norm_str(event), norm(data)]),
    }
}

fn reference(key: &str) -> Vec<Value> {
    let mut runs = Runs::default();
    fixture(key)
        .iter()
        .map(|e| view(e["event"].as_str().unwrap(), &e["data"], &mut runs))
        .collect()
}

fn ours(events: &[StreamEvent]) -> Vec<Value> {
    let mut runs = Runs::default();
    events
        .iter()
        .map(|e| view(&e.event_name(), &e.data, &mut runs))
        .collect()
}

fn assert_same(label: &str, got: &[Value], expected: &[Value]) {
    for (i, (g, e)) in got.iter().zip(expected.iter()).enumerate() {
        assert_eq!(g, e, "{label}: event {i} differs\nours: {g}\nref:  {e}");
    }
    assert_eq!(
        got.len(),
        expected.len(),
        "{label}: event count\nours: {got:#?}"
    );
}

fn input(graph: &str) -> RunInput {
    RunInput::Values(match graph {
        "chain" | "fail" => json!({"n": 0}),
        "fanout" => json!({"items": ["a", "b", "c"]}),
        "approval" => json!({"messages": [{"role": "user", "content": "go"}]}),
        "agent" => json!({"messages": [{"role": "user", "content": "add 2 and 3"}]}),
        _ => json!({"messages": [{"role": "user", "content": "hi"}]}),
    })
}

async fn run_graph(
    h: &Harness,
    g: &Arc<Graph>,
    input: RunInput,
    modes: &[StreamMode],
    subgraphs: bool,
) -> (RunOutcome, Vec<StreamEvent>) {
    let (out, events) = h
        .run(g, Some(THREAD), input, modes, |c| {
            c.stream_subgraphs = subgraphs;
            // As the server sets it: the root run of `events` takes the run's id.
            c.config = json!({"configurable": {"run_id": RUN_ID}});
        })
        .await;
    (out.unwrap_or_else(|e| panic!("run failed: {e}")), events)
}

async fn example_events(graph: &str, modes: &[StreamMode], subgraphs: bool) -> Vec<StreamEvent> {
    run_graph(
        &Harness::new(),
        &example(graph),
        input(graph),
        modes,
        subgraphs,
    )
    .await
    .1
}

/// The streamer twin: a chat model streaming "Hello big world" word by word, as LangChain's
/// GenericFakeChatModel does.
fn streamer() -> Arc<Graph> {
    Arc::new(
        spindle_graph::spec::load_str(
            "state: {messages: messages}\nmodels:\n  m: {provider: scripted, chunk: word, responses: [\"Hello big world\"]}\nnodes:\n  model: {kind: model, model: m}\nedges:\n  - {from: START, to: model}\n  - {from: model, to: END}\n",
            "streamer.yaml",
            "streamer",
            spindle_graph::spec::Format::Yaml,
        )
        .unwrap(),
    )
}

// ---- messages ----

const ACCUMULATED: [StreamMode; 1] = [StreamMode::AccumulatedMessages];

#[tokio::test]
async fn whole_messages_stream_as_metadata_then_complete() {
    for graph in ["echo", "agent", "nested", "approval"] {
        let got = ours(&example_events(graph, &ACCUMULATED, false).await);
        assert_same(graph, &got, &reference(&format!("messages/{graph}")));
    }
    // Subgraph messages come under the root name whether or not subgraphs are streamed.
    let got = ours(&example_events("nested", &ACCUMULATED, true).await);
    assert_same(
        "nested/subgraphs",
        &got,
        &reference("messages/nested/subgraphs"),
    );
}

#[tokio::test]
async fn token_chunks_stream_as_the_message_so_far() {
    let (_, events) = run_graph(
        &Harness::new(),
        &streamer(),
        input("streamer"),
        &ACCUMULATED,
        false,
    )
    .await;
    let got = ours(&events);
    assert_same("streamer", &got, &reference("messages/streamer"));
    assert_eq!(got.last().unwrap()[1][0]["content"], "Hello big world");
}

#[tokio::test]
async fn asked_for_both_message_forms_the_tuple_form_is_sent() {
    let modes = [StreamMode::AccumulatedMessages, StreamMode::Messages];
    let got = ours(&example_events("echo", &modes, false).await);
    let expected: Vec<Value> = reference("messages/echo/both")
        .into_iter()
        .map(|mut e| {
            // Tuple metadata: only the engine's keys.
            let md = meta_view(&e[1][1]);
            e[1][1] = md;
            e
        })
        .collect();
    let got: Vec<Value> = got
        .into_iter()
        .map(|mut e| {
            let md = meta_view(&e[1][1]);
            e[1][1] = md;
            e
        })
        .collect();
    assert_same("echo/both", &got, &expected);
}

#[tokio::test]
async fn without_stream_subgraphs_a_subgraphs_messages_come_from_its_node() {
    let got: Vec<Value> = ours(&example_events("nested", &[StreamMode::Messages], false).await)
        .into_iter()
        .map(|e| json!([e[0], e[1][0], meta_view(&e[1][1])]))
        .collect();
    let expected: Vec<Value> = reference("messages-tuple/nested")
        .into_iter()
        .map(|e| json!([e[0], e[1][0], meta_view(&e[1][1])]))
        .collect();
    assert_same("messages-tuple/nested", &got, &expected);
}

// ---- events ----

const EVENTS: [StreamMode; 1] = [StreamMode::Events];

#[tokio::test]
async fn graph_and_node_runs_match_the_reference() {
    for graph in ["echo", "chain", "approval"] {
        let events = example_events(graph, &EVENTS, false).await;
        assert_same(
            graph,
            &ours(&events),
            &reference(&format!("events/{graph}")),
        );
        // The graph's run is the server's run.
        assert_eq!(events[0].data["run_id"], RUN_ID);
    }
}

#[tokio::test]
async fn a_failed_node_has_no_end_and_neither_has_the_graph() {
    let (out, events) = Harness::new()
        .run(
            &example("fail"),
            Some(THREAD),
            input("fail"),
            &EVENTS,
            |_| {},
        )
        .await;
    assert!(out.is_err());
    assert_same("fail", &ours(&events), &reference("events/fail"));
}

#[tokio::test]
async fn subgraph_runs_hang_below_their_node() {
    // LangGraph names an unnamed compiled subgraph `LangGraph`; a graph file names it.
    let expected: Vec<Value> = reference("events/nested")
        .into_iter()
        .map(|mut e| {
            if e[1]["name"] == "LangGraph" {
                e[1]["name"] = json!("child");
            }
            e
        })
        .collect();
    for subgraphs in [false, true] {
        let got = ours(&example_events("nested", &EVENTS, subgraphs).await);
        assert_same("nested", &got, &expected);
    }
}

#[tokio::test]
async fn chat_model_runs_stream_their_tokens() {
    let (_, events) = run_graph(
        &Harness::new(),
        &streamer(),
        input("streamer"),
        &EVENTS,
        false,
    )
    .await;
    let model_named = |mut e: Value| {
        if e[1]["event"]
            .as_str()
            .is_some_and(|k| k.starts_with("on_chat_model"))
        {
            e[1]["name"] = json!("<model>");
        }
        e
    };
    let got: Vec<Value> = ours(&events).into_iter().map(model_named).collect();
    let expected: Vec<Value> = reference("events/streamer")
        .into_iter()
        .map(model_named)
        .collect();
    assert_same("streamer", &got, &expected);
    assert_eq!(events[2].data["name"], "ScriptedChatModel");
}

/// The agent against a twin with LangGraph's prebuilt `ToolNode` and `tools_condition`
/// (`toolnode` in `ref_extra`). That twin's first model call is a plain function, so chat
/// model runs are left out of this comparison (`chat_model_runs_stream_their_tokens`
/// covers them).
#[tokio::test]
async fn routers_and_tools_show_as_runs() {
    let not_model = |e: &Value| {
        !e[1]["event"]
            .as_str()
            .is_some_and(|k| k.starts_with("on_chat_model"))
    };
    let events = example_events("agent", &EVENTS, false).await;
    let mut got = ours(&events);
    got.retain(not_model);
    let mut expected = reference("events/toolnode");
    expected.retain(not_model);
    expected[0][1]["name"] = json!("agent");
    if let Some(end) = expected.last_mut() {
        end[1]["name"] = json!("agent");
    }
    // Labels were given with the model runs in; give them again without.
    assert_same("agent", &relabel(&got), &relabel(&expected));
    // The agent's model node does not stream tokens: its model runs start and end only.
    let kinds: Vec<&str> = events
        .iter()
        .filter_map(|e| e.data["event"].as_str())
        .filter(|k| k.starts_with("on_chat_model"))
        .collect();
    assert_eq!(
        kinds,
        [
            "on_chat_model_start",
            "on_chat_model_end",
            "on_chat_model_start",
            "on_chat_model_end"
        ]
    );
}

fn relabel(events: &[Value]) -> Vec<Value> {
    let mut runs = Runs::default();
    events
        .iter()
        .map(|e| {
            let mut e = e.clone();
            let run = runs.label(&e[1]["run_id"]);
            e[1]["run_id"] = run;
            let parents: Vec<Value> = e[1]["parent_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| runs.label(p))
                .collect();
            e[1]["parent_ids"] = json!(parents);
            e
        })
        .collect()
}

#[tokio::test]
async fn resumed_and_continued_runs_show_their_input() {
    let h = Harness::new();
    let g = example("approval");
    run_graph(&h, &g, input("approval"), &EVENTS, false).await;
    let resume = RunInput::Command {
        resume: Some(json!("yes")),
        update: None,
        goto: vec![],
    };
    let (_, events) = run_graph(&h, &g, resume, &EVENTS, false).await;
    assert_same(
        "resume",
        &ours(&events),
        &reference("events/approval/resume"),
    );

    let h = Harness::new();
    let g = example("chain");
    let (out, events) = h
        .run(&g, Some(THREAD), input("chain"), &EVENTS, |c| {
            c.interrupt_before = Some(spindle_graph::NodeSet::Some(vec!["b".into()]));
        })
        .await;
    assert_eq!(out.unwrap().next, ["b"]);
    assert_same(
        "before b",
        &ours(&events),
        &reference("events/chain/before_b"),
    );
    let (_, events) = run_graph(&h, &g, RunInput::Continue, &EVENTS, false).await;
    assert_same(
        "continue",
        &ours(&events),
        &reference("events/chain/continue"),
    );
}

#[tokio::test]
async fn events_interleave_with_other_modes() {
    let events = example_events("chain", &[StreamMode::Events, StreamMode::Values], false).await;
    assert_same(
        "chain+values",
        &ours(&events),
        &reference("events/chain/values"),
    );
}

#[tokio::test]
async fn parallel_tasks_start_and_end_as_runs() {
    // Tasks of one step run concurrently: compare each task's runs, not their interleaving.
    let by_run = |events: Vec<Value>| {
        let mut groups: Vec<(Value, Vec<Value>)> = Vec::new();
        for e in events {
            let run = e[1]["run_id"].clone();
            match groups.iter_mut().find(|(r, _)| *r == run) {
                Some((_, g)) => g.push(e),
                None => groups.push((run, vec![e])),
            }
        }
        let mut out: Vec<Value> = groups.into_iter().map(|(_, g)| json!(g)).collect();
        out.sort_by_key(|g| g.to_string());
        out
    };
    let got = by_run(ours(&example_events("fanout", &EVENTS, false).await));
    let expected = by_run(reference("events/fanout"));
    assert_same("fanout", &got, &expected);
}
