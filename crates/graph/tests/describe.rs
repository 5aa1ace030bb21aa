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

/// `deep`: `mid` runs a subgraph that runs `grand`; `side` runs `grand` directly. The
/// reference's twin (`deep_graph.py` beside the capture scripts) answers
/// `/subgraphs?recurse=false` with `mid, side`, `recurse=true` with `mid, mid|grand, side`,
/// and `/subgraphs/{ns}` with that namespace only (a nested one with `recurse` only).
fn deep() -> std::sync::Arc<spindle_graph::Graph> {
    let yaml = r#"
state: {messages: messages}
graphs:
  grand:
    state: {messages: messages}
    nodes: {g1: {kind: script, code: '#{ messages: [ai("g1")] }'}}
    edges: [{from: __start__, to: g1}, {from: g1, to: __end__}]
  mid:
    state: {messages: messages}
    nodes:
      m1: {kind: script, code: '#{ messages: [ai("m1")] }'}
      grand: {kind: subgraph, graph: grand}
    edges: [{from: __start__, to: m1}, {from: m1, to: grand}, {from: grand, to: __end__}]
nodes:
  prep: {kind: script, code: '#{ messages: [ai("prep")] }'}
  mid: {kind: subgraph, graph: mid}
  side: {kind: subgraph, graph: grand}
edges:
  - {from: __start__, to: prep}
  - {from: prep, to: mid}
  - {from: mid, to: side}
  - {from: side, to: __end__}
"#;
    std::sync::Arc::new(
        spindle_graph::spec::load_str(yaml, "deep.yaml", "deep", spindle_graph::spec::Format::Yaml)
            .expect("compiles"),
    )
}

fn namespaces(list: Vec<(String, std::sync::Arc<spindle_graph::Graph>)>) -> Vec<String> {
    list.into_iter().map(|(ns, _)| ns).collect()
}

#[test]
fn subgraphs_without_recurse_are_the_immediate_ones() {
    let g = deep();
    assert_eq!(namespaces(g.subgraphs()), ["mid", "side"]);
    assert_eq!(namespaces(g.subgraphs_at(None, false)), ["mid", "side"]);
    assert_eq!(
        namespaces(g.subgraphs_at(None, true)),
        ["mid", "mid|grand", "side"]
    );
}

#[test]
fn a_subgraph_namespace_names_that_subgraph_only() {
    let g = deep();
    assert_eq!(namespaces(g.subgraphs_at(Some("mid"), false)), ["mid"]);
    assert_eq!(namespaces(g.subgraphs_at(Some("mid"), true)), ["mid"]);
    assert!(g.subgraphs_at(Some("mid|grand"), false).is_empty());
    assert_eq!(
        namespaces(g.subgraphs_at(Some("mid|grand"), true)),
        ["mid|grand"]
    );
    assert!(g.subgraphs_at(Some("grand"), true).is_empty());
    assert!(g.subgraphs_at(Some("mi"), true).is_empty());
}
