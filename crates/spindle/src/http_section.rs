//! The config file's `http` section, LangGraph's keys: route groups turned off
//! (`disable_*`), request headers copied into runs (`configurable_headers`), webhooks off, and
//! `cors` (read by `LoadedConfig::cors`). Keys LangGraph has and Spindle does not use are
//! warned about; a key LangGraph does not have is an error naming it.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::{Map, Value};
use spindle_server::http_config::{HeaderFilter, HttpConfig};

/// The keys read.
const READ: [&str; 9] = [
    "cors",
    "configurable_headers",
    "disable_assistants",
    "disable_threads",
    "disable_runs",
    "disable_store",
    "disable_meta",
    "disable_webhooks",
    // Not in LangGraph's schema, but its server reads it: the agent protocol's routes alone.
    "disable_event_streaming",
];

/// Route groups of LangGraph Platform that Spindle does not serve: turning them off is
/// accepted and changes nothing.
const NOT_SERVED: [(&str, &str); 3] = [
    ("disable_ui", "a UI server (/ui)"),
    ("disable_mcp", "an MCP server (/mcp)"),
    ("disable_a2a", "an agent-to-agent server (/a2a)"),
];

/// LangGraph's keys that Spindle does not use: a custom app and its middleware and auth, a
/// mount prefix, header logging.
const UNUSED: [&str; 5] = [
    "app",
    "mount_prefix",
    "enable_custom_route_auth",
    "middleware_order",
    "logging_headers",
];

fn known() -> impl Iterator<Item = &'static str> {
    READ.into_iter()
        .chain(NOT_SERVED.map(|(key, _)| key))
        .chain(UNUSED)
}

/// The section's keys and values; `http` must be an object (or null, or absent).
fn entries(http: Option<&Value>) -> Result<Option<&Map<String, Value>>> {
    match http {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map)),
        Some(other) => bail!("`http` must be an object, not {other}"),
    }
}

/// Refuses a key of `http` that LangGraph's format does not have (a misspelt
/// `disable_run` would otherwise leave the runs served), suggesting the closest known one.
pub fn check_keys(http: Option<&Value>) -> Result<()> {
    let Some(map) = entries(http)? else {
        return Ok(());
    };
    let Some(key) = map.keys().find(|key| !known().any(|k| k == key.as_str())) else {
        return Ok(());
    };
    let closest = known()
        .map(|k| (strsim::damerau_levenshtein(key, k), k))
        .min()
        .filter(|(distance, _)| *distance <= 3);
    match closest {
        Some((_, k)) => bail!("unknown key `http.{key}` (did you mean `http.{k}`?)"),
        None => bail!(
            "unknown key `http.{key}`; the keys read are {}",
            READ.map(|k| format!("`{k}`")).join(", ")
        ),
    }
}

/// What the server serves and copies, from the section's keys.
pub fn settings(http: Option<&Value>) -> Result<HttpConfig> {
    let mut config = HttpConfig::default();
    let Some(map) = entries(http)? else {
        return Ok(config);
    };
    let d = &mut config.disabled;
    for (key, value) in map {
        let slot = match key.as_str() {
            "configurable_headers" => {
                config.configurable_headers = header_filter(value)?;
                continue;
            }
            "disable_webhooks" => &mut config.disable_webhooks,
            "disable_assistants" => &mut d.assistants,
            "disable_threads" => &mut d.threads,
            "disable_runs" => &mut d.runs,
            "disable_store" => &mut d.store,
            "disable_meta" => &mut d.meta,
            "disable_event_streaming" => &mut d.event_streaming,
            _ if NOT_SERVED.iter().any(|(k, _)| k == key) => {
                flag(key, value)?;
                continue;
            }
            _ => continue,
        };
        *slot = flag(key, value)?;
    }
    Ok(config)
}

fn flag(key: &str, value: &Value) -> Result<bool> {
    match value {
        Value::Bool(on) => Ok(*on),
        Value::Null => Ok(false),
        other => bail!("`http.{key}` must be true or false, not {other}"),
    }
}

/// `configurable_headers`, with LangGraph's two spellings of its keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderPatterns {
    #[serde(default, alias = "includes")]
    include: Option<Vec<String>>,
    #[serde(default, alias = "excludes")]
    exclude: Option<Vec<String>>,
}

