//! The long-term store: JSON documents under a namespace (a path of labels) and a key, owned
//! by a user, with an optional time to live.
//!
//! A namespace is kept as its labels joined with `.` (labels never hold one), so "everything
//! under a prefix" is a range of that text: the namespace itself, or one that starts with the
//! prefix and a `.`, which sorts between `prefix.` and `prefix/` (`/` follows `.`). Both
//! backends compare that text byte by byte, so the range serves from the primary key.
//!
//! Search filters ([`ItemFilter`]) follow LangGraph's semantics: a plain value matches an equal
//! value, an object of plain keys matches key by key (nested paths), and an object of
//! operators (`$eq`, `$ne`, `$gt`, `$gte`, `$lt`, `$lte`) compares. They are translated to SQL
//! per backend, so `limit` and `offset` page over the matches in the database.

pub(crate) mod postgres;
pub(crate) mod sqlite;
pub(crate) mod sqlite_nearest;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::model::{JsonObject, Page, Scope};
use crate::StorageResult;

/// Items one sweep transaction removes at most.
pub const ITEM_SWEEP_BATCH: i64 = 1000;

/// One stored document.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreItem {
    pub namespace: Vec<String>,
    pub key: String,
    pub value: Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Similarity to the search's query (`None` without one).
    pub score: Option<f64>,
}

/// A text of an item and its embedding, for semantic search.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemVector {
    /// The path of the field the text came from (`$` for the whole value).
    pub field: String,
    pub embedding: Vec<f32>,
}

/// A put: creates the item, or replaces its value (its `created_at` stays).
#[derive(Debug, Clone)]
pub struct PutItem {
    pub namespace: Vec<String>,
    pub key: String,
    pub value: Value,
    /// Minutes the item lives after this put (and after each read that refreshes it).
    pub ttl_minutes: Option<f64>,
    /// The item's embeddings, replacing any it had (empty: not searchable by meaning).
    pub vectors: Vec<ItemVector>,
}

/// What a search of items looks for.
#[derive(Debug, Clone)]
pub struct ItemSearch {
    /// Items whose namespace starts with these labels (all items when empty).
    pub prefix: Vec<String>,
    pub filter: Vec<FilterCondition>,
    pub page: Page,
    /// Extend the TTL of the items returned.
    pub refresh_ttl: bool,
    /// Rank by similarity to this embedding (items without embeddings are left out).
    pub query: Option<Vec<f32>>,
}

/// What a listing of namespaces looks for. `*` in `prefix` or `suffix` matches any label.
#[derive(Debug, Clone)]
pub struct NamespaceSearch {
    pub prefix: Vec<String>,
    pub suffix: Vec<String>,
    /// Namespaces are cut to this many labels (and then listed once each).
    pub max_depth: Option<usize>,
    pub page: Page,
}

/// A comparison of a search filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterOp {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
}

impl FilterOp {
    pub fn parse(op: &str) -> Option<Self> {
        Some(match op {
            "$eq" => FilterOp::Eq,
            "$ne" => FilterOp::Ne,
            "$gt" => FilterOp::Gt,
            "$gte" => FilterOp::Gte,
            "$lt" => FilterOp::Lt,
            "$lte" => FilterOp::Lte,
            _ => return None,
        })
    }

    /// The SQL operator of an ordering comparison.
    fn sql(self) -> &'static str {
        match self {
            FilterOp::Eq => "=",
            FilterOp::Ne => "<>",
            FilterOp::Gt => ">",
            FilterOp::Gte => ">=",
            FilterOp::Lt => "<",
            FilterOp::Lte => "<=",
        }
    }

    fn is_ordering(self) -> bool {
        !matches!(self, FilterOp::Eq | FilterOp::Ne)
    }
}

/// One leaf of a filter: the value at `path` compared with `value`.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterCondition {
    pub path: Vec<String>,
    pub op: FilterOp,
    pub value: Value,
}

/// Why a filter cannot be used, and where in it.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterError {
    pub path: Vec<String>,
    pub message: String,
}

/// The conditions of a search filter, all of which an item must meet.
///
/// `{"a": 1}` is `a = 1`; `{"a": {"b": 1}}` is `a.b = 1`; `{"a": {"$gt": 1, "$lt": 5}}` is two
/// comparisons of `a`. An object mixing operators and plain keys is refused, as is an unknown
/// operator or an ordering comparison with something that is neither a number nor a string.
pub fn parse_filter(filter: &JsonObject) -> Result<Vec<FilterCondition>, FilterError> {
    let mut conditions = Vec::new();
    collect(filter, &mut Vec::new(), &mut conditions)?;
    Ok(conditions)
}

