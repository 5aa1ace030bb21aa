//! Runs as clients follow them: the SSE bodies of run and thread streams, and what a waited-on
//! run answers. Executing runs is `spindle_execution`'s.

pub mod stream;

use serde_json::{Map, Value};
use spindle_storage::JsonObject;

/// What `wait` and `join` answer for an ended run: the thread's values, with `__interrupt__`
/// when it stopped at an interrupt; only `{"__error__": ...}` when it failed, as the reference
/// answers (the values of the last saved step are not the run's output).
pub(crate) fn final_values(
    thread_values: Option<&Value>,
    thread_interrupts: &JsonObject,
    error: Option<&Value>,
) -> Value {
    if let Some(error) = error {
        let mut failed = Map::new();
        failed.insert("__error__".into(), error.clone());
        return Value::Object(failed);
    }
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
    Value::Object(values)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_failed_run_answers_its_error_alone() {
        let values = json!({"n": 1});
        let error = json!({"error": "ValueError", "message": "boom"});
        assert_eq!(
            final_values(Some(&values), &JsonObject::new(), Some(&error)),
            json!({"__error__": error})
        );
        let mut interrupts = JsonObject::new();
        interrupts.insert("t".into(), json!([{"id": "i", "value": 1}]));
        assert_eq!(
            final_values(Some(&values), &interrupts, None),
            json!({"n": 1, "__interrupt__": [{"id": "i", "value": 1}]})
        );
    }
}
