//! `store.batch`: a Python graph's `BaseStore` operations on Spindle's store, for the run's
//! user, with the same rules (TTL defaults, the semantic index) as `/store/items`.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use spindle_storage::store::parse_filter;
use spindle_storage::{
    ItemSearch, NamespaceSearch, Page, PutItem, Scope, Storage, StorageError, StoreItem,
};

use super::connection::RemoteError;
use crate::store::StoreConfig;

/// One operation of a batch, as the worker's `SpindleStore` encodes it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreOp {
    Get {
        namespace: Vec<String>,
        key: String,
        #[serde(default)]
        refresh_ttl: Option<bool>,
    },
    Search {
        #[serde(default)]
        namespace_prefix: Vec<String>,
        #[serde(default)]
        filter: Option<Value>,
        #[serde(default)]
        limit: Option<i64>,
        #[serde(default)]
        offset: Option<i64>,
        #[serde(default)]
        query: Option<String>,
        #[serde(default)]
        refresh_ttl: Option<bool>,
    },
    Put {
        namespace: Vec<String>,
        key: String,
        #[serde(default)]
        value: Option<Value>,
        /// `false`: not searchable by meaning; a list of paths: embed those.
        #[serde(default)]
        index: Option<Value>,
        /// Minutes.
        #[serde(default)]
        ttl: Option<f64>,
    },
    ListNamespaces {
        #[serde(default)]
        prefix: Option<Vec<String>>,
        #[serde(default)]
        suffix: Option<Vec<String>>,
        #[serde(default)]
        max_depth: Option<usize>,
        #[serde(default)]
        limit: Option<i64>,
        #[serde(default)]
        offset: Option<i64>,
    },
}

/// Runs the operations in order; a failure fails the batch (LangGraph's stores raise).
pub async fn batch(
    storage: &Arc<dyn Storage>,
    config: &StoreConfig,
    scope: &Scope,
    ops: Vec<StoreOp>,
) -> Result<Vec<Value>, RemoteError> {
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        results.push(apply(storage, config, scope, op).await?);
    }
    Ok(results)
}

async fn apply(
    storage: &Arc<dyn Storage>,
    config: &StoreConfig,
    scope: &Scope,
    op: StoreOp,
) -> Result<Value, RemoteError> {
    match op {
        StoreOp::Get {
            namespace,
            key,
            refresh_ttl,
        } => {
            let refresh = refresh_ttl.unwrap_or(config.refresh_on_read);
            match storage.get_item(scope, &namespace, &key, refresh).await {
                Ok(item) => Ok(item_json(item)),
                Err(StorageError::NotFound(_)) => Ok(Value::Null),
                Err(e) => Err(failed(e)),
            }
        }
        StoreOp::Put {
            namespace,
            key,
            value: None,
            ..
        } => match storage.delete_item(scope, &namespace, &key).await {
            Ok(()) | Err(StorageError::NotFound(_)) => Ok(Value::Null),
            Err(e) => Err(failed(e)),
        },
        StoreOp::Put {
            namespace,
            key,
            value: Some(value),
            index,
            ttl,
        } => {
            let vectors = match (&config.index, &index) {
                (None, _) | (_, Some(Value::Bool(false))) => Vec::new(),
                (Some(embedder), fields) => {
                    let fields: Option<Vec<String>> =
                        fields.as_ref().and_then(Value::as_array).map(|paths| {
                            paths
                                .iter()
                                .filter_map(|p| p.as_str().map(str::to_owned))
                                .collect()
                        });
                    embedder
                        .vectors(&value, fields.as_deref())
                        .await
                        .map_err(|e| RemoteError::internal(format!("cannot embed: {e}")))?
                }
            };
            let put = PutItem {
                namespace,
                key,
                value,
                ttl_minutes: ttl.or(config.default_ttl),
                vectors,
            };
            storage.put_item(scope, put).await.map_err(failed)?;
            Ok(Value::Null)
        }
        StoreOp::Search {
            namespace_prefix,
            filter,
            limit,
            offset,
            query,
            refresh_ttl,
        } => {
            let filter = match filter {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Object(filter)) => parse_filter(&filter).map_err(|e| {
                    RemoteError::bad_request(format!("bad store filter: {}", e.message))
                })?,
                Some(other) => {
                    return Err(RemoteError::bad_request(format!(
                        "a store filter is an object, not {other}"
                    )))
                }
            };
            let query = match (&config.index, query.as_deref()) {
                (Some(embedder), Some(text)) if !text.is_empty() => embedder
                    .embed(&[text.to_owned()])
                    .await
                    .map_err(|e| RemoteError::internal(format!("cannot embed: {e}")))?
                    .pop(),
                _ => None,
            };
            let search = ItemSearch {
                prefix: namespace_prefix,
                filter,
                page: Page {
                    limit: limit.unwrap_or(10),
                    offset: offset.unwrap_or(0),
                },
                refresh_ttl: refresh_ttl.unwrap_or(config.refresh_on_read),
                query,
            };
            let items = storage.search_items(scope, search).await.map_err(failed)?;
            Ok(Value::Array(items.into_iter().map(item_json).collect()))
        }
        StoreOp::ListNamespaces {
            prefix,
            suffix,
            max_depth,
            limit,
            offset,
        } => {
            let search = NamespaceSearch {
                prefix: prefix.unwrap_or_default(),
                suffix: suffix.unwrap_or_default(),
                max_depth,
                page: Page {
                    limit: limit.unwrap_or(100),
                    offset: offset.unwrap_or(0),
                },
            };
            let namespaces = storage
                .list_namespaces(scope, search)
                .await
                .map_err(failed)?;
            Ok(json!(namespaces))
        }
    }
}

fn item_json(item: StoreItem) -> Value {
    let mut out = json!({
        "namespace": item.namespace,
        "key": item.key,
        "value": item.value,
        "created_at": item.created_at.to_rfc3339(),
        "updated_at": item.updated_at.to_rfc3339(),
    });
    if let Some(score) = item.score {
        out["score"] = json!(score);
    }
    out
}

fn failed(error: StorageError) -> RemoteError {
    match error {
        StorageError::Invalid(_) | StorageError::Conflict(_) => {
            RemoteError::bad_request(error.to_string())
        }
        other => RemoteError::internal(other.to_string()),
    }
}