fn collect(
    filter: &JsonObject,
    path: &mut Vec<String>,
    out: &mut Vec<FilterCondition>,
) -> Result<(), FilterError> {
    for (key, value) in filter {
        path.push(key.clone());
        match value {
            Value::Object(inner) if inner.keys().any(|k| k.starts_with('$')) => {
                for (op_name, operand) in inner {
                    let op = FilterOp::parse(op_name).ok_or_else(|| FilterError {
                        path: path.iter().cloned().chain([op_name.clone()]).collect(),
                        message: format!(
                            "unknown operator {op_name:?}: expected $eq, $ne, $gt, $gte, $lt \
                             or $lte (an object mixing operators and keys is not a filter)"
                        ),
                    })?;
                    if op.is_ordering() && !(operand.is_number() || operand.is_string()) {
                        return Err(FilterError {
                            path: path.iter().cloned().chain([op_name.clone()]).collect(),
                            message: "an ordering comparison takes a number or a string".into(),
                        });
                    }
                    out.push(FilterCondition {
                        path: path.clone(),
                        op,
                        value: operand.clone(),
                    });
                }
            }
            Value::Object(inner) if !inner.is_empty() => collect(inner, path, out)?,
            other => out.push(FilterCondition {
                path: path.clone(),
                op: FilterOp::Eq,
                value: other.clone(),
            }),
        }
        path.pop();
    }
    Ok(())
}

/// A namespace as stored: its labels joined with `.`.
pub(crate) fn joined(namespace: &[String]) -> String {
    namespace.join(".")
}

/// A stored namespace back to its labels.
pub(crate) fn split(namespace: &str) -> Vec<String> {
    namespace.split('.').map(str::to_owned).collect()
}

/// The bounds of the namespaces under `prefix` other than itself: `[prefix., prefix/)`.
pub(crate) fn descendants(prefix: &str) -> (String, String) {
    (format!("{prefix}."), format!("{prefix}/"))
}

/// The labels of `prefix` before its first wildcard: what the database can narrow by.
pub(crate) fn literal_prefix(prefix: &[String]) -> &[String] {
    let end = prefix.iter().position(|l| l == "*").unwrap_or(prefix.len());
    &prefix[..end]
}

/// Whether `labels` start with `pattern` (`*` matching any one label).
fn starts_with(labels: &[String], pattern: &[String]) -> bool {
    labels.len() >= pattern.len()
        && labels
            .iter()
            .zip(pattern)
            .all(|(label, want)| want == "*" || label == want)
}

/// The page of namespaces a listing answers, from every distinct stored namespace under the
/// literal part of its prefix: matched against the whole prefix and the suffix, cut to
/// `max_depth`, listed once each, sorted.
pub(crate) fn list_namespaces(stored: Vec<String>, search: &NamespaceSearch) -> Vec<Vec<String>> {
    let mut found: Vec<Vec<String>> = stored
        .iter()
        .map(|ns| split(ns))
        .filter(|labels| starts_with(labels, &search.prefix))
        .filter(|labels| {
            let reversed: Vec<String> = labels.iter().rev().cloned().collect();
            let suffix: Vec<String> = search.suffix.iter().rev().cloned().collect();
            starts_with(&reversed, &suffix)
        })
        .map(|mut labels| {
            if let Some(depth) = search.max_depth {
                labels.truncate(depth);
            }
            labels
        })
        .collect();
    found.sort();
    found.dedup();
    found
        .into_iter()
        .skip(search.page.offset.max(0) as usize)
        .take(search.page.limit.max(0) as usize)
        .collect()
}

/// When an item put or refreshed at `from` with `ttl_minutes` expires.
pub(crate) fn expiry(from: DateTime<Utc>, ttl_minutes: Option<f64>) -> Option<DateTime<Utc>> {
    ttl_minutes.map(|minutes| crate::model::minutes_after(from, minutes))
}

/// Cosine similarity of two embeddings (0 when either is all zeros or their lengths differ).
pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    }
}

/// An embedding as stored on SQLite: little-endian `f32`s, the layout sqlite-vec reads.
pub(crate) fn vector_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
fn vector_from_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// An item as both backends read it.
#[derive(sqlx::FromRow)]
pub(crate) struct ItemRow {
    namespace: String,
    key: String,
    value: sqlx::types::Json<Value>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    ttl_minutes: Option<f64>,
}

/// The columns an item is read with, in [`ItemRow`]'s order.
pub(crate) const ITEM_COLUMNS: &str = "namespace, key, value, created_at, updated_at, ttl_minutes";

impl ItemRow {
    fn into_item(self, score: Option<f64>) -> StoreItem {
        StoreItem {
            namespace: split(&self.namespace),
            key: self.key,
            value: self.value.0,
            created_at: self.created_at,
            updated_at: self.updated_at,
            score,
        }
    }
}

/// Items with their best similarity to `query` (over their fields), most similar first, and
/// the page asked for. Rows come one per (item, field), grouped by item.
pub(crate) fn rank(
    rows: Vec<(ItemRow, Vec<f32>)>,
    query: &[f32],
    page: &Page,
) -> Vec<(ItemRow, f64)> {
    let mut best: Vec<(ItemRow, f64)> = Vec::new();
    for (row, embedding) in rows {
        let score = cosine(query, &embedding);
        match best.last_mut() {
            Some((last, s)) if last.namespace == row.namespace && last.key == row.key => {
                *s = s.max(score);
            }
            _ => best.push((row, score)),
        }
    }
    best.sort_by(|a, b| b.1.total_cmp(&a.1));
    best.into_iter()
        .skip(page.offset.max(0) as usize)
        .take(page.limit.max(0) as usize)
        .collect()
}

