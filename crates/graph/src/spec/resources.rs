//! Models and tools declared by a graph file.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::read::{check_keys, obj, required, script, string, string_list, Ctx};
use super::SpecError;
use crate::graph::Graph;
use crate::model::{
    AnthropicModel, ChatModel, Chunking, GeminiModel, HttpSettings, ModelRegistry, OpenAiModel,
    ScriptedModel, ToolSchema,
};
use crate::script::ScriptResources;
use crate::tools::{Tool, ToolImpl};

/// The providers `provider:` accepts, for the error naming an unknown one.
const PROVIDERS: &str = "scripted, openai, openai_compatible, anthropic, gemini or google_genai";

/// Keys every HTTP provider accepts; see docs/model-providers.md.
const HTTP_KEYS: [&str; 7] = [
    "provider",
    "base_url",
    "base_url_env",
    "model",
    "model_env",
    "api_key_env",
    "params",
];

pub(super) fn compile_models(
    cx: &Ctx,
    v: Option<&Value>,
    place: &str,
) -> Result<ModelRegistry, SpecError> {
    let mut reg = ModelRegistry::default();
    let Some(v) = v else { return Ok(reg) };
    for (name, spec) in obj(cx, v, place)? {
        let p = format!("{place}.{name}");
        let m = obj(cx, spec, &p)?;
        let model: Arc<dyn ChatModel> = match required(cx, m, "provider", &p)? {
            "scripted" => Arc::new(scripted_model(cx, m, &p)?),
            provider @ ("openai" | "openai_compatible") => {
                let keys = [HTTP_KEYS.as_slice(), &["api_key_header", "query"]].concat();
                check_keys(cx, m, &p, &keys)?;
                // Plain `openai` means OpenAI itself; a compatible server must say where it is.
                let default_url = (provider == "openai").then_some("https://api.openai.com/v1");
                Arc::new(OpenAiModel {
                    http: http_settings(cx, m, &p, default_url)?,
                    api_key_header: string(cx, m, "api_key_header", &p)?.map(str::to_string),
                    query: string_map(cx, m, "query", &p)?,
                })
            }
            "anthropic" => {
                check_keys(cx, m, &p, &HTTP_KEYS)?;
                let http = http_settings(cx, m, &p, Some("https://api.anthropic.com"))?;
                Arc::new(AnthropicModel { http })
            }
            "gemini" | "google_genai" => {
                check_keys(cx, m, &p, &HTTP_KEYS)?;
                let default_url = "https://generativelanguage.googleapis.com";
                Arc::new(GeminiModel {
                    http: http_settings(cx, m, &p, Some(default_url))?,
                })
            }
            other => {
                return Err(cx.err(
                    format!("{p}.provider"),
                    format!("unknown provider `{other}`; expected {PROVIDERS}"),
                ))
            }
        };
        reg.insert(name.clone(), model);
    }
    Ok(reg)
}

fn scripted_model(cx: &Ctx, m: &Map<String, Value>, p: &str) -> Result<ScriptedModel, SpecError> {
    check_keys(
        cx,
        m,
        p,
        &["provider", "responses", "chunk", "delay_ms", "model_name"],
    )?;
    let responses = match m.get("responses") {
        Some(Value::Array(r)) if !r.is_empty() => r.clone(),
        _ => return Err(cx.err(p, "a scripted model needs a non-empty `responses` list")),
    };
    for (i, r) in responses.iter().enumerate() {
        let ok = r.is_string()
            || r.as_object().is_some_and(|o| {
                o.keys()
                    .all(|k| ["content", "tool_calls", "id"].contains(&k.as_str()))
            });
        if !ok {
            return Err(cx.err(
                format!("{p}.responses[{i}]"),
                "a response is a text or a mapping of `content`, `tool_calls` and `id`",
            ));
        }
        for (j, c) in r
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if c.get("name").and_then(Value::as_str).is_none() {
                return Err(cx.err(
                    format!("{p}.responses[{i}].tool_calls[{j}]"),
                    "a tool call needs a `name`",
                ));
            }
        }
    }
    let chunking = match string(cx, m, "chunk", p)?.unwrap_or("word") {
        "char" => Chunking::Char,
        "word" => Chunking::Word,
        "whole" | "none" => Chunking::Whole,
        other => {
            return Err(cx.err(
                format!("{p}.chunk"),
                format!("unknown chunking `{other}`; expected char, word or whole"),
            ))
        }
    };
    let delay = m.get("delay_ms").and_then(Value::as_u64).unwrap_or(0);
    Ok(ScriptedModel {
        responses,
        chunking,
        delay: Duration::from_millis(delay),
        model_name: string(cx, m, "model_name", p)?.map(str::to_string),
    })
}

/// `base_url`, `model` (each from its `_env` variable when set), the key from `api_key_env`
/// and `params`.
fn http_settings(
    cx: &Ctx,
    m: &Map<String, Value>,
    p: &str,
    default_url: Option<&str>,
) -> Result<HttpSettings, SpecError> {
    let env = |key: &str| -> Result<Option<String>, SpecError> {
        Ok(string(cx, m, key, p)?
            .and_then(|var| std::env::var(var).ok())
            .filter(|s| !s.is_empty()))
    };
    let setting = |key: &str, default: Option<&str>| -> Result<String, SpecError> {
        env(&format!("{key}_env"))?
            .or(string(cx, m, key, p)?.map(str::to_string))
            .or(default.map(str::to_string))
            .ok_or_else(|| {
                cx.err(
                    p,
                    format!("this model needs `{key}` (or `{key}_env` naming a set variable)"),
                )
            })
    };
    let params = match m.get("params") {
        None => Map::new(),
        Some(v) => obj(cx, v, &format!("{p}.params"))?.clone(),
    };
    Ok(HttpSettings {
        base_url: setting("base_url", default_url)?,
        model: setting("model", None)?,
        api_key: env("api_key_env")?,
        params,
        client: reqwest::Client::new(),
    })
}

