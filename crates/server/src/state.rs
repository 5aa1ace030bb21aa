//! What every handler shares: the database, the graphs, and who is calling.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use spindle_storage::{Scope, Storage};

use crate::error::ApiError;
use crate::graphs::GraphRegistry;

#[derive(Clone)]
pub struct AppState {
    pub storage: Arc<dyn Storage>,
    pub graphs: Arc<GraphRegistry>,
}

impl AppState {
    pub fn new(storage: Arc<dyn Storage>, graphs: Arc<GraphRegistry>) -> Self {
        Self { storage, graphs }
    }
}

/// The identity a request acts for. Every storage call takes it, so authentication can plug in
/// here without touching a query. Until it exists, every request is the one local user.
pub struct Caller(pub Scope);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(_parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Caller(Scope::local()))
    }
}
