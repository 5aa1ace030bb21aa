//! The error model. One table ([`ErrorCode`]) maps every error kind to its HTTP status and its
//! `error` string; every error body is built from it, so a kind cannot answer two ways.
//!
//! Two bodies exist, as the interface prescribes: every 422 (a validation failure, or a request
//! that cannot be carried out as asked) answers `{"detail": [{"loc", "msg", "type", "input"?,
//! "ctx"?}]}`, everything else answers `{"error", "message", "details"}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Map, Value};
use spindle_storage::StorageError;
use utoipa::ToSchema;

/// Every kind of error the API answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The resource does not exist, or belongs to another user.
    NotFound,
    /// The request collides with the current state (an id that exists, a busy thread).
    Conflict,
    /// The request cannot apply to the resource as it is (where the reference answers 400:
    /// a state edit on a thread that has no graph).
    BadRequest,
    /// The body or parameters failed validation (answered with the 422 `detail` list).
    Validation,
    /// The request is well-formed but cannot be carried out as asked (answered with the 422
    /// `detail` list too, naming the body).
    InvalidRequest,
    /// The body is larger than the server accepts.
    PayloadTooLarge,
    /// The body is not JSON by its `Content-Type` (a browser sends a cross-site form or
    /// `text/plain` body without asking first; only a JSON one needs its permission).
    UnsupportedMediaType,
    /// No credentials, or credentials that prove nothing (answered with `WWW-Authenticate`).
    Unauthorized,
    /// The caller may see the resource but not do this to it (the caller's permissions).
    Forbidden,
    /// The database cannot be reached.
    Unavailable,
    /// A fault of the server; the message is logged, not leaked.
    Internal,
}

impl ErrorCode {
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::Conflict => StatusCode::CONFLICT,
            ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
            ErrorCode::Validation | ErrorCode::InvalidRequest => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Validation => "validation_error",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal_error",
        }
    }
}

/// One entry of a 422 body: where the problem is, what it is, and its machine-readable type.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ValidationItem {
    /// Path to the offending value: `["body", "metadata"]`, `["query", "limit"]`, `["path", "thread_id"]`.
    #[schema(schema_with = loc_schema)]
    pub loc: Vec<Value>,
    pub msg: String,
    /// `missing`, `string_type`, `enum`, `string_too_long`, `greater_than_equal`, `json_invalid`, ...
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub ctx: Option<Map<String, Value>>,
}

impl ValidationItem {
    pub fn new(loc: Vec<Value>, kind: &str, msg: impl Into<String>) -> Self {
        Self {
            loc,
            msg: msg.into(),
            kind: kind.to_owned(),
            input: None,
            ctx: None,
        }
    }

    pub fn with_input(mut self, input: Value) -> Self {
        self.input = Some(input);
        self
    }

    pub fn with_ctx(mut self, ctx: Value) -> Self {
        self.ctx = ctx.as_object().cloned();
        self
    }
}

/// A `loc`: names of fields and indexes of list items, as the interface prescribes.
fn loc_schema() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
    let part =
        ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::String, Type::Integer]));
    ArrayBuilder::new().items(part).build()
}

/// The 422 body.
#[derive(Debug, Serialize, ToSchema)]
pub struct ValidationErrorBody {
    pub detail: Vec<ValidationItem>,
}

/// The body of every error other than validation.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error kind: `not_found`, `conflict`, `unavailable`, `internal_error`, ...
    pub error: String,
    pub message: String,
    #[schema(value_type = Object)]
    pub details: Map<String, Value>,
}

/// An error on its way to becoming a response. Boxed so that `Result<T, ApiError>` stays
/// one pointer wide on the happy path.
#[derive(Debug)]
pub struct ApiError(Box<ErrorParts>);

#[derive(Debug)]
struct ErrorParts {
    code: ErrorCode,
    message: String,
    details: Map<String, Value>,
    validation: Vec<ValidationItem>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self(Box::new(ErrorParts {
            code,
            message: message.into(),
            details: Map::new(),
            validation: Vec::new(),
        }))
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Conflict, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    /// A 422 with the given items.
    pub fn validation(items: Vec<ValidationItem>) -> Self {
        let message = items
            .iter()
            .map(|item| format!("{}: {}", loc_string(&item.loc), item.msg))
            .collect::<Vec<_>>()
            .join("; ");
        let mut error = Self::new(ErrorCode::Validation, message);
        error.0.validation = items;
        error
    }

    /// A 422 about one field.
    pub fn field(loc: Vec<Value>, kind: &str, msg: impl Into<String>) -> Self {
        Self::validation(vec![ValidationItem::new(loc, kind, msg)])
    }

    pub fn with_detail(mut self, key: &str, value: Value) -> Self {
        self.0.details.insert(key.to_owned(), value);
        self
    }

    pub fn code(&self) -> ErrorCode {
        self.0.code
    }

    pub fn message(&self) -> &str {
        &self.0.message
    }

    pub fn validation_items(&self) -> &[ValidationItem] {
        &self.0.validation
    }
}

fn loc_string(loc: &[Value]) -> String {
    loc.iter()
        .map(|part| match part {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let parts = *self.0;
        let status = parts.code.status();
        match parts.code {
            ErrorCode::Validation => {
                tracing::debug!(error = %parts.message, "request refused by validation");
                (
                    status,
                    Json(ValidationErrorBody {
                        detail: parts.validation,
                    }),
                )
                    .into_response()
            }
            ErrorCode::InvalidRequest => {
                // The interface has one body for a 422, the `detail` list; a request refused
                // for what it asks rather than how it is written names the body as a whole.
                let item = ValidationItem::new(vec![json!("body")], "value_error", parts.message);
                (status, Json(ValidationErrorBody { detail: vec![item] })).into_response()
            }
            ErrorCode::Internal => {
                tracing::error!(error = %parts.message, "internal error");
                let body = ErrorBody {
                    error: parts.code.name().into(),
                    message: "internal server error".into(),
                    details: Map::new(),
                };
                (status, Json(body)).into_response()
            }
            _ => {
                let body = ErrorBody {
                    error: parts.code.name().into(),
                    message: parts.message,
                    details: parts.details,
                };
                (status, Json(body)).into_response()
            }
        }
    }
}

impl From<StorageError> for ApiError {
    fn from(err: StorageError) -> Self {
        match err {
            StorageError::NotFound(what) => {
                ApiError::not_found(format!("{} not found", capitalize(what)))
            }
            StorageError::Conflict(msg) => ApiError::conflict(capitalize(&msg)),
            StorageError::Invalid(msg) => ApiError::new(ErrorCode::InvalidRequest, msg),
            // Only when the assistant kept changing through every attempt (`start_run`).
            StorageError::AssistantChanged => {
                ApiError::conflict("The assistant changed while the run was being created")
            }
            StorageError::Database(sqlx_err) if is_unavailable(&sqlx_err) => {
                tracing::error!(error = %sqlx_err, "database unavailable");
                ApiError::new(ErrorCode::Unavailable, "the database is unavailable")
            }
            other => ApiError::internal(other.to_string()),
        }
    }
}

fn is_unavailable(err: &spindle_storage::SqlxError) -> bool {
    use spindle_storage::SqlxError as E;
    matches!(err, E::PoolTimedOut | E::PoolClosed | E::Io(_))
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The `details` of a not-found error, naming the resource.
pub fn not_found_resource(kind: &str, id: impl std::fmt::Display) -> ApiError {
    ApiError::not_found(format!("{} {id} not found", capitalize(kind)))
        .with_detail(kind, json!(id.to_string()))
}
