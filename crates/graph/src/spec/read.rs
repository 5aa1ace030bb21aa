//! Reading a parsed document with errors that carry the file, the place and the line.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::locate::line_of;
use super::SpecError;
use crate::graph::{END, START};
use crate::script::{Script, ScriptLimits, ScriptOrigin, ScriptResources};

/// Router answers mapped to node names.
pub(super) type PathMap = Vec<(String, String)>;

pub(super) struct Ctx<'a> {
    pub(super) file: &'a str,
    pub(super) source: &'a str,
}

impl Ctx<'_> {
    pub(super) fn err(&self, place: impl Into<String>, message: impl Into<String>) -> SpecError {
        let place = place.into();
        SpecError {
            file: self.file.to_string(),
            line: if place.is_empty() {
                None
            } else {
                line_of(self.source, &place)
            },
            place,
            message: message.into(),
        }
    }
}

pub(super) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

pub(super) fn obj<'v>(
    cx: &Ctx,
    v: &'v Value,
    place: &str,
) -> Result<&'v Map<String, Value>, SpecError> {
    v.as_object()
        .ok_or_else(|| cx.err(place, format!("expected a mapping, found {}", kind_of(v))))
}

pub(super) fn check_keys(
    cx: &Ctx,
    m: &Map<String, Value>,
    place: &str,
    allowed: &[&str],
) -> Result<(), SpecError> {
    for k in m.keys() {
        if !allowed.contains(&k.as_str()) {
            let at = if place.is_empty() {
                k.clone()
            } else {
                format!("{place}.{k}")
            };
            return Err(cx.err(
                at,
                format!("unknown key `{k}`; expected one of: {}", allowed.join(", ")),
            ));
        }
    }
    Ok(())
}

pub(super) fn string<'v>(
    cx: &Ctx,
    m: &'v Map<String, Value>,
    key: &str,
    place: &str,
) -> Result<Option<&'v str>, SpecError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(cx.err(
            format!("{place}.{key}"),
            format!("expected a string, found {}", kind_of(other)),
        )),
    }
}

pub(super) fn required<'v>(
    cx: &Ctx,
    m: &'v Map<String, Value>,
    key: &str,
    place: &str,
) -> Result<&'v str, SpecError> {
    string(cx, m, key, place)?.ok_or_else(|| cx.err(place, format!("`{key}` is required")))
}

pub(super) fn string_list(cx: &Ctx, v: &Value, place: &str) -> Result<Vec<String>, SpecError> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str().map(str::to_string).ok_or_else(|| {
                    cx.err(
                        format!("{place}[{i}]"),
                        format!("expected a name, found {}", kind_of(x)),
                    )
                })
            })
            .collect(),
        other => Err(cx.err(
            place,
            format!(
                "expected a name or a list of names, found {}",
                kind_of(other)
            ),
        )),
    }
}

pub(super) fn node_ref(name: &str) -> String {
    match name {
        "START" | "__start__" => START.to_string(),
        "END" | "__end__" => END.to_string(),
        other => other.to_string(),
    }
}

pub(super) fn script(
    cx: &Ctx,
    code: &str,
    place: &str,
    resources: &ScriptResources,
) -> Result<Arc<Script>, SpecError> {
    let origin = script_origin(cx, code, place);
    match Script::compile(code, ScriptLimits::default(), resources.clone()) {
        Ok(s) => Ok(Arc::new(s.with_origin(origin))),
        Err(e) => {
            let mut err = cx.err(
                place,
                format!("script does not compile: {}", e.describe(origin.as_ref())),
            );
            if let (Some(o), Some(l)) = (&origin, e.line) {
                err.line = Some(o.line + l - 1);
            }
            Err(err)
        }
    }
}

/// Where `code`, the value at `place`, starts in the file: a block scalar (`code: |`) on the
/// lines after its key, or a one-line value (quoted or not) on its key's line. Only when the
/// file's text is the script's text there, so lines and columns map one to one; a folded or
/// escaped script has no origin, and its errors give the script's own lines.
fn script_origin(cx: &Ctx, code: &str, place: &str) -> Option<ScriptOrigin> {
    let key_line = line_of(cx.source, place)?;
    let key = place.rsplit('.').next()?;
    let lines: Vec<&str> = cx.source.lines().collect();
    let text = lines.get(key_line - 1)?;
    let after_key = [
        format!("\"{key}\":"),
        format!("'{key}':"),
        format!("{key}:"),
    ]
    .iter()
    .find_map(|k| text.find(k.as_str()).map(|i| i + k.len()))?;
    let rest = &text[after_key..];
    let value_at = after_key + (rest.len() - rest.trim_start().len());
    let value = &text[value_at..];
    if value.starts_with('|') {
        let first = code.lines().next()?;
        let (i, line) = lines
            .iter()
            .enumerate()
            .skip(key_line)
            .find(|(_, l)| !l.trim().is_empty())?;
        let indent = line.len() - line.trim_start().len();
        let same = code
            .lines()
            .zip(&lines[i..])
            .all(|(c, f)| c.trim_end() == f.get(indent..).unwrap_or("").trim_end());
        return (same && line[indent..].trim_end() == first.trim_end()).then(|| ScriptOrigin {
            file: cx.file.to_string(),
            line: i + 1,
            column: indent + 1,
            indent,
        });
    }
    let start = value_at + usize::from(value.starts_with(['"', '\'']));
    let one_line = !code.contains('\n') && text[start..].starts_with(code);
    one_line.then(|| ScriptOrigin {
        file: cx.file.to_string(),
        line: key_line,
        column: text[..start].chars().count() + 1,
        indent: 0,
    })
}
