//! A graph file with a mistake is refused with a message its author can act on.

use spindle_graph::spec::{load_file, load_str, Format};

fn yaml_err(src: &str) -> String {
    load_str(src, "g.yaml", "g", Format::Yaml)
        .unwrap_err()
        .to_string()
}

#[test]
fn unknown_node_kind_names_file_line_and_place() {
    let e = yaml_err("state:\n  messages: messages\nnodes:\n  respond:\n    kind: modle\nedges:\n  - {from: __start__, to: respond}\n");
    assert_eq!(e, "g.yaml:5: at `nodes.respond.kind`: unknown node kind `modle`; expected script, model, tools, interrupt, subgraph or agent");
}

#[test]
fn edge_to_unknown_node_suggests_the_right_one() {
    let e = yaml_err("nodes:\n  respond: {kind: script, code: \"()\"}\nedges:\n  - {from: __start__, to: respond}\n  - {from: respond, to: respnd}\n");
    assert!(
        e.starts_with("g.yaml:5: at `edges[1].to`: unknown node `respnd`"),
        "{e}"
    );
}

#[test]
fn script_syntax_errors_point_into_the_script() {
    let e = yaml_err("nodes:\n  a:\n    kind: script\n    code: |\n      let x = 1;\n      #{ n: x +  }\nedges:\n  - {from: __start__, to: a}\n");
    assert!(
        e.starts_with("g.yaml:6: at `nodes.a.code`: script does not compile"),
        "{e}"
    );
}

#[test]
fn missing_entry_point_is_reported() {
    let e =
        yaml_err("nodes:\n  a: {kind: script, code: \"()\"}\nedges:\n  - {from: a, to: __end__}\n");
    assert!(e.contains("no entry point"), "{e}");
}

#[test]
fn bad_default_type_is_reported() {
    let e = yaml_err("state:\n  n: {type: integer, default: \"zero\"}\nnodes:\n  a: {kind: script, code: \"()\"}\nedges:\n  - {from: __start__, to: a}\n");
    assert!(e.starts_with("g.yaml:2: at `state.n.default`"), "{e}");
}

#[test]
fn unknown_tool_and_model_are_reported() {
    let e = yaml_err("state: {messages: messages}\nnodes:\n  m: {kind: model, model: nope}\nedges:\n  - {from: __start__, to: m}\n");
    assert!(
        e.contains("at `nodes.m.model`: unknown model `nope`"),
        "{e}"
    );
    let e = yaml_err("state: {messages: messages}\nnodes:\n  t: {kind: tools, tools: [nope]}\nedges:\n  - {from: __start__, to: t}\n");
    assert!(e.contains("unknown tool `nope`"), "{e}");
}

#[test]
fn yaml_syntax_errors_have_a_line() {
    let e = yaml_err("nodes:\n  a: {kind: script\n");
    assert!(e.starts_with("g.yaml:"), "{e}");
    assert!(e.contains("invalid YAML"), "{e}");
}

#[test]
fn json_files_load_and_report_places() {
    let dir = std::env::temp_dir().join(format!("spindle-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("j.json");
    std::fs::write(&good, r##"{"state": {"n": "integer"}, "nodes": {"a": {"kind": "script", "code": "#{n: 1}"}}, "edges": [{"from": "START", "to": "a"}]}"##).unwrap();
    let g = load_file(&good).unwrap();
    assert_eq!(g.name(), "j");
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        "{\n  \"nodes\": {\n    \"a\": {\n      \"kind\": 3\n    }\n  }\n}",
    )
    .unwrap();
    let e = load_file(&bad).unwrap_err();
    assert_eq!(e.place, "nodes.a.kind");
    assert_eq!(e.line, Some(4));
    assert!(e.file.ends_with("bad.json"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn empty_edge_lists_are_refused() {
    let e = yaml_err("nodes:\n  a: {kind: script, code: \"()\"}\nedges:\n  - {from: [], to: a}\n");
    assert!(
        e.contains("at `edges[0].from`: an edge needs at least one source"),
        "{e}"
    );
    let e =
        yaml_err("nodes:\n  a: {kind: script, code: \"()\"}\nedges:\n  - {from: START, to: []}\n");
    assert!(
        e.contains("at `edges[0].to`: an edge needs at least one target"),
        "{e}"
    );
}
