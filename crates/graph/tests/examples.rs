//! The example graphs behave as documented in `ref_graphs.py`.

mod common;

use common::{example, texts, Harness};
use serde_json::json;
use spindle_graph::{RunInput, StreamMode};

#[tokio::test]
async fn every_example_compiles() {
    let all = spindle_graph::examples::all();
    assert_eq!(all.len(), spindle_graph::examples::SOURCES.len());
}

#[tokio::test]
async fn echo_echoes_the_last_message() {
    let h = Harness::new();
    let (out, _) = h
        .run(
            &example("echo"),
            Some("t"),
            RunInput::Values(json!({"messages": [{"role": "user", "content": "hi"}]})),
            &[],
            |_| {},
        )
        .await;
    let out = out.unwrap();
    assert_eq!(texts(&out.values), ["hi", "echo: hi"]);
    assert_eq!(out.values["messages"][0]["type"], "human");
    assert_eq!(out.values["messages"][1]["type"], "ai");
}

#[tokio::test]
async fn chain_adds_three() {
    let h = Harness::new();
    let (out, _) = h
        .run(
            &example("chain"),
            Some("t"),
            RunInput::Values(json!({"n": 0})),
            &[],
            |_| {},
        )
        .await;
    assert_eq!(out.unwrap().values, json!({"n": 3}));
}

#[tokio::test]
async fn approval_interrupts_and_resumes() {
    let h = Harness::new();
    let g = example("approval");
    let (out, _) = h
        .run(
            &g,
            Some("t"),
            RunInput::Values(json!({"messages": [{"role": "user", "content": "go"}]})),
            &[],
            |_| {},
        )
        .await;
    let out = out.unwrap();
    assert_eq!(out.interrupts.len(), 1);
    assert_eq!(out.interrupts[0].value, json!({"question": "approve?"}));
    assert_eq!(out.next, ["ask"]);
    let (out, _) = h
        .run(
            &g,
            Some("t"),
            RunInput::Command {
                resume: Some(json!("yes")),
                update: None,
                goto: vec![],
            },
            &[],
            |_| {},
        )
        .await;
    let out = out.unwrap();
    assert!(out.interrupts.is_empty());
    assert_eq!(texts(&out.values), ["go", "decision: yes"]);
}

#[tokio::test]
async fn agent_calls_the_tool_then_answers() {
    let h = Harness::new();
    let (out, _) = h
        .run(
            &example("agent"),
            Some("t"),
            RunInput::Values(json!({"messages": [{"role": "user", "content": "add 2 and 3"}]})),
            &[],
            |_| {},
        )
        .await;
    let v = out.unwrap().values;
    assert_eq!(texts(&v), ["add 2 and 3", "", "5", "The sum is 5."]);
    assert_eq!(v["messages"][1]["tool_calls"][0]["id"], "call_add_1");
    assert_eq!(
        v["messages"][1]["tool_calls"][0]["args"],
        json!({"a": 2, "b": 3})
    );
    assert_eq!(v["messages"][2]["type"], "tool");
    assert_eq!(v["messages"][2]["tool_call_id"], "call_add_1");
    assert_eq!(v["messages"][2]["name"], "add");
}

#[tokio::test]
async fn fanout_keeps_item_order() {
    let h = Harness::new();
    let (out, _) = h
        .run(
            &example("fanout"),
            Some("t"),
            RunInput::Values(json!({"items": ["a", "b", "c"]})),
            &[],
            |_| {},
        )
        .await;
    assert_eq!(
        out.unwrap().values,
        json!({"items": ["a", "b", "c"], "results": ["A", "B", "C"]})
    );
}

#[tokio::test]
async fn nested_runs_the_subgraph() {
    let h = Harness::new();
    let (out, events) = h
        .run(
            &example("nested"),
            Some("t"),
            RunInput::Values(json!({"messages": [{"role": "user", "content": "hi"}]})),
            &[StreamMode::Updates],
            |c| c.stream_subgraphs = true,
        )
        .await;
    assert_eq!(texts(&out.unwrap().values), ["hi", "prep", "c1", "c2"]);
    assert!(events
        .iter()
        .any(|e| e.namespace.len() == 1 && e.namespace[0].starts_with("child:")));
}

#[tokio::test]
async fn slow_ticks_and_emits_custom_events() {
    let h = Harness::new();
    let (out, events) = h
        .run(
            &example("slow"),
            Some("t"),
            RunInput::Values(json!({"delay_ms": 5, "ticks": 0})),
            &[StreamMode::Custom],
            |_| {},
        )
        .await;
    assert_eq!(out.unwrap().values, json!({"delay_ms": 5, "ticks": 2}));
    let custom: Vec<_> = events.iter().map(|e| e.data.clone()).collect();
    assert_eq!(custom, [json!({"tick": "a"}), json!({"tick": "b"})]);
}

#[tokio::test]
async fn fail_raises_value_error_boom() {
    let h = Harness::new();
    let (out, _) = h
        .run(
            &example("fail"),
            Some("t"),
            RunInput::Values(json!({"n": 0})),
            &[],
            |_| {},
        )
        .await;
    let err = out.unwrap_err();
    assert_eq!(err.class(), "ValueError");
    assert_eq!(err.message(), "boom");
    assert_eq!(
        err.location(),
        Some("graph 'fail', node 'boom': line 6, column 32 of examples/graphs/fail.yaml")
    );
}
