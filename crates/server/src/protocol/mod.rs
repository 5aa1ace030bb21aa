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
#[cfg(test)]
mod reference_tests;
pub mod socket;

pub use spindle_execution::v2_events::{
    input_requested, is_lifecycle, is_v2_run, join_name, normalize, split_name, V2_CONFIG_KEY,
};

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
