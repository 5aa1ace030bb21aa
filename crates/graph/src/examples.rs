//! The example graphs shipped in the binary (sources in `examples/graphs/`).

use crate::graph::Graph;
use crate::spec::{load_str, Format, SpecError};

/// `(graph id, YAML source)` of every example graph.
pub const SOURCES: &[(&str, &str)] = &[
    ("echo", include_str!("../../../examples/graphs/echo.yaml")),
    ("chain", include_str!("../../../examples/graphs/chain.yaml")),
    (
        "approval",
        include_str!("../../../examples/graphs/approval.yaml"),
    ),
    ("agent", include_str!("../../../examples/graphs/agent.yaml")),
    (
        "fanout",
        include_str!("../../../examples/graphs/fanout.yaml"),
    ),
    (
        "nested",
        include_str!("../../../examples/graphs/nested.yaml"),
    ),
    ("slow", include_str!("../../../examples/graphs/slow.yaml")),
    ("fail", include_str!("../../../examples/graphs/fail.yaml")),
    ("chat", include_str!("../../../examples/graphs/chat.yaml")),
];

/// Compile one example graph by id.
pub fn get(id: &str) -> Option<Result<Graph, SpecError>> {
    SOURCES
        .iter()
        .find(|(name, _)| *name == id)
        .map(|(name, src)| {
            load_str(
                src,
                &format!("examples/graphs/{name}.yaml"),
                name,
                Format::Yaml,
            )
        })
}

/// Every example graph, compiled. The sources are checked by this crate's tests, so a
/// failure here cannot come from a user; such a graph is skipped rather than crashing.
pub fn all() -> Vec<(&'static str, Graph)> {
    SOURCES
        .iter()
        .filter_map(|(name, src)| {
            load_str(
                src,
                &format!("examples/graphs/{name}.yaml"),
                name,
                Format::Yaml,
            )
            .ok()
            .map(|g| (*name, g))
        })
        .collect()
}
