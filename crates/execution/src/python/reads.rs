//! What the API reads of a Python graph's threads and graphs, asked of a worker: Spindle never
//! decodes LangGraph's values, so the JSON views (a thread's state and history, schemas) are
//! made by LangGraph itself, as the reference server makes them.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use super::connection::{CallError, ErrorCode};
use super::pool::PythonPool;
use super::process::WorkerError;

/// How long a read waits for a worker while one is being replaced.
const READ_WAIT: Duration = Duration::from_secs(30);

/// Why a read of a Python graph failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The request names something the graph does not have (a bad namespace, `as_node`...).
    #[error("{0}")]
    Invalid(String),
    /// The graph failed to load in the workers.
    #[error("{0}")]
    NotLoaded(String),
    /// No worker could answer.
    #[error("no Python worker could answer: {0}")]
    Unavailable(String),
}

/// Where a state read points: LangGraph's `configurable` checkpoint keys.
#[derive(Debug, Clone, Default, Serialize)]
pub struct At {
    pub thread_id: String,
    pub checkpoint_ns: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<String>,
}

impl At {
    fn config(&self) -> Value {
        json!({"configurable": self})
    }
}

/// The thread's state at `at` (its latest checkpoint without an id), as the API's JSON.
pub async fn state(
    pool: &Arc<PythonPool>,
    graph_id: &str,
    at: &At,
    subgraphs: bool,
) -> Result<Value, ReadError> {
    let body = json!({"graph_id": graph_id, "config": at.config(), "subgraphs": subgraphs});
    let answer = call(pool, "state.get", &body).await?;
    json_of(&answer)
}

/// A page of the thread's history, newest first.
pub async fn history(
    pool: &Arc<PythonPool>,
    graph_id: &str,
    at: &At,
    limit: usize,
    before: Option<&str>,
    filter: Option<&Value>,
) -> Result<Vec<Value>, ReadError> {
    let mut body = json!({"graph_id": graph_id, "config": at.config(), "limit": limit});
    if let Some(before) = before {
        body["before"] = json!(before);
    }
    if let Some(filter) = filter.filter(|f| f.is_object()) {
        body["filter"] = filter.clone();
    }
    let answer = call(pool, "state.history", &body).await?;
    let Some(pages) = answer.as_array() else {
        return Err(ReadError::Unavailable(
            "the worker answered state.history with no list".into(),
        ));
    };
    pages.iter().map(json_of).collect()
}

pub(crate) async fn call(
    pool: &Arc<PythonPool>,
    op: &str,
    body: &Value,
) -> Result<rmpv::Value, ReadError> {
    let worker = pool
        .reader_within(READ_WAIT)
        .await
        .ok_or_else(|| ReadError::Unavailable("every worker is down or not answering".into()))?;
    match worker.process().call::<_, rmpv::Value>(op, body).await {
        Ok(answer) => Ok(answer),
        Err(WorkerError::Call {
            error: CallError::Remote(e),
            ..
        }) => Err(match e.code {
            ErrorCode::NotFound => ReadError::NotLoaded(e.message),
            ErrorCode::BadRequest => ReadError::Invalid(e.message),
            _ => ReadError::Unavailable(e.message),
        }),
        Err(e) => Err(ReadError::Unavailable(e.to_string())),
    }
}

/// A `bin` of JSON, as the worker answers views.
fn json_of(answer: &rmpv::Value) -> Result<Value, ReadError> {
    match answer {
        rmpv::Value::Binary(bytes) => serde_json::from_slice(bytes)
            .map_err(|e| ReadError::Unavailable(format!("the worker's JSON is not valid: {e}"))),
        other => Err(ReadError::Unavailable(format!(
            "the worker answered with {other} where JSON bytes were expected"
        ))),
    }
}

/// A graph's schemas as `/assistants/{id}/schemas` answers them (`graph_id` aside):
/// `{input_schema, output_schema, state_schema, config_schema, context_schema}`.
pub async fn schemas(
    pool: &Arc<PythonPool>,
    graph_id: &str,
    config: &Value,
) -> Result<serde_json::Map<String, Value>, ReadError> {
    let body = json!({"graph_id": graph_id, "config": config});
    let answer = call(pool, "graph.schemas", &body).await?;
    let mut out = serde_json::Map::new();
    for short in ["input", "output", "state", "config", "context"] {
        let schema = match &answer[short] {
            rmpv::Value::Nil => Value::Null,
            bytes => json_of(bytes)?,
        };
        out.insert(format!("{short}_schema"), schema);
    }
    Ok(out)
}

/// The drawable graph of `/assistants/{id}/graph`; `xray` is `false`, `true` or a depth.
pub async fn draw(
    pool: &Arc<PythonPool>,
    graph_id: &str,
    config: &Value,
    xray: Value,
) -> Result<Value, ReadError> {
    let body = json!({"graph_id": graph_id, "config": config, "xray": xray});
    json_of(&call(pool, "graph.draw", &body).await?)
}

/// The schemas of the graph's subgraphs by namespace (`/assistants/{id}/subgraphs`).
pub async fn subgraphs(
    pool: &Arc<PythonPool>,
    graph_id: &str,
    config: &Value,
    namespace: Option<&str>,
    recurse: bool,
) -> Result<Value, ReadError> {
    let mut body = json!({"graph_id": graph_id, "config": config, "recurse": recurse});
    if let Some(namespace) = namespace {
        body["namespace"] = json!(namespace);
    }
    json_of(&call(pool, "graph.subgraphs", &body).await?)
}

/// Edits a Python graph's thread state as if nodes had written `supersteps` (each a list of
/// `{values, as_node}`), from the checkpoint `at` points to; answers where the new checkpoint
/// is (`{thread_id, checkpoint_ns, checkpoint_id}`). LangGraph's reducers run in the worker.
pub async fn update(
    pool: &Arc<PythonPool>,
    graph_id: &str,
    at: &At,
    supersteps: Value,
) -> Result<Value, ReadError> {
    let body = json!({"graph_id": graph_id, "config": at.config(), "updates": supersteps});
    let answer = call(pool, "state.update", &body).await?;
    rmpv::ext::from_value(answer["config"].clone()).map_err(|e| {
        ReadError::Unavailable(format!(
            "the worker's state.update answer is not understood: {e}"
        ))
    })
}

/// A thread's columns (`GET /threads/{id}`) from its state as the API shows it: `interrupted`
/// when nodes are next, the values, and the interrupts of its tasks by task id.
pub fn columns_of(state: &Value) -> spindle_storage::ThreadStateColumns {
    let next = state["next"].as_array().is_some_and(|n| !n.is_empty());
    let mut interrupts = serde_json::Map::new();
    for task in state["tasks"].as_array().into_iter().flatten() {
        let (Some(id), Some(found)) = (task["id"].as_str(), task["interrupts"].as_array()) else {
            continue;
        };
        if !found.is_empty() {
            interrupts.insert(id.to_owned(), Value::Array(found.clone()));
        }
    }
    spindle_storage::ThreadStateColumns {
        status: if next {
            spindle_storage::ThreadStatus::Interrupted
        } else {
            spindle_storage::ThreadStatus::Idle
        },
        values: Some(state["values"].clone()),
        interrupts,
    }
}
