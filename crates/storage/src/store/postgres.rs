//! [`ItemStore`] on PostgreSQL. Filters become `jsonb` path tests (`value #> path`); a search
//! by meaning ranks in the database with pgvector's `<=>` when the extension is installed (or
//! can be), and in the process otherwise (both exact).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, QueryBuilder};

use super::*;
use crate::postgres::PostgresStorage;
use crate::StorageError;

fn push_under(qb: &mut QueryBuilder<'_, Postgres>, prefix: &[String]) {
    if prefix.is_empty() {
        return;
    }
    let joined = joined(prefix);
    let (low, high) = descendants(&joined);
    qb.push(" AND (namespace = ")
        .push_bind(joined)
        .push(" OR (namespace >= ")
        .push_bind(low)
        .push(" AND namespace < ")
        .push_bind(high)
        .push("))");
}

fn push_unexpired(qb: &mut QueryBuilder<'_, Postgres>, now: DateTime<Utc>) {
    qb.push(" AND (expires_at IS NULL OR expires_at > ")
        .push_bind(now)
        .push(")");
}

fn push_condition(qb: &mut QueryBuilder<'_, Postgres>, condition: &FilterCondition) {
    let path = condition.path.clone();
    qb.push(" AND ");
    match (condition.op, &condition.value) {
        (FilterOp::Eq, value) => {
            qb.push("COALESCE(value #> ")
                .push_bind(path)
                .push(" = ")
                .push_bind(Json(value.clone()))
                .push(", FALSE)");
        }
        (FilterOp::Ne, value) => {
            qb.push("(value #> ")
                .push_bind(path)
                .push(") IS DISTINCT FROM ")
                .push_bind(Json(value.clone()));
        }
        (op, Value::String(s)) => {
            qb.push("COALESCE(jsonb_typeof(value #> ")
                .push_bind(path.clone())
                .push(") = 'string' AND (value #>> ")
                .push_bind(path)
                .push(format!(") COLLATE \"C\" {} ", op.sql()))
                .push_bind(s.clone())
                .push(", FALSE)");
        }
        (op, value) => {
            qb.push("COALESCE(jsonb_typeof(value #> ")
                .push_bind(path.clone())
                .push(") = 'number' AND (value #> ")
                .push_bind(path)
                .push(format!(") {} ", op.sql()))
                .push_bind(Json(value.clone()))
                .push(", FALSE)");
        }
    }
}

