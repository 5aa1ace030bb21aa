//! Channels, reducers and message coercion, with property tests where laws exist.

mod common;

use std::collections::HashSet;

use proptest::prelude::*;
use serde_json::{json, Value};
use spindle_graph::channels::{apply_writes, ChannelKind, ChannelSpec};
use spindle_graph::checkpoint::blob::materialize;
use spindle_graph::checkpoint::{BlobValue, ChannelBlob, Checkpointer};
use spindle_graph::messages::{add_messages, coerce_message};

fn apply(
    kind: ChannelKind,
    current: Option<Value>,
    writes: &[Value],
) -> Result<Option<Value>, String> {
    let spec = ChannelSpec::new("k", kind);
    let mut cur = current;
    apply_writes(&spec, &mut cur, writes).map_err(|e| e.message)?;
    Ok(cur)
}

#[test]
fn last_value_takes_one_write_per_step() {
    assert_eq!(
        apply(ChannelKind::LastValue, Some(json!(1)), &[json!(2)]).unwrap(),
        Some(json!(2))
    );
    let e = apply(ChannelKind::LastValue, None, &[json!(1), json!(2)]).unwrap_err();
    assert_eq!(e, "At key 'k': Can receive only one value per step. Use an Annotated key to handle multiple values.");
}

#[test]
fn append_takes_items_and_lists() {
    let v = apply(
        ChannelKind::Append,
        Some(json!([1])),
        &[json!(2), json!([3, 4])],
    )
    .unwrap();
    assert_eq!(v, Some(json!([1, 2, 3, 4])));
}

#[test]
fn add_sums_numbers_and_refuses_others() {
    assert_eq!(
        apply(ChannelKind::Add, Some(json!(1)), &[json!(2), json!(3)]).unwrap(),
        Some(json!(6))
    );
    assert_eq!(
        apply(ChannelKind::Add, Some(json!(1)), &[json!(0.5)]).unwrap(),
        Some(json!(1.5))
    );
    assert!(apply(ChannelKind::Add, Some(json!(1)), &[json!("x")]).is_err());
}

#[test]
fn topic_collects_a_step_and_accumulates_on_request() {
    assert_eq!(
        apply(
            ChannelKind::Topic { accumulate: false },
            Some(json!([0])),
            &[json!(1), json!(2)]
        )
        .unwrap(),
        Some(json!([1, 2]))
    );
    assert_eq!(
        apply(
            ChannelKind::Topic { accumulate: true },
            Some(json!([0])),
            &[json!(1)]
        )
        .unwrap(),
        Some(json!([0, 1]))
    );
}

#[tokio::test]
async fn ephemeral_values_last_one_step() {
    use spindle_graph::builder::{node_fn, GraphBuilder};
    use spindle_graph::node::Command;
    use spindle_graph::{RunInput, START};
    let g = std::sync::Arc::new(
        GraphBuilder::new("e")
            .channel(ChannelSpec::new("flash", ChannelKind::Ephemeral))
            .channel(ChannelSpec::new("seen", ChannelKind::Append))
            .node(
                "a",
                node_fn(|_| Ok(Command::update(json!({"flash": "hi"})))),
            )
            .node(
                "b",
                node_fn(|s| {
                    Ok(Command::update(
                        json!({"seen": [s.get("flash").cloned().unwrap_or(Value::Null)]}),
                    ))
                }),
            )
            .node(
                "c",
                node_fn(|s| {
                    Ok(Command::update(
                        json!({"seen": [s.get("flash").cloned().unwrap_or(Value::Null)]}),
                    ))
                }),
            )
            .edge(START, "a")
            .edge("a", "b")
            .edge("b", "c")
            .compile()
            .unwrap(),
    );
    let (out, _) = common::Harness::new()
        .run(&g, Some("t"), RunInput::Values(json!({})), &[], |_| {})
        .await;
    assert_eq!(out.unwrap().values["seen"], json!(["hi", null]));
}

#[test]
fn loose_messages_are_coerced_to_langchain_dicts() {
    let m = coerce_message(&json!({"role": "user", "content": "hi"})).unwrap();
    assert_eq!(
        m,
        json!({"content": "hi", "additional_kwargs": {}, "response_metadata": {}, "type": "human", "name": null, "id": null})
    );
    let m = coerce_message(&json!("hello")).unwrap();
    assert_eq!(m["type"], "human");
    let m = coerce_message(&json!(["assistant", "yo"])).unwrap();
    assert_eq!(m["type"], "ai");
    assert_eq!(m["tool_calls"], json!([]));
    let m = coerce_message(&json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1}"}}]})).unwrap();
    assert_eq!(
        m["tool_calls"],
        json!([{"name": "add", "args": {"a": 1}, "id": "c1", "type": "tool_call"}])
    );
    let m = coerce_message(&json!({"role": "tool", "content": "5", "tool_call_id": "c1"})).unwrap();
    assert_eq!(m["status"], "success");
    assert!(coerce_message(&json!({"role": "wizard", "content": "x"})).is_err());
    assert!(coerce_message(&json!(42)).is_err());
}

