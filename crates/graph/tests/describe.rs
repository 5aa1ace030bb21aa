//! What the assistants endpoints show of a graph matches the reference server's payloads
//! for the Python twins (captured under `tests/fixtures/ref/`).

mod common;

use serde_json::Value;
use spindle_graph::XRay;

fn fixture(id: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/ref/{id}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
}

const IDS: [&str; 8] = [
    "echo", "chain", "approval", "agent", "fanout", "nested", "slow", "fail",
];

#[test]
fn drawable_graphs_match_the_reference() {
    for id in IDS {
        let g = common::example(id);
        let f = fixture(id);
        assert_eq!(g.drawable(XRay::Off), f["graph"], "{id} graph");
        assert_eq!(g.drawable(XRay::All), f["graph_xray"], "{id} graph xray");
    }
}

#[test]
fn state_schemas_have_the_reference_keys_and_types() {
    for id in IDS {
        let g = common::example(id);
        let ours = g.schemas().state_schema;
        let theirs = &fixture(id)["schemas"]["state_schema"];
        assert_eq!(ours["title"], theirs["title"], "{id}");
        let (o, t) = (
            ours["properties"].as_object().unwrap(),
            theirs["properties"].as_object().unwrap(),
        );
        assert_eq!(
            o.keys().collect::<Vec<_>>(),
            t.keys().collect::<Vec<_>>(),
            "{id}"
        );
        for (k, v) in t {
            assert_eq!(o[k]["type"], v["type"], "{id}.{k}");
            assert_eq!(o[k]["title"], v["title"], "{id}.{k}");
        }
    }
}

#[test]
fn message_channels_are_marked() {
    let s = common::example("echo").schemas().state_schema;
    assert_eq!(s["properties"]["messages"]["langgraph_type"], "messages");
}

#[test]
fn subgraphs_are_listed_by_namespace() {
    let subs = common::example("nested").subgraphs();
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0].0, "child");
    assert!(common::example("echo").subgraphs().is_empty());
}
