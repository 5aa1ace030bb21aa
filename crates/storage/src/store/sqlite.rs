//! [`ItemStore`] on SQLite. Filters become `json_type`/`json_extract` tests on the value, with
//! paths built from bound labels; a search by meaning ranks in SQLite with sqlite-vec: from
//! the nearest-neighbour index (`sqlite_nearest`) when its answer is provably the exact one,
//! otherwise comparing every matching item with `vec_distance_cosine` (see
//! [`SqliteStorage::search_by_meaning`]).

use std::collections::BTreeSet;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};

use super::sqlite_nearest::{self as nearest, MAX_K};
use super::*;
use crate::json_filter::{push_all, quoted_label};
use crate::sqlite::SqliteStorage;
use crate::StorageError;

/// Up to this many items under a search's prefix, a search by meaning compares them all
/// rather than asking the nearest-neighbour index first: that is as fast (measured in
/// `benches/store_search.rs`) and needs no second query when the index cannot decide.
const SCAN_AT_MOST: i64 = 1_000;
/// How far items are counted to choose between the index and a scan.
const COUNT_AT_MOST: i64 = 100_000;

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
    if !search.filter.is_empty() {
        // Balanced, as a metadata filter's: a chain of 1,000 conditions is too deep for SQLite.
        qb.push(" AND (");
        push_all(qb, &search.filter, &mut push_condition);
        qb.push(")");
    }
}

impl SqliteStorage {
    /// Items ranked by similarity to `query`, best field per item, and the page asked for:
    /// read from the nearest-neighbour index when its answer is provably the exact one,
    /// otherwise ranked by comparing every matching item ([`Self::rank_by_scan`]).
    async fn search_by_meaning(
        &self,
        scope: &Scope,
        search: &ItemSearch,
        query: &[f32],
        now: DateTime<Utc>,
    ) -> StorageResult<Vec<(ItemRow, f64)>> {
        // A query of zeros is as far from everything: every item scores 0 (see `cosine`).
        let comparable = query.iter().any(|x| *x != 0.0) && query.iter().all(|x| x.is_finite());
        if comparable && self.index_is_worth_it(scope, search, query.len()).await? {
            if let Some(page) = self.rank_by_index(scope, search, query, now).await? {
                return Ok(page);
            }
        }
        self.rank_by_scan(scope, search, query, now).await
    }

    /// Whether to ask the index first: for a page it can answer, when comparing the items
    /// under the prefix would take longer than the index's own scan, which in sqlite-vec 0.1
    /// reads every embedding of the user (each at about a third of what comparing an item
    /// costs: see `benches/store_search.rs`).
    async fn index_is_worth_it(
        &self,
        scope: &Scope,
        search: &ItemSearch,
        dims: usize,
    ) -> StorageResult<bool> {
        let need = search.page.offset + search.page.limit;
        if dims == 0 || need <= 0 || need > MAX_K / 4 {
            return Ok(false);
        }
        // Both counted from the primary key, and only so far.
        let count = |prefix: &[String]| {
            let mut qb = QueryBuilder::new(
                "SELECT COUNT(*) FROM (SELECT 1 FROM store_items WHERE user_id = ",
            );
            qb.push_bind(scope.user_id.clone());
            push_under(&mut qb, "namespace", prefix);
            qb.push(" LIMIT ").push_bind(COUNT_AT_MOST).push(")");
            qb
        };
        let under: i64 = count(&search.prefix)
            .build_query_scalar()
            .fetch_one(&self.read)
            .await?;
        if under <= SCAN_AT_MOST {
            return Ok(false);
        }
        let all: i64 = count(&[])
            .build_query_scalar()
            .fetch_one(&self.read)
            .await?;
        if under * 3 <= all {
            return Ok(false);
        }
        self.nearest_index(dims).await
    }