/// Restarts the TTL of items that have one.
async fn refresh(
    conn: &mut PgConnection,
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

impl PostgresStorage {
    /// The schema pgvector is installed in, settled once per process: if the database has
    /// the extension available but not installed, it is installed (as LangGraph's
    /// `PostgresStore` does), which needs a role allowed to; if that fails, searches rank in
    /// this process and the log says why.
    async fn pgvector_schema(&self) -> Option<&str> {
        self.pgvector
            .get_or_init(|| async {
                let installed = || {
                    sqlx::query_scalar::<_, String>(
                        "SELECT n.nspname FROM pg_extension e \
                         JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'",
                    )
                    .fetch_optional(&self.pool)
                };
                if let Ok(Some(schema)) = installed().await {
                    return Some(schema);
                }
                let available: Option<i32> = sqlx::query_scalar(
                    "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'",
                )
                .fetch_optional(&self.pool)
                .await
                .ok()
                .flatten();
                if available.is_none() {
                    tracing::info!("pgvector is not installed; the store ranks searches by meaning in this process");
                    return None;
                }
                if let Err(err) = sqlx::query("CREATE EXTENSION IF NOT EXISTS vector")
                    .execute(&self.pool)
                    .await
                {
                    // Another process may have installed it meanwhile; the second look tells.
                    tracing::debug!(error = %err, "CREATE EXTENSION vector failed");
                }
                let schema = installed().await.ok().flatten();
                match &schema {
                    Some(schema) => tracing::info!(%schema, "the store ranks searches by meaning with pgvector"),
                    None => tracing::warn!(
                        "pgvector is available but could not be installed (CREATE EXTENSION vector needs a role allowed to); \
                         the store ranks searches by meaning in this process"
                    ),
                }
                schema
            })
            .await
            .as_deref()
    }

    /// Whether searches by meaning rank in the database with pgvector.
    pub async fn ranks_with_pgvector(&self) -> bool {
        self.pgvector_schema().await.is_some()
    }

    /// Items ranked by similarity to `query`: in the database with pgvector when it is
    /// installed, else in this process. Both are exact and give the same scores: an embedding
    /// of another length than the query's, or one of zeros, scores 0.
    async fn search_by_meaning(
        &self,
        scope: &Scope,
        search: &ItemSearch,
        query: &[f32],
        now: DateTime<Utc>,
    ) -> StorageResult<Vec<(ItemRow, f64)>> {
        use sqlx::{FromRow, Row};
        if let Some(schema) = self.pgvector_schema().await {
            // The best field of each item, then the page. `<=>` is the cosine distance; it is
            // NaN for a zero vector, and an error for vectors of different lengths.
            let vector = format!("\"{}\".vector", schema.replace('"', "\"\""));
            let distance = format!("OPERATOR(\"{}\".<=>)", schema.replace('"', "\"\""));
            let mut qb = QueryBuilder::new(format!(
                "SELECT {ITEM_COLUMNS}, score FROM (SELECT DISTINCT ON (namespace, key) \
                 {ITEM_COLUMNS}, CASE WHEN cardinality(v.embedding) = "
            ));
            qb.push_bind(query.len() as i32)
                .push(format!(
                    " THEN COALESCE(NULLIF(1 - (v.embedding::{vector} {distance} "
                ))
                .push_bind(query.to_vec())
                .push(format!(
                    "::real[]::{vector}), 'NaN'::float8), 0) ELSE 0 END AS score"
                ));
            push_matching(&mut qb, scope, search, now);
            qb.push(" ORDER BY namespace, key, score DESC) best ORDER BY score DESC, namespace, key LIMIT ")
                .push_bind(search.page.limit)
                .push(" OFFSET ")
                .push_bind(search.page.offset);
            let rows = qb.build().fetch_all(&self.pool).await?;
            return rows
                .iter()
                .map(|row| Ok((ItemRow::from_row(row)?, row.try_get::<f64, _>("score")?)))
                .collect::<Result<Vec<_>, sqlx::Error>>()
                .map_err(Into::into);
        }
        let mut qb = QueryBuilder::new(format!("SELECT {ITEM_COLUMNS}, v.embedding"));
        push_matching(&mut qb, scope, search, now);
        qb.push(" ORDER BY namespace, key");
        let rows = qb.build().fetch_all(&self.pool).await?;
        let rows: Vec<(ItemRow, Vec<f32>)> = rows
            .iter()
            .map(|row| Ok((ItemRow::from_row(row)?, row.try_get("embedding")?)))
            .collect::<Result<_, sqlx::Error>>()?;
        Ok(rank(rows, query, &search.page))
    }
}

/// `FROM` the caller's unexpired items with embeddings (one row per field) `WHERE` the
/// search's prefix and filter hold.
fn push_matching(
    qb: &mut QueryBuilder<'_, Postgres>,
    scope: &Scope,
    search: &ItemSearch,
    now: DateTime<Utc>,
) {
    qb.push(" FROM store_items JOIN store_vectors v USING (user_id, namespace, key)");
    push_where(qb, scope, search, now);
}

/// `WHERE` the caller's unexpired items under the search's prefix meet its filter.
fn push_where(
    qb: &mut QueryBuilder<'_, Postgres>,
    scope: &Scope,
    search: &ItemSearch,
    now: DateTime<Utc>,
) {
    qb.push(" WHERE user_id = ")
        .push_bind(scope.user_id.clone());
    push_under(qb, &search.prefix);
    push_unexpired(qb, now);
    for condition in &search.filter {
        push_condition(qb, condition);
    }
}

#[async_trait]
impl ItemStore for PostgresStorage {
    async fn put_item(&self, scope: &Scope, put: PutItem) -> StorageResult<()> {
        let namespace = joined(&put.namespace);
        let now = Utc::now();
        let mut tx = self.pool.begin().await?;
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
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (user_id, namespace, key, field) \
                 DO UPDATE SET embedding = excluded.embedding",
            )
            .bind(&scope.user_id)
            .bind(&namespace)
            .bind(&put.key)
            .bind(&vector.field)
            .bind(&vector.embedding)
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
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StorageError::NotFound("item"))?;
        if refresh_ttl && row.ttl_minutes.is_some() {
            let mut conn = self.pool.acquire().await?;
            let items = [(row.namespace.clone(), row.key.clone(), row.ttl_minutes)];
            refresh(&mut conn, &scope.user_id, &items, now).await?;
        }
        Ok(row.into_item(None))
    }

    async fn delete_item(
        &self,
        scope: &Scope,
        namespace: &[String],
        key: &str,
    ) -> StorageResult<()> {
        sqlx::query("DELETE FROM store_items WHERE user_id = $1 AND namespace = $2 AND key = $3")
            .bind(&scope.user_id)
            .bind(joined(namespace))
            .bind(key)
            .execute(&self.pool)
            .await?;
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
                let rows: Vec<ItemRow> = qb.build_query_as().fetch_all(&self.pool).await?;
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
            let mut tx = self.pool.begin().await?;
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
        push_under(&mut qb, literal_prefix(&search.prefix));
        push_unexpired(&mut qb, Utc::now());
        let stored: Vec<String> = qb.build_query_scalar().fetch_all(&self.pool).await?;
        Ok(super::list_namespaces(stored, &search))
    }

    async fn sweep_expired_items(&self, now: DateTime<Utc>, limit: i64) -> StorageResult<u64> {
        let done = sqlx::query(
            "DELETE FROM store_items WHERE (user_id, namespace, key) IN (SELECT user_id, \
             namespace, key FROM store_items WHERE expires_at <= $1 LIMIT $2 \
             FOR UPDATE SKIP LOCKED)",
        )
        .bind(now)
        .bind(limit)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
