//! What a run logs for agent protocol v2 (the thread event stream): the names of its events
//! and, for runs started through the protocol, the normalizer that turns the engine's events
//! into the protocol's. The read side (envelopes, commands) is the HTTP server's.

pub mod normalize;

use serde_json::{json, Value};
use spindle_storage::Run;

/// `config.configurable` key that marks a run as started through the protocol (the key the
/// reference server uses for the same purpose).
pub const V2_CONFIG_KEY: &str = "__event_streaming_v2";

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

/// `input.requested` data: the protocol's `payload`, and the same value as `value`, which
/// the Python client reads (`InterruptPayload.value`).
pub fn input_requested(interrupt_id: &Value, value: Option<&Value>) -> Value {
    let value = value.cloned().unwrap_or(Value::Null);
    json!({"interrupt_id": interrupt_id, "payload": value, "value": value})
}