    /// Makes sure the index of `dims`-long embeddings exists; false when it cannot be made
    /// (the search then scans).
    pub(crate) async fn nearest_index(&self, dims: usize) -> StorageResult<bool> {
        if self.nearest.is_ready(dims) {
            return Ok(true);
        }
        if !(1..=nearest::MAX_DIMS).contains(&dims) {
            return Ok(false);
        }
        let made = self
            .writer
            .write(move |conn| nearest::create(conn, dims).map_err(StorageError::from))
            .await;
        match made {
            Ok(()) => {
                self.nearest.mark_ready(dims);
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(dims, error = %e, "cannot make the store's nearest-neighbour index; searches compare every item");
                Ok(false)
            }
        }
    }

    /// The page ranked from the embeddings nearest to `query`, or `None` when they do not
    /// decide it (see [`nearest::decides`]); asks for more neighbours once before giving up.
    async fn rank_by_index(
        &self,
        scope: &Scope,
        search: &ItemSearch,
        query: &[f32],
        now: DateTime<Utc>,
    ) -> StorageResult<Option<Vec<(ItemRow, f64)>>> {
        use sqlx::{FromRow, Row};
        let need = search.page.offset + search.page.limit;
        let query_bytes = vector_bytes(query);
        let mut k = (need * 4).clamp(64, MAX_K);
        loop {
            let Some(neighbours) = self.neighbours(scope, search, &query_bytes, k).await? else {
                return Ok(None);
            };
            let exhausted = (neighbours.len() as i64) < k;
            let worst = neighbours.last().map(|(_, distance)| 1.0 - distance);
            let mut qb = QueryBuilder::new(format!(
                "SELECT {ITEM_COLUMNS}, hits.score AS score FROM (SELECT v.namespace AS ns, \
                 v.key AS k, MAX(1.0 - n.value ->> 1) AS score FROM json_each("
            ));
            qb.push_bind(serde_json::to_string(&neighbours).unwrap_or_default()).push(
                ") n JOIN store_vectors v ON v.id = n.value ->> 0 GROUP BY v.namespace, v.key) \
                 hits JOIN store_items ON store_items.namespace = hits.ns \
                 AND store_items.key = hits.k",
            );
            push_where(&mut qb, scope, search, now);
            qb.push(" ORDER BY score DESC, namespace, key LIMIT ")
                .push_bind(need);
            let rows = qb.build().fetch_all(&self.read).await?;
            let scores = rows
                .iter()
                .map(|row| row.try_get::<f64, _>("score"))
                .collect::<Result<Vec<_>, _>>()?;
            if nearest::decides(&scores, need as usize, worst, exhausted) {
                let page = rows.iter().zip(scores).skip(search.page.offset as usize);
                return page
                    .map(|(row, score)| Ok((ItemRow::from_row(row)?, score)))
                    .collect::<StorageResult<Vec<_>>>()
                    .map(Some);
            }
            if exhausted || k == MAX_K {
                return Ok(None);
            }
            k = MAX_K;
        }
    }

    /// The `k` embeddings of the caller nearest to the query, under the search's prefix
    /// (a range that may hold a few namespaces beside it, which the page's query drops):
    /// `(id, cosine distance)`, nearest first; `None` if a distance is undefined.
    async fn neighbours(
        &self,
        scope: &Scope,
        search: &ItemSearch,
        query: &[u8],
        k: i64,
    ) -> StorageResult<Option<Vec<(i64, f64)>>> {
        let mut qb = QueryBuilder::new(format!(
            "SELECT rowid, distance FROM {} WHERE embedding MATCH ",
            nearest::table(query.len() / 4)
        ));
        qb.push_bind(query.to_vec())
            .push(" AND k = ")
            .push_bind(k)
            .push(" AND user_id = ")
            .push_bind(scope.user_id.clone());
        if !search.prefix.is_empty() {
            let joined = joined(&search.prefix);
            let (_, high) = descendants(&joined);
            qb.push(" AND namespace >= ")
                .push_bind(joined)
                .push(" AND namespace < ")
                .push_bind(high);
        }
        qb.push(" ORDER BY distance");
        let found: Vec<(i64, Option<f64>)> = qb.build_query_as().fetch_all(&self.read).await?;
        Ok(found
            .into_iter()
            .map(|(id, distance)| Some((id, distance?)))
            .collect())
    }