fn header_filter(value: &Value) -> Result<HeaderFilter> {
    let patterns: Option<HeaderPatterns> = serde_json::from_value(value.clone()).context(
        "`http.configurable_headers` is not valid: expected {\"include\": [patterns], \
         \"exclude\": [patterns]}, a pattern being a header name with `*` wildcards",
    )?;
    let patterns = patterns.unwrap_or_default();
    Ok(HeaderFilter::new(
        &patterns.include.unwrap_or_default(),
        &patterns.exclude.unwrap_or_default(),
    ))
}

/// Says which keys change nothing: LangGraph's unused ones at warning level (a custom app or
/// prefix the operator expects is not there), the groups Spindle never serves at debug level
/// (nothing is missing). Keys set to false or null are defaults, and not mentioned.
pub fn log_unused(http: Option<&Value>) {
    let Ok(Some(map)) = entries(http) else {
        return;
    };
    let set = map
        .iter()
        .filter(|(_, value)| !matches!(value, Value::Null | Value::Bool(false)));
    for (key, _) in set {
        if UNUSED.contains(&key.as_str()) {
            tracing::warn!(
                section = format!("http.{key}"),
                "this config setting is not used by this version of Spindle"
            );
        } else if let Some((_, what)) = NOT_SERVED.iter().find(|(k, _)| k == key) {
            tracing::debug!(
                section = format!("http.{key}"),
                "Spindle serves no {what}: nothing to turn off"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use spindle_server::http_config::Disabled;

    fn err(result: Result<impl std::fmt::Debug>) -> String {
        format!("{:#}", result.unwrap_err())
    }

    #[test]
    fn langgraph_keys_are_accepted_and_others_refused_naming_them() {
        let all = json!({
            "cors": {}, "configurable_headers": {}, "disable_assistants": true,
            "disable_threads": false, "disable_runs": true, "disable_store": true,
            "disable_meta": true, "disable_webhooks": true, "disable_ui": true,
            "disable_mcp": true, "disable_a2a": true, "app": "./app.py:app",
            "mount_prefix": "/api", "enable_custom_route_auth": true,
            "middleware_order": "auth_first", "logging_headers": {},
            "disable_event_streaming": false,
        });
        check_keys(Some(&all)).unwrap();
        let e = err(check_keys(Some(&json!({"disable_run": true}))));
        assert!(
            e.contains("`http.disable_run`") && e.contains("did you mean `http.disable_runs`"),
            "{e}"
        );
        let e = err(check_keys(Some(&json!({"colour": "blue"}))));
        assert!(
            e.contains("`http.colour`") && e.contains("`configurable_headers`"),
            "{e}"
        );
        assert!(err(check_keys(Some(&json!(["cors"])))).contains("`http` must be an object"));
        check_keys(None).unwrap();
        check_keys(Some(&Value::Null)).unwrap();
    }

    #[test]
    fn disable_flags_turn_groups_off() {
        let config = settings(Some(&json!({
            "disable_assistants": true, "disable_runs": true, "disable_meta": true,
            "disable_store": null, "disable_webhooks": true, "disable_ui": true,
        })))
        .unwrap();
        assert_eq!(
            config.disabled,
            Disabled {
                assistants: true,
                runs: true,
                meta: true,
                ..Disabled::default()
            }
        );
        assert!(config.disable_webhooks);
        assert_eq!(settings(None).unwrap().disabled, Disabled::default());
        let e = err(settings(Some(&json!({"disable_threads": "yes"}))));
        assert!(
            e.contains("`http.disable_threads` must be true or false"),
            "{e}"
        );
        let e = err(settings(Some(&json!({"disable_mcp": 1}))));
        assert!(e.contains("`http.disable_mcp`"), "{e}");
    }

    #[test]
    fn configurable_headers_take_either_spelling_and_refuse_other_keys() {
        let headers = |value: Value| {
            settings(Some(&json!({"configurable_headers": value}))).map(|c| c.configurable_headers)
        };
        let short = headers(json!({"include": ["x-user-*"], "exclude": ["x-user-secret"]}));
        let long = headers(json!({"includes": ["x-user-*"], "excludes": ["x-user-secret"]}));
        assert_eq!(short.unwrap(), long.unwrap());
        let filter = headers(json!({"include": ["X-User-*"]})).unwrap();
        assert!(filter.copies("x-user-id"));
        assert!(!filter.copies("x-org"));
        assert_eq!(headers(Value::Null).unwrap(), HeaderFilter::default());
        let e = err(headers(json!({"inclde": ["x-*"]})));
        assert!(
            e.contains("http.configurable_headers") && e.contains("inclde"),
            "{e}"
        );
        let e = err(headers(json!({"include": "x-*"})));
        assert!(e.contains("http.configurable_headers"), "{e}");
    }
}
