//! [`ItemStore`] on SQLite. Filters become `json_type`/`json_extract` tests on the value, with
//! paths built from bound labels; a search by meaning ranks in SQLite with sqlite-vec's
//! `vec_distance_cosine` (an exact scan of the matching items' embeddings, see
//! [`SqliteStorage::search_by_meaning`]).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};

use super::*;
use crate::json_filter::quoted_label;
use crate::sqlite::SqliteStorage;
use crate::StorageError;

/// `namespace` is `prefix` or lies under it (nothing when `prefix` is empty).
fn push_under(qb: &mut QueryBuilder<'_, Sqlite>, column: &str, prefix: &[String]) {
    if prefix.is_empty() {
        return;
    }
    let joined = joined(prefix);
    let (low, high) = descendants(&joined);
    // One range of the primary key holds both, which the OR alone would hide from the
    // planner: it would read every item of the user.
    qb.push(format!(" AND {column} >= "))
        .push_bind(joined.clone())
        .push(format!(" AND {column} < "))
        .push_bind(high)
        .push(format!(" AND ({column} = "))
        .push_bind(joined)
        .push(format!(" OR {column} >= "))
        .push_bind(low)
        .push(")");
}

fn push_unexpired(qb: &mut QueryBuilder<'_, Sqlite>, now: DateTime<Utc>) {
    qb.push(" AND (expires_at IS NULL OR expires_at > ")
        .push_bind(now)
        .push(")");
}

/// The JSON path of a filter condition, as a bound SQLite path (`$."a"."b"`).
fn path_of(path: &[String]) -> String {
    std::iter::once("$".to_owned())
        .chain(path.iter().map(|label| quoted_label(label)))
        .collect()
}

/// The value at the condition's path equals its value (false when it is missing).
fn push_equals(qb: &mut QueryBuilder<'_, Sqlite>, path: &str, value: &Value) {
    let typed = |qb: &mut QueryBuilder<'_, Sqlite>, types: &str| {
        qb.push("json_type(value, ")
            .push_bind(path.to_owned())
            .push(format!(") IN ({types})"));
    };
    let extract = |qb: &mut QueryBuilder<'_, Sqlite>| {
        qb.push(" AND json_extract(value, ")
            .push_bind(path.to_owned())
            .push(") = ");
    };
    match value {
        Value::Null => typed(qb, "'null'"),
        Value::Bool(true) => typed(qb, "'true'"),
        Value::Bool(false) => typed(qb, "'false'"),
        Value::Number(n) => {
            typed(qb, "'integer', 'real'");
            extract(qb);
            match n.as_i64() {
                Some(i) => qb.push_bind(i),
                None => qb.push_bind(n.as_f64().unwrap_or(f64::NAN)),
            };
        }
        Value::String(s) => {
            typed(qb, "'text'");
            extract(qb);
            qb.push_bind(s.clone());
        }
        Value::Array(_) | Value::Object(_) => {
            typed(qb, "'array', 'object'");
            extract(qb);
            qb.push("json(").push_bind(value.to_string()).push(")");
        }
    }
}

fn push_condition(qb: &mut QueryBuilder<'_, Sqlite>, condition: &FilterCondition) {
    let path = path_of(&condition.path);
    qb.push(" AND ");
    match condition.op {
        FilterOp::Eq => {
            qb.push("COALESCE((");
            push_equals(qb, &path, &condition.value);
            qb.push("), 0)");
        }
        FilterOp::Ne => {
            qb.push("NOT COALESCE((");
            push_equals(qb, &path, &condition.value);
            qb.push("), 0)");
        }
        op => {
            let types = if condition.value.is_string() {
                "'text'"
            } else {
                "'integer', 'real'"
            };
            qb.push("COALESCE((json_type(value, ")
                .push_bind(path.clone())
                .push(format!(") IN ({types}) AND json_extract(value, "))
                .push_bind(path)
                .push(format!(") {} ", op.sql()));
            match &condition.value {
                Value::String(s) => qb.push_bind(s.clone()),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => qb.push_bind(i),
                    None => qb.push_bind(n.as_f64().unwrap_or(f64::NAN)),
                },
                // Refused by `parse_filter`; matches nothing if it ever came here.
                _ => qb.push_bind(None::<i64>),
            };
            qb.push("), 0)");
        }
    }
}

/// `WHERE` the caller's unexpired items under the search's prefix meet its filter.
fn push_where(
    qb: &mut QueryBuilder<'_, Sqlite>,
    scope: &Scope,
    search: &ItemSearch,
    now: DateTime<Utc>,
) {
    qb.push(" WHERE user_id = ")
        .push_bind(scope.user_id.clone());
    push_under(qb, "namespace", &search.prefix);
    push_unexpired(qb, now);
    for condition in &search.filter {
        push_condition(qb, condition);
    }
}