    /// The page of the exact ranking: compares the embeddings of every item that matches the
    /// prefix and filter, in SQLite, so only the page's rows leave the database. Scores are
    /// those of [`cosine`]: an embedding of another length than the query's, or one of
    /// zeros (NaN, which SQLite reads as NULL), scores 0.
    async fn rank_by_scan(
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
        // The first embeddings of a length make its index, which triggers keep current from
        // then on, so that searches find it ready.
        for dims in put
            .vectors
            .iter()
            .map(|v| v.embedding.len())
            .collect::<BTreeSet<_>>()
        {
            self.nearest_index(dims).await?;
        }
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Numbers from a fixed seed (xorshift), so that a failure repeats.
    struct Numbers(u64);

    impl Numbers {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }

        fn vector(&mut self, dims: usize) -> Vec<f32> {
            (0..dims)
                .map(|_| self.below(2001) as f32 / 1000.0 - 1.0)
                .collect()
        }
    }

    const DIMS: usize = 8;
    const NAMESPACES: [&[&str]; 5] = [&["a"], &["a", "b"], &["a-b"], &["c"], &["c", "a"]];

    fn labels(namespace: &[&str]) -> Vec<String> {
        namespace.iter().map(|l| l.to_string()).collect()
    }

    /// Items of two users with one or two embedded fields, among them exact duplicates (ties),
    /// embeddings the index leaves out (zeros, another length), items without embeddings
    /// and expired ones.
    async fn fill(s: &SqliteStorage, numbers: &mut Numbers, keys: std::ops::Range<u64>) {
        let mut made: Vec<Vec<f32>> = Vec::new();
        for n in keys {
            let user = Scope::new(if n % 7 == 0 { "other" } else { "me" });
            let namespace = labels(NAMESPACES[numbers.below(5) as usize]);
            let mut vectors = Vec::new();
            let embedding = match numbers.below(20) {
                0 if !made.is_empty() => made[numbers.below(made.len() as u64) as usize].clone(),
                1 => vec![0.0; DIMS],
                2 => numbers.vector(DIMS + 1),
                _ => numbers.vector(DIMS),
            };
            made.push(embedding.clone());
            if numbers.below(10) != 0 {
                vectors.push(ItemVector {
                    field: "text".into(),
                    embedding,
                });
            }
            if numbers.below(3) == 0 {
                vectors.push(ItemVector {
                    field: "title".into(),
                    embedding: numbers.vector(DIMS),
                });
            }
            let put = PutItem {
                namespace,
                key: format!("k{n}"),
                value: json!({"n": n}),
                ttl_minutes: (numbers.below(25) == 0).then_some(-1.0),
                vectors,
            };
            s.put_item(&user, put).await.unwrap();
        }
    }

    /// Every search the index decides, it decides as the exact ranking; and it decides most.
    async fn check_against_scan(s: &SqliteStorage, numbers: &mut Numbers) -> (usize, usize) {
        let (mut searches, mut decided) = (0, 0);
        let filters = [
            vec![],
            vec![FilterCondition {
                path: vec!["n".into()],
                op: FilterOp::Gt,
                value: json!(700),
            }],
        ];
        for _ in 0..12 {
            let query = numbers.vector(DIMS);
            for prefix in [&[][..], &["a"], &["a", "b"], &["c"]] {
                for filter in &filters {
                    for (limit, offset) in [(10, 0), (5, 20), (60, 0)] {
                        let search = ItemSearch {
                            prefix: labels(prefix),
                            filter: filter.clone(),
                            page: Page { limit, offset },
                            refresh_ttl: false,
                            query: Some(query.clone()),
                        };
                        let now = Utc::now();
                        let me = Scope::new("me");
                        let scan = s.rank_by_scan(&me, &search, &query, now).await.unwrap();
                        let index = s.rank_by_index(&me, &search, &query, now).await.unwrap();
                        searches += 1;
                        let Some(index) = index else { continue };
                        decided += 1;
                        let names = |page: &[(ItemRow, f64)]| -> Vec<(String, String)> {
                            page.iter()
                                .map(|(row, _)| (row.namespace.clone(), row.key.clone()))
                                .collect()
                        };
                        assert_eq!(names(&index), names(&scan), "{search:?}");
                        for ((_, a), (_, b)) in index.iter().zip(&scan) {
                            assert!((a - b).abs() < 1e-6, "{a} vs {b} in {search:?}");
                        }
                    }
                }
            }
        }
        (searches, decided)
    }

