//! Who is calling, and what they may do: the config file's `auth` section.
//!
//! Without one, every request is the one local user (`spindle dev`'s default). With one, every
//! route but the health checks (and, unless `public_docs` or `public_metrics` is off, the
//! API's documentation and `/metrics`) needs credentials: an API key ([`api_keys`]) or a JWT bearer token ([`jwt`]). A request
//! without valid ones is a 401 with `WWW-Authenticate` and the interface's error body; a
//! request with them acts as the user they name, whose resources are theirs alone (storage
//! filters every query by [`Scope`]). With `enforce_permissions`, the caller's permissions
//! must also grant the route's action ([`actions`]), or the answer is a 403.

pub mod actions;
mod api_keys;
mod config;
mod custom;
pub mod filters;
mod jwt;

use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use spindle_storage::Scope;

use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;

pub use config::{AuthConfig, AuthConfigError};

/// The caller, as LangGraph's `MinimalUserDict` describes one: graphs see it as
/// `config.configurable.langgraph_auth_user`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthUser {
    pub identity: String,
    pub display_name: String,
    pub permissions: Vec<String>,
    pub is_authenticated: bool,
    /// What else a custom `@auth.authenticate` handler answered (`role`, `org_id`, ...):
    /// LangGraph hands it on to the `@auth.on` handlers and the graph.
    pub extra: Map<String, Value>,
}

impl AuthUser {
    /// The one user of a server without authentication.
    pub fn local() -> Self {
        Self {
            identity: Scope::LOCAL_USER.into(),
            display_name: Scope::LOCAL_USER.into(),
            permissions: Vec::new(),
            is_authenticated: false,
            extra: Map::new(),
        }
    }

    pub fn authenticated(
        identity: String,
        display_name: Option<String>,
        permissions: Vec<String>,
    ) -> Self {
        Self {
            display_name: display_name.unwrap_or_else(|| identity.clone()),
            identity,
            permissions,
            is_authenticated: true,
            extra: Map::new(),
        }
    }

    /// Whose resources the caller reaches.
    pub fn scope(&self) -> Scope {
        Scope::new(self.identity.clone())
    }

    /// As a run keeps it (`langgraph_auth_user`), and a cron for its firings.
    pub fn to_json(&self) -> Value {
        let mut user = self.extra.clone();
        user.insert("identity".into(), json!(self.identity));
        user.insert("display_name".into(), json!(self.display_name));
        user.insert("permissions".into(), json!(self.permissions));
        user.insert("is_authenticated".into(), json!(self.is_authenticated));
        Value::Object(user)
    }

    /// The user a run or cron kept with [`AuthUser::to_json`]; `None` when it kept none.
    pub fn from_json(value: &Value) -> Option<Self> {
        let identity = value.get("identity")?.as_str()?.to_owned();
        let strings = |key: &str| -> Vec<String> {
            value[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p.as_str().map(str::to_owned))
                .collect()
        };
        let mut extra = value.as_object().cloned().unwrap_or_default();
        for known in [
            "identity",
            "display_name",
            "permissions",
            "is_authenticated",
        ] {
            extra.remove(known);
        }
        Some(Self {
            display_name: value["display_name"]
                .as_str()
                .map_or_else(|| identity.clone(), str::to_owned),
            permissions: strings("permissions"),
            is_authenticated: value["is_authenticated"].as_bool().unwrap_or(true),
            identity,
            extra,
        })
    }
}

/// The request's caller: set by [`require`] when authentication is on, else the local user.
impl<S: Send + Sync> FromRequestParts<S> for AuthUser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Arc<AuthUser>>()
            .map_or_else(AuthUser::local, |user| user.as_ref().clone()))
    }
}

/// The configured authentication: who the credentials of a request name.
pub struct Auth {
    api_keys: api_keys::ApiKeys,
    jwt: Option<jwt::JwtVerifier>,
    /// LangGraph's custom auth (`auth.path`, `./auth.py:auth`): the Python workers load it,
    /// and its handlers decide.
    custom: Option<String>,
    /// Whether `/docs` and `/openapi.json` answer without credentials.
    pub public_docs: bool,
    /// Whether `/metrics` answers without credentials.
    pub public_metrics: bool,
    /// Whether a caller's permissions must grant each route's action.
    pub enforce_permissions: bool,
}

/// Why a request's credentials were refused: its message goes to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub message: String,
    /// RFC 6750's `error` of `WWW-Authenticate` when a token was sent but is not valid.
    pub invalid_token: bool,
}

impl Refusal {
    fn missing() -> Self {
        Self {
            message: "Authentication required: send an API key in `x-api-key` or a token in \
                      `Authorization: Bearer`"
                .into(),
            invalid_token: false,
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            invalid_token: true,
        }
    }
}

impl Auth {
    /// The ways in, for the start-up log: `api keys (2), jwt`.
    pub fn describe(&self) -> String {
        let mut ways = Vec::new();
        if !self.api_keys.is_empty() {
            ways.push(format!("api keys ({})", self.api_keys.len()));
        }
        if self.jwt.is_some() {
            ways.push("jwt".to_owned());
        }
        if self.custom.is_some() {
            ways.push("custom (Python)".to_owned());
        }
        ways.join(", ")
    }

    /// `auth.path`, the custom auth the Python workers must load.
    pub fn custom_path(&self) -> Option<&str> {
        self.custom.as_deref()
    }

