//! Per-run text in graph files: `{name}` placeholders filled from the run, as LangGraph's
//! templates fill a system prompt with `.format(system_time=..., **context)`.
//!
//! A placeholder is `{identifier}`; `{{` and `}}` are literal braces, and a brace that opens
//! no identifier (`{"a": 1}` in a prompt that shows JSON) is left as written, so prompts
//! without placeholders never change. A name is looked up as `system_time` (the time of the
//! call, ISO 8601 in UTC), then in the run's `context`, then in its `config.configurable`.

use serde_json::Value;

use crate::context::TaskContext;
use crate::node::NodeError;

/// Text with the run's values in place of its placeholders.
pub fn fill(template: &str, ctx: &TaskContext) -> Result<String, NodeError> {
    fill_with(template, |name| lookup(name, ctx))
}

/// The run's value of the placeholder `name` (`model: "{model}"` names a model by it).
pub fn value(name: &str, ctx: &TaskContext) -> Result<String, NodeError> {
    lookup(name, ctx).ok_or_else(|| missing(name))
}

/// The placeholder `text` is made of alone (`{model}` gives `model`), if it is one.
pub fn sole_placeholder(text: &str) -> Option<&str> {
    let name = text.strip_prefix('{')?.strip_suffix('}')?;
    is_identifier(name).then_some(name)
}

/// What a run sets `name` to: its `context`, else its `config.configurable` (null is unset).
/// How a run names its model, its prompt's values and its graph's variant.
pub(crate) fn run_setting<'a>(
    name: &str,
    config: &'a Value,
    context: &'a Value,
) -> Option<&'a Value> {
    context
        .get(name)
        .or_else(|| config.pointer(&format!("/configurable/{name}")))
        .filter(|v| !v.is_null())
}

fn lookup(name: &str, ctx: &TaskContext) -> Option<String> {
    if name == "system_time" {
        return Some(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, false));
    }
    run_setting(name, &ctx.run.config, &ctx.run.context).map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

fn fill_with(
    template: &str,
    mut value_of: impl FnMut(&str) -> Option<String>,
) -> Result<String, NodeError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find(['{', '}']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        let name = tail[1..]
            .split('}')
            .next()
            .filter(|_| tail.starts_with('{'));
        match name.filter(|n| is_identifier(n) && tail[1..].contains('}')) {
            Some(name) => {
                let value = value_of(name).ok_or_else(|| missing(name))?;
                out.push_str(&value);
                rest = &tail[name.len() + 2..];
            }
            None => {
                out.push_str(&tail[..1]);
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn missing(name: &str) -> NodeError {
    NodeError::new(
        "KeyError",
        format!(
            "the placeholder {{{name}}} has no value: the run's context and config.configurable \
             have no `{name}` (give it in the run, the assistant, or the graph's `context` or \
             `config` defaults; write {{{{ and }}}} for literal braces)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill_from(template: &str, pairs: &[(&str, &str)]) -> Result<String, NodeError> {
        fill_with(template, |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn placeholders_are_filled_and_other_braces_stay() {
        let out = fill_from(
            "Hi {user}, it is {system_time}. Answer as {\"a\": 1} {{user}} }",
            &[("user", "Ada"), ("system_time", "now")],
        );
        assert_eq!(
            out.unwrap(),
            "Hi Ada, it is now. Answer as {\"a\": 1} {user} }"
        );
    }

    #[test]
    fn a_placeholder_without_a_value_is_named() {
        let err = fill_from("Hello {who}", &[]).unwrap_err().to_string();
        assert!(err.contains("KeyError") && err.contains("{who}"), "{err}");
    }

    #[test]
    fn text_without_placeholders_is_unchanged() {
        let text = "Reply in JSON: {\"answer\": ...} and { spaced }";
        assert_eq!(fill_from(text, &[]).unwrap(), text);
        assert_eq!(sole_placeholder("{model}"), Some("model"));
        assert_eq!(sole_placeholder("gpt {model}"), None);
    }
}
