//! Runs as clients follow them: the SSE bodies of run and thread streams, and what a waited-on
//! run answers. Executing runs is `spindle_execution`'s.

pub mod stream;

use serde_json::{Map, Value};
use spindle_storage::JsonObject;

/// What `wait` and `join` answer for an ended run: the thread's values, with `__interrupt__`
/// when it stopped at an interrupt and `__error__` when it failed.
pub(crate) fn final_values(
    thread_values: Option<&Value>,
    thread_interrupts: &JsonObject,
    error: Option<&Value>,
) -> Value {
    let mut values = match thread_values {
        Some(Value::Object(map)) => map.clone(),
        _ => Map::new(),
    };
    let interrupts: Vec<Value> = thread_interrupts
        .values()
        .filter_map(Value::as_array)
        .flatten()
        .cloned()
        .collect();
    if !interrupts.is_empty() {
        values.insert("__interrupt__".into(), Value::Array(interrupts));
    }
    if let Some(error) = error {
        values.insert("__error__".into(), error.clone());
    }
    Value::Object(values)
}
