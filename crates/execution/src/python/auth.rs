//! LangGraph's custom auth (`auth.path`), asked of a worker: who a request's caller is
//! (`auth.authenticate`), and whether they may do an action (`auth.authorize`). The handlers
//! are the project's own Python; Spindle applies what they answer.

use std::sync::Arc;

use serde_json::Value;

use super::pool::PythonPool;
use super::reads::{call, ReadError};

/// The `@auth.authenticate` handler's answer for a request (`{method, path, headers: [[name,
/// value]], query, path_params}`): `{ok: true, user}` or `{ok: false, status, detail}`.
pub async fn authenticate(pool: &Arc<PythonPool>, request: &Value) -> Result<Value, ReadError> {
    json(call(pool, "auth.authenticate", request).await?)
}

/// The `@auth.on` handler's answer for `{resource, action, user, value}`: `{ok: true, filters,
/// value}` (the value as the handler left it) or `{ok: false, status, detail}`.
pub async fn authorize(pool: &Arc<PythonPool>, ask: &Value) -> Result<Value, ReadError> {
    json(call(pool, "auth.authorize", ask).await?)
}

fn json(answer: rmpv::Value) -> Result<Value, ReadError> {
    rmpv::ext::from_value(answer).map_err(|e| {
        ReadError::Unavailable(format!("the worker's auth answer is not understood: {e}"))
    })
}