impl SqliteStorage {
    /// Items ranked by similarity to `query`, best field per item, and the page asked for.
    ///
    /// The ranking runs in SQLite, so only the page's rows leave the database. It compares
    /// the embeddings of the items that match the prefix and filter, as PostgreSQL does: a
    /// nearest-neighbour index (sqlite-vec's `vec0`) would answer before the filters apply
    /// and so return short pages, and in sqlite-vec 0.1 it is itself a full scan. Scores are
    /// those of [`cosine`]: an embedding of another length than the query's, or one of
    /// zeros (NaN, which SQLite reads as NULL), scores 0.
    async fn search_by_meaning(
        &self,
        scope: &Scope,
        search: &ItemSearch,
        query: &[f32],
        now: DateTime<Utc>,
    ) -> StorageResult<Vec<(ItemRow, f64)>> {
        use sqlx::{FromRow, Row};
        let query_bytes = vector_bytes(query);
        // Each item's best field, looked up by the item's key: the items (a range of the
        // primary key under the prefix) drive the query, not the user's embeddings.
        let mut qb = QueryBuilder::new(format!(
            "SELECT {ITEM_COLUMNS}, (SELECT MAX(CASE WHEN length(v.embedding) = "
        ));
        qb.push_bind(query_bytes.len() as i64)
            .push(" THEN COALESCE(1.0 - vec_distance_cosine(v.embedding, ")
            .push_bind(query_bytes)
            .push(
                "), 0.0) ELSE 0.0 END) FROM store_vectors v WHERE v.user_id = store_items.user_id \
                 AND v.namespace = store_items.namespace AND v.key = store_items.key) AS score \
                 FROM store_items",
            );
        push_where(&mut qb, scope, search, now);
        // Items without embeddings (a NULL score) sort last, so dropping them from the page
        // leaves exactly the page of those that have them.
        qb.push(" ORDER BY score DESC, namespace, key LIMIT ")
            .push_bind(search.page.limit)
            .push(" OFFSET ")
            .push_bind(search.page.offset);
        let rows = qb.build().fetch_all(&self.read).await?;
        let mut ranked = Vec::with_capacity(rows.len());
        for row in &rows {
            if let Some(score) = row.try_get::<Option<f64>, _>("score")? {
                ranked.push((ItemRow::from_row(row)?, score));
            }
        }
        Ok(ranked)
    }
}