    /// The user the request's credentials name. An API key is read from `x-api-key`, or from
    /// `Authorization: Bearer` when it is one of the configured keys; any other bearer token
    /// must be a valid JWT.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<AuthUser, Refusal> {
        if let Some(key) = headers.get("x-api-key") {
            let key = key.to_str().unwrap_or_default().trim();
            return self
                .api_keys
                .find(key)
                .cloned()
                .ok_or_else(|| Refusal::invalid("Invalid API key"));
        }
        let Some(token) = bearer(headers) else {
            return Err(Refusal::missing());
        };
        if let Some(user) = self.api_keys.find(token) {
            return Ok(user.clone());
        }
        match &self.jwt {
            Some(verifier) => verifier.verify(token).await.map_err(Refusal::invalid),
            None => Err(Refusal::invalid("Invalid API key")),
        }
    }
}

/// Whether the server lets `caller` do `action` where no route of its own was checked (a
/// protocol command): the caller's permissions when they are enforced, the custom auth's
/// handler when there is one, asked with `value` (LangGraph's description of the action, made
/// only then). A refusal says why.
pub async fn allows(
    state: &AppState,
    caller: &AuthUser,
    action: actions::Action,
    value: impl FnOnce() -> Value,
) -> Result<(), String> {
    let Some(auth) = &state.auth else {
        return Ok(());
    };
    if let Some(why) = missing_permission(auth, action, caller) {
        return Err(why);
    }
    if auth.custom.is_some() {
        return custom::allows(state, caller, action, value()).await;
    }
    Ok(())
}

/// The permission `caller` lacks for `action`, when permissions are enforced.
fn missing_permission(auth: &Auth, action: actions::Action, caller: &AuthUser) -> Option<String> {
    auth.enforce_permissions
        .then(|| actions::missing(action, &caller.permissions))
        .flatten()
}

/// The 403 of a route whose action `caller`'s permissions do not grant, when they are
/// enforced: the check every route passes, whichever way the caller was authenticated.
pub(super) fn forbidden(
    auth: &Auth,
    action: Option<actions::Action>,
    caller: &AuthUser,
) -> Option<Response> {
    let why = missing_permission(auth, action?, caller)?;
    Some(ApiError::new(ErrorCode::Forbidden, why).into_response())
}

/// The token of `Authorization: Bearer <token>`.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Routes anyone may call: a load balancer's health checks carry no credentials.
const OPEN_PATHS: [&str; 4] = ["/ok", "/health", "/live", "/ready"];

/// The metrics, which a Prometheus scraper reads without credentials unless
/// `auth.public_metrics` is off.
const METRICS_PATH: &str = "/metrics";

/// The middleware of every API route when authentication is on: names the caller (or answers
/// 401), then checks the caller may do the route's action (or answers 403).
pub async fn require(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let Some(auth) = state.auth.clone() else {
        return next.run(request).await;
    };
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let open = |p: &str| OPEN_PATHS.contains(&p) || (p == METRICS_PATH && auth.public_metrics);
    if path.as_deref().is_some_and(open) {
        return next.run(request).await;
    }
    if auth.custom.is_some() {
        return custom::require(&state, &auth, path.as_deref(), request, next).await;
    }
    let user = match auth.authenticate(request.headers()).await {
        Ok(user) => user,
        Err(refusal) => return unauthorized(refusal),
    };
    let action = path.and_then(|path| actions::of(request.method(), &path));
    if let Some(refused) = forbidden(&auth, action, &user) {
        return refused;
    }
    request.extensions_mut().insert(Arc::new(user));
    next.run(request).await
}

/// The middleware of `/docs` and `/openapi.json` when they are not public: credentials only.
pub async fn require_for_docs(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    match &state.auth {
        Some(auth) if !auth.public_docs && auth.custom.is_some() => {
            custom::require(&state, auth, None, request, next).await
        }
        Some(auth) if !auth.public_docs => match auth.authenticate(request.headers()).await {
            Ok(_) => next.run(request).await,
            Err(refusal) => unauthorized(refusal),
        },
        _ => next.run(request).await,
    }
}

/// 401 with the interface's error body and the challenge RFC 6750 asks for.
pub(crate) fn unauthorized(refusal: Refusal) -> Response {
    let challenge = if refusal.invalid_token {
        let description = refusal.message.replace('"', "'");
        format!(
            r#"Bearer realm="spindle", error="invalid_token", error_description="{description}""#
        )
    } else {
        r#"Bearer realm="spindle""#.to_owned()
    };
    tracing::debug!(reason = %refusal.message, "request refused: not authenticated");
    let mut response = ApiError::new(ErrorCode::Unauthorized, refusal.message).into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(WWW_AUTHENTICATE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_bearer_token_is_read_whatever_the_scheme_case() {
        assert_eq!(
            bearer(&headers(&[("authorization", "Bearer abc")])),
            Some("abc")
        );
        assert_eq!(
            bearer(&headers(&[("authorization", "bearer  abc ")])),
            Some("abc")
        );
        assert_eq!(bearer(&headers(&[("authorization", "Basic abc")])), None);
        assert_eq!(bearer(&headers(&[("authorization", "Bearer ")])), None);
        assert_eq!(bearer(&headers(&[])), None);
    }

    #[test]
    fn a_kept_user_reads_back_as_it_was() {
        let user =
            AuthUser::authenticated("u1".into(), Some("Ann".into()), vec!["threads:read".into()]);
        assert_eq!(AuthUser::from_json(&user.to_json()), Some(user));
        assert_eq!(AuthUser::from_json(&json!({"display_name": "x"})), None);
    }
}