/// A mapping of strings (`query:`); numbers and booleans are written as text.
fn string_map(
    cx: &Ctx,
    m: &Map<String, Value>,
    key: &str,
    p: &str,
) -> Result<Vec<(String, String)>, SpecError> {
    let Some(v) = m.get(key) else {
        return Ok(Vec::new());
    };
    let place = format!("{p}.{key}");
    obj(cx, v, &place)?
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            Value::Number(_) | Value::Bool(_) => Ok((k.clone(), v.to_string())),
            _ => Err(cx.err(format!("{place}.{k}"), "expected a string")),
        })
        .collect()
}

pub(super) fn compile_tools(
    cx: &Ctx,
    v: Option<&Value>,
    place: &str,
    resources: &ScriptResources,
    graphs: &HashMap<String, Arc<Graph>>,
) -> Result<HashMap<String, Arc<Tool>>, SpecError> {
    let mut out = HashMap::new();
    let Some(v) = v else { return Ok(out) };
    for (name, spec) in obj(cx, v, place)? {
        let p = format!("{place}.{name}");
        let m = obj(cx, spec, &p)?;
        let parameters = m
            .get("parameters")
            .cloned()
            .unwrap_or(json!({"type": "object", "properties": {}}));
        if !parameters.is_object() {
            return Err(cx.err(format!("{p}.parameters"), "expected a JSON Schema mapping"));
        }
        let schema = ToolSchema {
            name: name.clone(),
            description: string(cx, m, "description", &p)?
                .unwrap_or_default()
                .to_string(),
            parameters,
        };
        let imp = match required(cx, m, "kind", &p)? {
            "script" => script_tool(cx, m, &p, resources)?,
            "http" => http_tool(cx, m, &p)?,
            "graph" => graph_tool(cx, m, &p, resources, graphs)?,
            other => {
                return Err(cx.err(
                    format!("{p}.kind"),
                    format!("unknown tool kind `{other}`; expected script, http or graph"),
                ))
            }
        };
        out.insert(name.clone(), Arc::new(Tool { schema, imp }));
    }
    Ok(out)
}

/// The keys every tool kind has.
const TOOL_KEYS: [&str; 3] = ["kind", "description", "parameters"];

fn tool_keys<'a>(own: &[&'a str]) -> Vec<&'a str> {
    TOOL_KEYS.iter().chain(own).copied().collect()
}

fn script_tool(
    cx: &Ctx,
    m: &Map<String, Value>,
    p: &str,
    resources: &ScriptResources,
) -> Result<ToolImpl, SpecError> {
    check_keys(cx, m, p, &tool_keys(&["code"]))?;
    let code = required(cx, m, "code", p)?;
    let script = script(cx, code, &format!("{p}.code"), resources)?;
    Ok(ToolImpl::Script(script))
}

fn http_tool(cx: &Ctx, m: &Map<String, Value>, p: &str) -> Result<ToolImpl, SpecError> {
    check_keys(cx, m, p, &tool_keys(&["method", "url", "headers"]))?;
    let method = string(cx, m, "method", p)?.unwrap_or("GET");
    let method =
        reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).map_err(|_| {
            cx.err(
                format!("{p}.method"),
                format!("`{method}` is not an HTTP method"),
            )
        })?;
    let url = required(cx, m, "url", p)?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(cx.err(
            format!("{p}.url"),
            "the URL must start with http:// or https://",
        ));
    }
    let headers = match m.get("headers") {
        None => Vec::new(),
        Some(h) => obj(cx, h, &format!("{p}.headers"))?
            .iter()
            .map(|(k, v)| {
                let v = v
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string());
                (k.clone(), v)
            })
            .collect(),
    };
    Ok(ToolImpl::Http {
        method,
        url: url.to_string(),
        headers,
        client: reqwest::Client::new(),
    })
}

/// A graph declared under `graphs`, run per call (a sub-agent as a tool).
fn graph_tool(
    cx: &Ctx,
    m: &Map<String, Value>,
    p: &str,
    resources: &ScriptResources,
    graphs: &HashMap<String, Arc<Graph>>,
) -> Result<ToolImpl, SpecError> {
    check_keys(cx, m, p, &tool_keys(&["graph", "input", "output"]))?;
    let name = required(cx, m, "graph", p)?;
    let graph = graphs.get(name).cloned().ok_or_else(|| {
        cx.err(
            format!("{p}.graph"),
            format!("unknown graph `{name}`; declare it under `graphs`"),
        )
    })?;
    let mapping = |key: &str| {
        string(cx, m, key, p)?
            .map(|code| script(cx, code, &format!("{p}.{key}"), resources))
            .transpose()
    };
    Ok(ToolImpl::Graph {
        graph,
        input: mapping("input")?,
        output: mapping("output")?,
    })
}

pub(super) fn pick_tools(
    cx: &Ctx,
    m: &Map<String, Value>,
    place: &str,
    tools: &HashMap<String, Arc<Tool>>,
) -> Result<Vec<Arc<Tool>>, SpecError> {
    let Some(v) = m.get("tools") else {
        return Ok(Vec::new());
    };
    let names = string_list(cx, v, &format!("{place}.tools"))?;
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            tools.get(n).cloned().ok_or_else(|| {
                let mut known: Vec<&String> = tools.keys().collect();
                known.sort();
                cx.err(
                    format!("{place}.tools[{i}]"),
                    format!(
                        "unknown tool `{n}`; declare it under `tools` (declared: {})",
                        known
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
        })
        .collect()
}