/// Restarts the TTL of items that have one.
async fn refresh(
    conn: &mut SqliteConnection,
    user_id: &str,
    items: &[(String, String, Option<f64>)],
    now: DateTime<Utc>,
) -> StorageResult<()> {
    for (namespace, key, ttl) in items {
        if ttl.is_none() {
            continue;
        }
        sqlx::query(
            "UPDATE store_items SET expires_at = $4 WHERE user_id = $1 AND namespace = $2 \
             AND key = $3 AND expires_at > $5",
        )
        .bind(user_id)
        .bind(namespace)
        .bind(key)
        .bind(expiry(now, *ttl))
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

#[async_trait]
impl ItemStore for SqliteStorage {
    async fn put_item(&self, scope: &Scope, put: PutItem) -> StorageResult<()> {
        let namespace = joined(&put.namespace);
        let now = Utc::now();
        let (_permit, mut tx) = self.begin_write().await?;
        // An item whose TTL ran out but that was not swept yet is replaced as a new one.
        sqlx::query(
            "INSERT INTO store_items (user_id, namespace, key, value, created_at, updated_at, \
             ttl_minutes, expires_at) VALUES ($1, $2, $3, $4, $5, $5, $6, $7) \
             ON CONFLICT (user_id, namespace, key) DO UPDATE SET value = excluded.value, \
             created_at = CASE WHEN store_items.expires_at <= excluded.updated_at \
                 THEN excluded.created_at ELSE store_items.created_at END, \
             updated_at = excluded.updated_at, ttl_minutes = excluded.ttl_minutes, \
             expires_at = excluded.expires_at",
        )
        .bind(&scope.user_id)
        .bind(&namespace)
        .bind(&put.key)
        .bind(Json(&put.value))
        .bind(now)
        .bind(put.ttl_minutes)
        .bind(expiry(now, put.ttl_minutes))
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM store_vectors WHERE user_id = $1 AND namespace = $2 AND key = $3")
            .bind(&scope.user_id)
            .bind(&namespace)
            .bind(&put.key)
            .execute(&mut *tx)
            .await?;
        for vector in &put.vectors {
            sqlx::query(
                "INSERT INTO store_vectors (user_id, namespace, key, field, embedding) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO UPDATE SET embedding = excluded.embedding",
            )
            .bind(&scope.user_id)
            .bind(&namespace)
            .bind(&put.key)
            .bind(&vector.field)
            .bind(vector_bytes(&vector.embedding))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn get_item(
        &self,
        scope: &Scope,
        namespace: &[String],
        key: &str,
        refresh_ttl: bool,
    ) -> StorageResult<StoreItem> {
        let now = Utc::now();
        let sql = format!(
            "SELECT {ITEM_COLUMNS} FROM store_items WHERE user_id = $1 AND namespace = $2 \
             AND key = $3 AND (expires_at IS NULL OR expires_at > $4)"
        );
        let row: ItemRow = sqlx::query_as(&sql)
            .bind(&scope.user_id)
            .bind(joined(namespace))
            .bind(key)
            .bind(now)
            .fetch_optional(&self.read)
            .await?
            .ok_or(StorageError::NotFound("item"))?;
        if refresh_ttl && row.ttl_minutes.is_some() {
            let items = [(row.namespace.clone(), row.key.clone(), row.ttl_minutes)];
            let (_permit, mut tx) = self.begin_write().await?;
            refresh(&mut tx, &scope.user_id, &items, now).await?;
            tx.commit().await?;
        }
        Ok(row.into_item(None))
    }

    async fn delete_item(
        &self,
        scope: &Scope,
        namespace: &[String],
        key: &str,
    ) -> StorageResult<()> {
        let (_permit, mut tx) = self.begin_write().await?;
        sqlx::query("DELETE FROM store_items WHERE user_id = $1 AND namespace = $2 AND key = $3")
            .bind(&scope.user_id)
            .bind(joined(namespace))
            .bind(key)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn search_items(
        &self,
        scope: &Scope,
        search: ItemSearch,
    ) -> StorageResult<Vec<StoreItem>> {
        let now = Utc::now();
        let ranked: Vec<(ItemRow, Option<f64>)> = match &search.query {
            None => {
                let mut qb = QueryBuilder::new(format!("SELECT {ITEM_COLUMNS} FROM store_items"));
                push_where(&mut qb, scope, &search, now);
                qb.push(" ORDER BY updated_at DESC, namespace, key LIMIT ")
                    .push_bind(search.page.limit)
                    .push(" OFFSET ")
                    .push_bind(search.page.offset);
                let rows: Vec<ItemRow> = qb.build_query_as().fetch_all(&self.read).await?;
                rows.into_iter().map(|row| (row, None)).collect()
            }
            Some(query) => self
                .search_by_meaning(scope, &search, query, now)
                .await?
                .into_iter()
                .map(|(row, score)| (row, Some(score)))
                .collect(),
        };
        if search.refresh_ttl && ranked.iter().any(|(row, _)| row.ttl_minutes.is_some()) {
            let items: Vec<_> = ranked
                .iter()
                .map(|(row, _)| (row.namespace.clone(), row.key.clone(), row.ttl_minutes))
                .collect();
            let (_permit, mut tx) = self.begin_write().await?;
            refresh(&mut tx, &scope.user_id, &items, now).await?;
            tx.commit().await?;
        }
        Ok(ranked
            .into_iter()
            .map(|(row, score)| row.into_item(score))
            .collect())
    }

    async fn list_namespaces(
        &self,
        scope: &Scope,
        search: NamespaceSearch,
    ) -> StorageResult<Vec<Vec<String>>> {
        let mut qb =
            QueryBuilder::new("SELECT DISTINCT namespace FROM store_items WHERE user_id = ");
        qb.push_bind(scope.user_id.clone());
        push_under(&mut qb, "namespace", literal_prefix(&search.prefix));
        push_unexpired(&mut qb, Utc::now());
        let stored: Vec<String> = qb.build_query_scalar().fetch_all(&self.read).await?;
        Ok(super::list_namespaces(stored, &search))
    }

    async fn sweep_expired_items(&self, now: DateTime<Utc>, limit: i64) -> StorageResult<u64> {
        let (_permit, mut tx) = self.begin_write().await?;
        let done = sqlx::query(
            "DELETE FROM store_items WHERE rowid IN (SELECT rowid FROM store_items \
             WHERE expires_at <= $1 LIMIT $2)",
        )
        .bind(now)
        .bind(limit)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }
}
