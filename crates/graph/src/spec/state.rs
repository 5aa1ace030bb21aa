//! State keys: reducer and type shorthands, defaults checked against their types.

use std::sync::Arc;

use serde_json::{json, Value};

use super::read::{check_keys, kind_of, required, script, string, Ctx};
use super::SpecError;
use crate::channels::{ChannelKind, ChannelSpec, CustomReducer};
use crate::script::{Script, ScriptResources};

#[derive(Debug)]
struct ScriptReducer(Arc<Script>);

impl CustomReducer for ScriptReducer {
    fn reduce(&self, current: Value, update: Value) -> Result<Value, String> {
        self.0
            .eval_pure(&[("current", current), ("update", update)])
    }
}

fn type_schema(t: &str) -> Option<Value> {
    Some(match t {
        "string" | "integer" | "number" | "boolean" | "object" | "array" | "null" => {
            json!({"type": t})
        }
        "any" => json!({}),
        _ => return None,
    })
}

fn default_fits(schema: &Value, v: &Value) -> bool {
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        _ => true,
    }
}

pub(super) fn compile_channel(
    cx: &Ctx,
    key: &str,
    spec: &Value,
    place: &str,
    resources: &ScriptResources,
) -> Result<ChannelSpec, SpecError> {
    let reducers = "last_value, messages, append, add, ephemeral, topic, script";
    let by_reducer = |r: &str| -> Option<ChannelKind> {
        Some(match r {
            "last_value" => ChannelKind::LastValue,
            "messages" | "add_messages" => ChannelKind::Messages,
            "append" => ChannelKind::Append,
            "add" => ChannelKind::Add,
            "ephemeral" => ChannelKind::Ephemeral,
            "topic" => ChannelKind::Topic { accumulate: false },
            _ => return None,
        })
    };
    match spec {
        Value::String(s) => {
            if let Some(kind) = by_reducer(s) {
                return Ok(ChannelSpec::new(key, kind));
            }
            if let Some(schema) = type_schema(s) {
                return Ok(ChannelSpec::new(key, ChannelKind::LastValue).with_schema(schema));
            }
            Err(cx.err(place, format!("`{s}` is neither a reducer ({reducers}) nor a type (string, integer, number, boolean, object, array, any)")))
        }
        Value::Null => Ok(ChannelSpec::new(key, ChannelKind::LastValue)),
        Value::Object(m) => {
            check_keys(
                cx,
                m,
                place,
                &[
                    "type",
                    "reducer",
                    "default",
                    "description",
                    "enum",
                    "items",
                    "accumulate",
                    "code",
                    "schema",
                ],
            )?;
            let kind = match string(cx, m, "reducer", place)? {
                None => ChannelKind::LastValue,
                Some("script") => {
                    let code = required(cx, m, "code", place)?;
                    ChannelKind::Custom(Arc::new(ScriptReducer(script(
                        cx,
                        code,
                        &format!("{place}.code"),
                        resources,
                    )?)))
                }
                Some("topic") => ChannelKind::Topic {
                    accumulate: m
                        .get("accumulate")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                },
                Some(r) => by_reducer(r).ok_or_else(|| {
                    cx.err(
                        format!("{place}.reducer"),
                        format!("unknown reducer `{r}`; expected one of: {reducers}"),
                    )
                })?,
            };
            let mut ch = ChannelSpec::new(key, kind);
            let mut schema = match m.get("schema") {
                Some(Value::Object(s)) => s.clone(),
                Some(other) => {
                    return Err(cx.err(
                        format!("{place}.schema"),
                        format!("expected a JSON Schema mapping, found {}", kind_of(other)),
                    ))
                }
                None => ch.schema.as_object().cloned().unwrap_or_default(),
            };
            if let Some(t) = string(cx, m, "type", place)? {
                let ts = type_schema(t).ok_or_else(|| cx.err(format!("{place}.type"), format!("unknown type `{t}`; expected string, integer, number, boolean, object, array or any")))?;
                schema.remove("type");
                if let Value::Object(o) = ts {
                    schema.extend(o);
                }
            }
            for k in ["enum", "items", "description"] {
                if let Some(v) = m.get(k) {
                    schema.insert(k.into(), v.clone());
                }
            }
            ch = ch.with_schema(Value::Object(schema));
            if let Some(d) = m.get("default") {
                if !default_fits(&ch.schema, d) {
                    return Err(cx.err(
                        format!("{place}.default"),
                        format!(
                            "the default {d} does not match the type `{}`",
                            ch.schema["type"].as_str().unwrap_or("?")
                        ),
                    ));
                }
                if matches!(ch.kind, ChannelKind::Messages | ChannelKind::Append) && !d.is_array() {
                    return Err(cx.err(
                        format!("{place}.default"),
                        "a list channel's default must be a list",
                    ));
                }
                if let (Some(Value::Array(allowed)), false) = (ch.schema.get("enum"), d.is_null()) {
                    if !allowed.contains(d) {
                        return Err(cx.err(
                            format!("{place}.default"),
                            format!("the default {d} is not one of the `enum` values"),
                        ));
                    }
                }
                ch = ch.with_default(d.clone());
            }
            Ok(ch)
        }
        other => Err(cx.err(
            place,
            format!(
                "expected a reducer name, a type or a mapping, found {}",
                kind_of(other)
            ),
        )),
    }
}
