//! Graph files importing graph files (`graphs: {name: ./file.yaml}`).

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{texts, Harness};
use serde_json::json;
use spindle_graph::spec::{load_file, load_file_with_imports};
use spindle_graph::RunInput;

/// A fresh folder holding `files` (name, text).
fn folder(test: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spindle-imports-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("shared")).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir
}

const CHILD: &str = r#"
state: {messages: messages}
nodes:
  c1: { kind: script, code: '#{ messages: [ai("c1")] }' }
edges:
  - { from: __start__, to: c1 }
  - { from: c1, to: __end__ }
"#;

#[tokio::test]
async fn a_subgraph_written_once_is_used_from_another_file() {
    let dir = folder(
        "use",
        &[
            ("shared/child.yaml", CHILD),
            (
                "parent.yaml",
                r#"
state: {messages: messages}
graphs:
  child: ./shared/child.yaml
nodes:
  prep: { kind: script, code: '#{ messages: [ai("prep")] }' }
  child: { kind: subgraph, graph: child }
edges:
  - { from: __start__, to: prep }
  - { from: prep, to: child }
  - { from: child, to: __end__ }
"#,
            ),
        ],
    );
    let g = Arc::new(load_file(&dir.join("parent.yaml")).unwrap_or_else(|e| panic!("{e}")));
    let (out, _) = Harness::new()
        .run(
            &g,
            None,
            RunInput::Values(json!({"messages": []})),
            &[],
            |_| {},
        )
        .await;
    assert_eq!(texts(&out.unwrap().values), ["prep", "c1"]);
}

#[test]
fn a_cycle_of_imports_is_refused() {
    let dir = folder(
        "cycle",
        &[
            ("a.yaml", "graphs: {b: ./b.yaml}\nnodes: {x: {kind: script, code: '#{}'}}\nedges: [{from: __start__, to: x}]\n"),
            ("b.yaml", "graphs: {a: ./a.yaml}\nnodes: {y: {kind: script, code: '#{}'}}\nedges: [{from: __start__, to: y}]\n"),
        ],
    );
    let err = load_file(&dir.join("a.yaml")).unwrap_err();
    assert!(err.file.ends_with("b.yaml"), "{err}");
    assert_eq!(err.place, "graphs.a");
    assert!(err.message.contains("imports itself"), "{err}");
}

#[test]
fn a_missing_or_broken_import_is_named_where_it_is() {
    let dir = folder(
        "broken",
        &[
            ("shared/bad.yaml", "nodes:\n  x: {kind: scrip}\nedges: []\n"),
            ("missing.yaml", "graphs:\n  c: ./nowhere.yaml\nnodes: {x: {kind: script, code: '#{}'}}\nedges: [{from: __start__, to: x}]\n"),
            ("uses_bad.yaml", "graphs:\n  c: ./shared/bad.yaml\nnodes: {x: {kind: script, code: '#{}'}}\nedges: [{from: __start__, to: x}]\n"),
        ],
    );
    let err = load_file(&dir.join("missing.yaml")).unwrap_err();
    assert_eq!(
        (err.place.as_str(), err.line),
        ("graphs.c", Some(2)),
        "{err}"
    );
    assert!(err.message.contains("nowhere.yaml"), "{err}");

    let err = load_file(&dir.join("uses_bad.yaml")).unwrap_err();
    assert!(err.file.ends_with("shared/bad.yaml"), "{err}");
    assert_eq!(err.line, Some(2), "{err}");
}

/// `load_file_with_imports` tells the files a graph was compiled from: the file, its imports
/// (`graphs:` and `variants:`) and theirs, each once (what `spindle dev` watches).
#[test]
fn the_files_a_graph_was_compiled_from_are_told() {
    let dir = folder(
        "files",
        &[
            ("shared/child.yaml", CHILD),
            (
                "shared/mid.yaml",
                "state: {messages: messages}\ngraphs: {c: ./child.yaml}\nnodes: {m: {kind: subgraph, graph: c}}\nedges: [{from: __start__, to: m}]\n",
            ),
            (
                "variants.yaml",
                "variants: {by: mode, default: a, graphs: {a: ./shared/mid.yaml, b: ./shared/child.yaml}}\n",
            ),
            (
                "top.yaml",
                "state: {messages: messages}\ngraphs: {v: ./variants.yaml, c: ./shared/child.yaml}\nnodes: {x: {kind: subgraph, graph: v}}\nedges: [{from: __start__, to: x}]\n",
            ),
            (
                "broken.yaml",
                "graphs: {c: ./shared/child.yaml, n: ./nowhere.yaml}\nnodes: {x: {kind: script, code: '#{}'}}\nedges: [{from: __start__, to: x}]\n",
            ),
        ],
    );
    let dir = std::fs::canonicalize(dir).unwrap();
    let loaded = load_file_with_imports(&dir.join("top.yaml"));
    loaded.graph.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        loaded.files,
        [
            dir.join("top.yaml"),
            dir.join("variants.yaml"),
            dir.join("shared/mid.yaml"),
            dir.join("shared/child.yaml"),
        ]
    );

    // Loading fails: the files read until then.
    let loaded = load_file_with_imports(&dir.join("broken.yaml"));
    assert!(loaded.graph.is_err());
    assert_eq!(
        loaded.files,
        [dir.join("broken.yaml"), dir.join("shared/child.yaml")]
    );

    // A file that cannot be read has none; a second load starts afresh.
    let loaded = load_file_with_imports(&dir.join("missing.yaml"));
    assert!(loaded.graph.is_err() && loaded.files.is_empty());
    let loaded = load_file_with_imports(&dir.join("shared/child.yaml"));
    assert_eq!(loaded.files, [dir.join("shared/child.yaml")]);
}
