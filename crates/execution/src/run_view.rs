//! A run as clients read it, over HTTP and in webhook deliveries alike.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use spindle_storage::{JsonObject, ResourceId, Run};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::execute::keys;

/// A run as clients read it: the fields LangGraph's clients read (`kwargs`, `metadata`,
/// `multitask_strategy`, ...) and the interface document's (`input`, `output`,
/// `error_message`, `config`, `context`).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunOut {
    pub run_id: Uuid,
    pub thread_id: ResourceId,
    pub assistant_id: ResourceId,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// pending, running, error, success, timeout or interrupted.
    pub status: String,
    #[schema(value_type = Object)]
    pub metadata: JsonObject,
    /// The run's parameters: input, command, config, context, stream modes, ...
    #[schema(value_type = Object)]
    pub kwargs: JsonObject,
    pub multitask_strategy: String,
    pub user_id: Option<String>,
    /// The input the run was given (any JSON value, as a run takes it); null for a run that
    /// only resumes or continues.
    #[schema(value_type = Value)]
    pub input: Option<Value>,
    /// The thread's values when the run ended; null until it ends.
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    /// Why the run failed; null unless it did.
    pub error_message: Option<String>,
    /// The configuration the run was created with.
    #[schema(value_type = Option<Object>)]
    pub config: Option<JsonObject>,
    /// The context the run was created with.
    #[schema(value_type = Option<Object>)]
    pub context: Option<JsonObject>,
}

impl From<Run> for RunOut {
    fn from(r: Run) -> Self {
        let object = |key: &str| r.kwargs.get(key).and_then(Value::as_object).cloned();
        let (config, context) = (object(keys::CONFIG), object(keys::CONTEXT));
        let input = r.kwargs.get(keys::INPUT).cloned();
        let error_message = r
            .error
            .as_ref()
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        Self {
            run_id: r.run_id,
            thread_id: r.thread_id,
            assistant_id: r.assistant_id,
            created_at: r.created_at,
            updated_at: r.updated_at,
            status: r.status.as_str().to_owned(),
            metadata: r.metadata,
            kwargs: r.kwargs,
            multitask_strategy: r.multitask_strategy.as_str().to_owned(),
            user_id: r.user_id,
            input,
            output: r.output,
            error_message,
            config,
            context,
        }
    }
}
