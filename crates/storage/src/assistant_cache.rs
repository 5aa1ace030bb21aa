//! The assistants runs were created for, kept by a PostgreSQL storage so that creating a run
//! does not read its assistant again ([`crate::AssistantStore::assistant_for_run`]).
//!
//! Reading the assistant was a query, a pool connection and sqlx's ping on its release for
//! every run: without them, create + wait at 16 clients took 8 % less of Spindle's CPU per run
//! and 6 % less of PostgreSQL's, and did 4 % more runs/s (`bench/pair.py`, 3 pairs). A kept copy may be out of date: another process may
//! have updated or deleted the assistant. So a run's creation names the version it was made
//! from ([`crate::AssistantRead`]) and checks it in the same statement that inserts the run;
//! when it no longer holds, the copy is forgotten and the creation refused
//! ([`crate::StorageError::AssistantChanged`]), for the caller to read the assistant again.
//! This process's own writes forget their copy at once.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::{Assistant, ResourceId, Scope};

/// Most assistants kept: past it the copies are dropped and read again as runs need them
/// (deployments have a handful of assistants; this bounds one that makes them per user).
const MOST_KEPT: usize = 1024;

#[derive(Default)]
pub(crate) struct AssistantCache {
    kept: Mutex<HashMap<ResourceId, Assistant>>,
}

impl AssistantCache {
    /// The kept copy of `id`, if the caller may see it (as the query's owner condition).
    pub(crate) fn get(&self, scope: &Scope, id: ResourceId) -> Option<Assistant> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.get(&id)
            .filter(|a| {
                a.user_id
                    .as_deref()
                    .is_none_or(|owner| owner == scope.user_id)
            })
            .cloned()
    }

    pub(crate) fn keep(&self, assistant: &Assistant) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= MOST_KEPT {
            kept.clear();
        }
        kept.insert(assistant.assistant_id, assistant.clone());
    }

    pub(crate) fn forget(&self, id: ResourceId) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.remove(&id);
    }
}
