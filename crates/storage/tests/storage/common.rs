//! Builders that keep the tests about behaviour rather than struct literals.

use serde_json::Value;
use spindle_storage::*;
use uuid::Uuid;

pub fn obj(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("not a JSON object: {other}"),
    }
}

pub fn fields(graph_id: &str, name: &str, metadata: Value) -> AssistantFields {
    AssistantFields {
        graph_id: graph_id.to_owned(),
        name: name.to_owned(),
        description: None,
        config: JsonObject::new(),
        context: JsonObject::new(),
        metadata: obj(metadata),
    }
}

/// An id as a client may choose it, not a UUID, so that every test also shows that storage
/// keeps any id (generated ids are UUIDs).
pub fn client_id(kind: &str) -> ResourceId {
    ResourceId::parse(&format!("{kind}:{}.x_1", Uuid::new_v4().simple())).unwrap()
}

pub fn new_assistant(fields: AssistantFields) -> NewAssistant {
    NewAssistant {
        assistant_id: client_id("assistant"),
        fields,
        if_exists: IfExists::Raise,
    }
}

pub fn new_thread(metadata: Value) -> NewThread {
    NewThread::new(client_id("thread"), obj(metadata), IfExists::Raise)
}

pub fn page(limit: i64, offset: i64) -> Page {
    Page { limit, offset }
}

pub fn all() -> Page {
    page(1000, 0)
}

pub fn assistant_search(filter: AssistantFilter) -> AssistantSearch {
    AssistantSearch {
        filter,
        sort_by: AssistantSortBy::CreatedAt,
        sort_order: SortOrder::Asc,
        page: all(),
    }
}

pub fn thread_search(filter: ThreadFilter) -> ThreadSearch {
    ThreadSearch {
        filter,
        sort_by: ThreadSortBy::CreatedAt,
        sort_order: SortOrder::Asc,
        page: all(),
    }
}

/// A user of its own, so that a test's searches see only what it created.
pub fn fresh_user() -> Scope {
    Scope::new(format!("user-{}", Uuid::new_v4().simple()))
}

#[track_caller]
pub fn assert_not_found<T: std::fmt::Debug>(result: StorageResult<T>, what: &str) {
    match result {
        Err(StorageError::NotFound(_)) => {}
        other => panic!("{what}: expected NotFound, got {other:?}"),
    }
}

#[track_caller]
pub fn assert_conflict<T: std::fmt::Debug>(result: StorageResult<T>, what: &str) {
    match result {
        Err(StorageError::Conflict(_)) => {}
        other => panic!("{what}: expected Conflict, got {other:?}"),
    }
}

pub fn ids_of_assistants(items: &[Assistant]) -> Vec<ResourceId> {
    items.iter().map(|a| a.assistant_id).collect()
}

pub fn ids_of_threads(items: &[Thread]) -> Vec<ResourceId> {
    items.iter().map(|t| t.thread_id).collect()
}

/// Sorted copies of `ids`, for comparing sets.
pub fn sorted<T: Ord>(mut ids: Vec<T>) -> Vec<T> {
    ids.sort();
    ids
}