    /// A database of the schema before embeddings had an integer key: the migration keeps
    /// every embedding, and the index made afterwards holds them.
    #[tokio::test]
    async fn embeddings_stored_before_the_upgrade_are_searched_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let url = crate::sqlite::database_before(dir.path(), "0010").await;
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        let mut numbers = Numbers(7);
        for n in 0..1_200 {
            let namespace = if n < 1_100 { "old" } else { "other" };
            sqlx::query(
                "INSERT INTO store_items (user_id, namespace, key, value, created_at, updated_at) \
                 VALUES ('me', $1, $2, '{}', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')",
            )
            .bind(namespace)
            .bind(format!("k{n}"))
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO store_vectors (user_id, namespace, key, field, embedding) \
                 VALUES ('me', $1, $2, '$', $3)",
            )
            .bind(namespace)
            .bind(format!("k{n}"))
            .bind(vector_bytes(&numbers.vector(DIMS)))
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;

        let s = SqliteStorage::open(&url).await.unwrap();
        let me = Scope::new("me");
        let query = numbers.vector(DIMS);
        let search = ItemSearch {
            prefix: labels(&["old"]),
            filter: vec![],
            page: Page {
                limit: 10,
                offset: 0,
            },
            refresh_ttl: false,
            query: Some(query.clone()),
        };
        let now = Utc::now();
        let scan = s.rank_by_scan(&me, &search, &query, now).await.unwrap();
        assert_eq!(scan.len(), 10);
        assert!(s.index_is_worth_it(&me, &search, DIMS).await.unwrap());
        let index = s.rank_by_index(&me, &search, &query, now).await.unwrap();
        let keys = |page: &[(ItemRow, f64)]| -> Vec<String> {
            page.iter().map(|(row, _)| row.key.clone()).collect()
        };
        assert_eq!(keys(&index.expect("the index decides")), keys(&scan));
        let indexed: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM store_vec_8")
            .fetch_one(&s.read)
            .await
            .unwrap();
        assert_eq!(indexed, 1_200);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_nearest_neighbour_index_ranks_as_the_exact_scan_does() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("db").display());
        let s = SqliteStorage::open(&url).await.unwrap();
        let mut numbers = Numbers(0x5eed_1234_abcd_0042);
        let me = Scope::new("me");
        // Embeddings stored before their index existed: it is made with them.
        fill(&s, &mut numbers, 0..200).await;
        s.writer
            .write(|conn| -> StorageResult<()> {
                Ok(conn.execute_batch(
                    "DROP TRIGGER store_vec_8_insert; DROP TRIGGER store_vec_8_update; \
                     DROP TRIGGER store_vec_8_delete; DROP TABLE store_vec_8;",
                )?)
            })
            .await
            .unwrap();
        s.nearest.forget();
        fill(&s, &mut numbers, 200..1_500).await;
        let (searches, decided) = check_against_scan(&s, &mut numbers).await;
        assert!(
            decided * 2 > searches,
            "the index decided {decided} of {searches}"
        );
        // The index follows deletes, replacements and the sweep of expired items.
        for n in (0..1_500).step_by(3) {
            for namespace in NAMESPACES {
                let key = format!("k{n}");
                s.delete_item(&me, &labels(namespace), &key).await.unwrap();
            }
        }
        fill(&s, &mut numbers, 1_000..1_300).await;
        s.sweep_expired_items(Utc::now(), 10_000).await.unwrap();
        let (searches, decided) = check_against_scan(&s, &mut numbers).await;
        assert!(
            decided * 2 > searches,
            "the index decided {decided} of {searches}"
        );
        let (indexed, stored): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM store_vec_8), (SELECT COUNT(*) FROM store_vectors \
             WHERE length(embedding) = 32 AND vec_distance_l2(embedding, zeroblob(32)) > 0)",
        )
        .fetch_one(&s.read)
        .await
        .unwrap();
        assert_eq!(indexed, stored);
    }
}