#[test]
fn add_messages_replaces_by_id_and_removes() {
    let mut left = vec![];
    add_messages(&mut left, &json!([{"role": "user", "content": "a", "id": "1"}, {"role": "user", "content": "b", "id": "2"}])).unwrap();
    add_messages(
        &mut left,
        &json!({"role": "user", "content": "B", "id": "2"}),
    )
    .unwrap();
    assert_eq!(
        left.iter()
            .map(|m| m["content"].clone())
            .collect::<Vec<_>>(),
        [json!("a"), json!("B")]
    );
    add_messages(&mut left, &json!({"type": "remove", "id": "1"})).unwrap();
    assert_eq!(left.len(), 1);
    assert!(add_messages(&mut left, &json!({"type": "remove", "id": "nope"})).is_err());
    add_messages(
        &mut left,
        &json!([{"type": "remove", "id": "__remove_all__"}, {"role": "user", "content": "fresh"}]),
    )
    .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["content"], "fresh");
    assert!(left[0]["id"].is_string(), "missing ids are assigned");
}

fn msg_strategy() -> impl Strategy<Value = Value> {
    (0u8..6, "[a-z]{0,6}", any::<bool>()).prop_map(|(id, text, has_id)| {
        if has_id {
            json!({"role": "user", "content": text, "id": format!("m{id}")})
        } else {
            json!({"role": "assistant", "content": text})
        }
    })
}

proptest! {
    #[test]
    fn add_messages_laws(left in prop::collection::vec(msg_strategy(), 0..8), right in prop::collection::vec(msg_strategy(), 0..8)) {
        let mut merged = Vec::new();
        add_messages(&mut merged, &Value::Array(left)).unwrap();
        let before = merged.clone();
        add_messages(&mut merged, &Value::Array(right.clone())).unwrap();
        // Ids are unique and every message has one.
        let ids: Vec<&str> = merged.iter().map(|m| m["id"].as_str().unwrap()).collect();
        prop_assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
        // The last write of each id wins.
        for r in right.iter().filter(|r| r.get("id").is_some()) {
            let last = right.iter().rev().find(|x| x.get("id") == r.get("id")).unwrap();
            let got = merged.iter().find(|m| m["id"] == r["id"]).unwrap();
            prop_assert_eq!(&got["content"], &last["content"]);
        }
        // Earlier messages keep their relative order.
        let kept: Vec<&Value> = merged.iter().filter(|m| before.iter().any(|b| b["id"] == m["id"])).map(|m| &m["id"]).collect();
        let orig: Vec<&Value> = before.iter().map(|m| &m["id"]).collect();
        prop_assert_eq!(kept, orig);
        // Merging the result again changes nothing.
        let again_in = Value::Array(merged.clone());
        let mut again = merged.clone();
        add_messages(&mut again, &again_in).unwrap();
        prop_assert_eq!(again, merged);
    }

    #[test]
    fn stored_deltas_rebuild_the_live_value(steps in prop::collection::vec(prop::collection::vec(msg_strategy(), 1..4), 1..150)) {
        // Write through the engine's blob model into the in-memory saver, then load.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let spec = ChannelSpec::new("messages", ChannelKind::Messages);
            let saver = spindle_graph::checkpoint::InMemoryCheckpointer::new();
            let mut live: Option<Value> = Some(json!([]));
            let mut blobs: Vec<ChannelBlob> = Vec::new();
            let mut depth = 0;
            for (i, w) in steps.iter().enumerate() {
                let version = i as u64 + 1;
                let change = apply_writes(&spec, &mut live, &[Value::Array(w.clone())]).unwrap().unwrap();
                let value = match change {
                    spindle_graph::channels::Change::Merged(d) if version > 1 && depth + 1 < spindle_graph::checkpoint::blob::FULL_EVERY && !d.cleared => {
                        depth += 1;
                        BlobValue::Upsert { base: version - 1, depth, items: d.upserted, removed: d.removed }
                    }
                    _ => { depth = 0; BlobValue::Full { value: live.clone().unwrap() } }
                };
                blobs.push(ChannelBlob { channel: "messages".into(), version, value });
            }
            let last = blobs.len() as u64;
            let rebuilt = materialize("messages", last, |v| blobs.get(v as usize - 1).map(|b| b.value.clone())).unwrap();
            assert_eq!(rebuilt, live);
            let _ = saver.list("x", None, &Default::default()).await.unwrap();
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn stopping_anywhere_and_resuming_equals_running_through(stops in prop::collection::vec(any::<bool>(), 4)) {
        use spindle_graph::{NodeSet, RunInput};
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        rt.block_on(async {
            let g = common::example("agent");
            let input = json!({"messages": [{"role": "user", "content": "add 2 and 3", "id": "h1"}]});
            let h = common::Harness::new();
            let (straight, _) = h.run(&g, Some("straight"), RunInput::Values(input.clone()), &[], |_| {}).await;
            let straight = straight.unwrap().values;
            // Stop after the nodes chosen by `stops` (model, tools) and continue until done.
            let names = ["model", "tools"];
            let chosen: Vec<String> = names.iter().zip(stops.iter()).filter(|(_, s)| **s).map(|(n, _)| n.to_string()).collect();
            let mut run_input = RunInput::Values(input);
            let mut rounds = 0;
            let finished = loop {
                let (out, _) = h.run(&g, Some("stepped"), run_input, &[], |c| c.interrupt_after = Some(NodeSet::Some(chosen.clone()))).await;
                let out = out.unwrap();
                rounds += 1;
                if out.next.is_empty() || rounds > 10 { break out.values; }
                run_input = RunInput::Continue;
            };
            let strip = |v: &Value| -> Vec<(Value, Value)> {
                v["messages"].as_array().unwrap().iter().map(|m| (m["type"].clone(), m["content"].clone())).collect()
            };
            assert_eq!(strip(&finished), strip(&straight));
        });
    }
}
