//! The long-term store as a run's nodes reach it (`store_get`, `store_put`, `store_search` in
//! scripts): the same items, rules and index as `/store/items`, for the run's user.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};
use spindle_graph::store::Store;
use spindle_storage::{
    store::parse_filter, ItemSearch, Page, PutItem, Scope, Storage, StorageError, StoreItem,
};

use super::StoreConfig;

/// The store of one user, with the server's TTL defaults and semantic index.
pub struct GraphStore {
    storage: Arc<dyn Storage>,
    config: StoreConfig,
    scope: Scope,
}

impl GraphStore {
    pub fn new(storage: Arc<dyn Storage>, config: StoreConfig, scope: Scope) -> Self {
        Self {
            storage,
            config,
            scope,
        }
    }
}

/// Labels as `/store/items` accepts them: each non-empty and without `.`, which joins them.
fn checked(namespace: &[String]) -> Result<(), String> {
    match namespace
        .iter()
        .find(|label| label.is_empty() || label.contains('.'))
    {
        Some(label) => Err(format!(
            "namespace label {label:?} is not allowed: labels must be non-empty and hold no '.'"
        )),
        None => Ok(()),
    }
}

fn item_json(item: StoreItem) -> Value {
    json!({
        "namespace": item.namespace,
        "key": item.key,
        "value": item.value,
        "created_at": item.created_at,
        "updated_at": item.updated_at,
    })
}

#[async_trait]
impl Store for GraphStore {
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<Value>, String> {
        checked(namespace)?;
        let refresh = self.config.refresh_on_read;
        match self
            .storage
            .get_item(&self.scope, namespace, key, refresh)
            .await
        {
            Ok(item) => Ok(Some(item.value)),
            Err(StorageError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn put(
        &self,
        namespace: &[String],
        key: &str,
        value: Option<Value>,
    ) -> Result<(), String> {
        checked(namespace)?;
        let Some(value) = value else {
            return self
                .storage
                .delete_item(&self.scope, namespace, key)
                .await
                .map_err(|e| e.to_string());
        };
        let vectors = match &self.config.index {
            Some(index) => index
                .vectors(&value, None)
                .await
                .map_err(|e| format!("cannot embed: {e}"))?,
            None => Vec::new(),
        };
        let put = PutItem {
            namespace: namespace.to_vec(),
            key: key.to_owned(),
            value,
            ttl_minutes: self.config.default_ttl,
            vectors,
        };
        self.storage
            .put_item(&self.scope, put)
            .await
            .map_err(|e| e.to_string())
    }

    async fn search(
        &self,
        prefix: &[String],
        filter: Option<&Value>,
        limit: usize,
    ) -> Result<Vec<Value>, String> {
        checked(prefix)?;
        let filter = match filter {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(filter)) => {
                parse_filter(filter).map_err(|e| format!("bad store filter: {}", e.message))?
            }
            Some(other) => return Err(format!("a store filter is an object, not {other}")),
        };
        let search = ItemSearch {
            prefix: prefix.to_vec(),
            filter,
            page: Page {
                limit: i64::try_from(limit).unwrap_or(i64::MAX),
                offset: 0,
            },
            refresh_ttl: self.config.refresh_on_read,
            query: None,
        };
        let items = self
            .storage
            .search_items(&self.scope, search)
            .await
            .map_err(|e| e.to_string())?;
        Ok(items.into_iter().map(item_json).collect())
    }
}