/// The long-term store.
#[async_trait::async_trait]
pub trait ItemStore: Send + Sync {
    /// Creates or replaces the caller's item at `put.namespace`/`put.key`, with its embeddings,
    /// in one transaction.
    async fn put_item(&self, scope: &Scope, put: PutItem) -> StorageResult<()>;
    /// The caller's item, unless it expired; `refresh_ttl` restarts its TTL. `NotFound` when
    /// there is none.
    async fn get_item(
        &self,
        scope: &Scope,
        namespace: &[String],
        key: &str,
        refresh_ttl: bool,
    ) -> StorageResult<StoreItem>;
    /// Removes the caller's item; removing an item that does not exist is not an error.
    async fn delete_item(
        &self,
        scope: &Scope,
        namespace: &[String],
        key: &str,
    ) -> StorageResult<()>;
    /// The caller's unexpired items under a prefix that meet the filter: most similar first
    /// when the search has a query, else most recently updated first.
    async fn search_items(
        &self,
        scope: &Scope,
        search: ItemSearch,
    ) -> StorageResult<Vec<StoreItem>>;
    /// The distinct namespaces of the caller's unexpired items, sorted.
    async fn list_namespaces(
        &self,
        scope: &Scope,
        search: NamespaceSearch,
    ) -> StorageResult<Vec<Vec<String>>>;
    /// Removes up to `limit` items of every user whose TTL ran out by `now`; returns how many.
    async fn sweep_expired_items(&self, now: DateTime<Utc>, limit: i64) -> StorageResult<u64>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> JsonObject {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn filters_flatten_to_paths_and_operators() {
        let conditions = parse_filter(&obj(
            json!({"a": 1, "b": {"c": "x", "d": {"$gt": 2, "$ne": 5}}}),
        ))
        .unwrap();
        let summary: Vec<(Vec<String>, FilterOp, Value)> = conditions
            .into_iter()
            .map(|c| (c.path, c.op, c.value))
            .collect();
        assert_eq!(
            summary,
            vec![
                (vec!["a".into()], FilterOp::Eq, json!(1)),
                (vec!["b".into(), "c".into()], FilterOp::Eq, json!("x")),
                (vec!["b".into(), "d".into()], FilterOp::Gt, json!(2)),
                (vec!["b".into(), "d".into()], FilterOp::Ne, json!(5)),
            ]
        );
    }

    #[test]
    fn filters_refuse_unknown_operators_and_odd_comparisons() {
        let err = parse_filter(&obj(json!({"a": {"$in": [1]}}))).unwrap_err();
        assert_eq!(err.path, vec!["a".to_owned(), "$in".to_owned()]);
        let err = parse_filter(&obj(json!({"a": {"$gt": [1]}}))).unwrap_err();
        assert_eq!(err.path, vec!["a".to_owned(), "$gt".to_owned()]);
    }

    #[test]
    fn namespaces_match_prefix_suffix_and_depth() {
        let stored = vec!["a.b.c".into(), "a.b.d".into(), "a.x.c".into(), "b".into()];
        let page = Page {
            limit: 100,
            offset: 0,
        };
        let search = |prefix: &[&str], suffix: &[&str], max_depth| NamespaceSearch {
            prefix: prefix.iter().map(|s| s.to_string()).collect(),
            suffix: suffix.iter().map(|s| s.to_string()).collect(),
            max_depth,
            page: page.clone(),
        };
        let names = |found: Vec<Vec<String>>| -> Vec<String> {
            found.into_iter().map(|l| l.join(".")).collect()
        };
        assert_eq!(
            names(list_namespaces(
                stored.clone(),
                &search(&["a"], &["c"], None)
            )),
            ["a.b.c", "a.x.c"]
        );
        assert_eq!(
            names(list_namespaces(
                stored.clone(),
                &search(&["a", "*", "c"], &[], None)
            )),
            ["a.b.c", "a.x.c"]
        );
        assert_eq!(
            names(list_namespaces(stored.clone(), &search(&[], &[], Some(2)))),
            ["a.b", "a.x", "b"]
        );
        assert_eq!(
            literal_prefix(&["a".into(), "*".into(), "c".into()]).len(),
            1
        );
    }

    #[test]
    fn prefix_bounds_hold_exactly_the_descendants() {
        let (low, high) = descendants("a.b");
        for inside in ["a.b.c", "a.b.", "a.b.zzz"] {
            assert!(inside >= low.as_str() && inside < high.as_str(), "{inside}");
        }
        for outside in ["a.b", "a.bc", "a.b-x", "a.c"] {
            assert!(
                !(outside >= low.as_str() && outside < high.as_str()),
                "{outside}"
            );
        }
    }

    #[test]
    fn vectors_round_trip_and_compare() {
        let v = vec![1.0f32, -2.5, 0.0];
        assert_eq!(vector_from_bytes(&vector_bytes(&v)), v);
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-9);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-9);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }
}
