//! Agent protocol v2 (the thread event stream and its commands), as the `langchain-protocol`
//! package defines it field by field.
//!
//! Runs started through `run.start` or `input.respond` are "v2 runs": the worker passes their
//! engine events through a [`normalize::Normalizer`] before numbering and logging them, so
//! every protocol event the stateful parts of the protocol need (message and content-block
//! events, tool events, `input.requested`, lifecycle) is one logged event with its own seq.
//! The read side ([`envelope`]) then maps each logged event to at most one envelope, without
//! state, so an event's seq is its log seq: it is the same for every connection and survives
//! a restart. Plain runs of the thread are mapped by the same read side where a logged event
//! has a protocol form (values, updates, custom, tasks, checkpoints, run ends).

pub mod commands;
pub mod envelope;
pub mod normalize;
#[cfg(test)]
mod reference_tests;
pub mod socket;

use serde_json::Value;
use spindle_storage::Run;

/// `config.configurable` key that marks a run as started through the protocol (the key the
/// reference server uses for the same purpose).
pub const V2_CONFIG_KEY: &str = "__event_streaming_v2";

/// The stream modes a v2 run logs: enough to derive every protocol method.
pub const V2_STREAM_MODES: [&str; 7] = [
    "values",
    "updates",
    "messages-tuple",
    "custom",
    "tasks",
    "checkpoints",
    "tools",
];

/// The channels a subscription may name, besides `custom:NAME`.
pub const CHANNELS: [&str; 9] = [
    "values",
    "updates",
    "messages",
    "tools",
    "lifecycle",
    "input",
    "tasks",
    "checkpoints",
    "custom",
];

/// Whether a channel name is one the protocol knows.
pub fn is_channel(name: &str) -> bool {
    CHANNELS.contains(&name) || name.strip_prefix("custom:").is_some_and(|n| !n.is_empty())
}

/// Whether a stored run was started through the protocol.
pub fn is_v2_run(run: &Run) -> bool {
    run.kwargs
        .get("config")
        .and_then(|c| c.get("configurable"))
        .and_then(|c| c.get(V2_CONFIG_KEY))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Splits a logged event name (`method|ns1|ns2`) into its method and namespace.
pub fn split_name(name: &str) -> (&str, Vec<String>) {
    let mut parts = name.split('|');
    let method = parts.next().unwrap_or_default();
    (method, parts.map(str::to_owned).collect())
}

/// A logged event name from a method and a namespace.
pub fn join_name(method: &str, namespace: &[String]) -> String {
    let mut name = method.to_owned();
    for part in namespace {
        name.push('|');
        name.push_str(part);
    }
    name
}

/// Whether a logged event is a lifecycle event of the protocol (of the root or a subgraph).
pub fn is_lifecycle(name: &str) -> bool {
    name.split('|').next() == Some("lifecycle")
}
