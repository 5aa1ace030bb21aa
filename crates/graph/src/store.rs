//! The long-term store as nodes see it. The server implements [`Store`] over its database;
//! [`InMemoryStore`] serves tests and graphs run without a server.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use serde_json::{json, Value};

/// Key-value documents under namespaces (LangGraph's `BaseStore`, reduced to what nodes use).
#[async_trait]
pub trait Store: Send + Sync {
    /// The value stored under `namespace`/`key`.
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<Value>, String>;
    /// Store a value; `None` deletes it.
    async fn put(
        &self,
        namespace: &[String],
        key: &str,
        value: Option<Value>,
    ) -> Result<(), String>;
    /// Items under a namespace prefix whose value matches every `filter` field, as
    /// `{namespace, key, value}` objects.
    async fn search(
        &self,
        prefix: &[String],
        filter: Option<&Value>,
        limit: usize,
    ) -> Result<Vec<Value>, String>;
}

/// A store in memory.
#[derive(Debug, Default)]
pub struct InMemoryStore {
    items: Mutex<BTreeMap<(Vec<String>, String), Value>>,
}

#[async_trait]
impl Store for InMemoryStore {
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<Value>, String> {
        let items = self.items.lock().map_err(|e| e.to_string())?;
        Ok(items.get(&(namespace.to_vec(), key.to_string())).cloned())
    }

    async fn put(
        &self,
        namespace: &[String],
        key: &str,
        value: Option<Value>,
    ) -> Result<(), String> {
        let mut items = self.items.lock().map_err(|e| e.to_string())?;
        let k = (namespace.to_vec(), key.to_string());
        match value {
            Some(v) => items.insert(k, v),
            None => items.remove(&k),
        };
        Ok(())
    }

    async fn search(
        &self,
        prefix: &[String],
        filter: Option<&Value>,
        limit: usize,
    ) -> Result<Vec<Value>, String> {
        let items = self.items.lock().map_err(|e| e.to_string())?;
        Ok(items
            .iter()
            .filter(|((ns, _), _)| ns.starts_with(prefix))
            .filter(|(_, v)| match filter.and_then(Value::as_object) {
                Some(f) => f.iter().all(|(k, want)| v.get(k) == Some(want)),
                None => true,
            })
            .take(limit)
            .map(|((ns, key), v)| json!({"namespace": ns, "key": key, "value": v}))
            .collect())
    }
}
