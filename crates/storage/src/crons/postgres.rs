//! [`CronStore`] on PostgreSQL: claims take due rows with `FOR UPDATE SKIP LOCKED`, so the
//! schedulers of several processes never take the same due time.

use crate::pg_notify::{notify, CRONS};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, QueryBuilder};
use uuid::Uuid;

use super::*;
use crate::postgres::{push_pg_condition, PostgresStorage};

fn push_filter(qb: &mut QueryBuilder<'_, Postgres>, scope: &Scope, filter: &CronFilter) {
    qb.push(" WHERE (user_id = ")
        .push_bind(scope.user_id.clone())
        .push(" OR user_id IS NULL)");
    if let Some(id) = filter.assistant_id {
        qb.push(" AND assistant_id = ").push_bind(id);
    }
    if let Some(id) = filter.thread_id {
        qb.push(" AND thread_id = ").push_bind(id);
    }
    if let Some(enabled) = filter.enabled {
        qb.push(" AND enabled = ").push_bind(enabled);
    }
    if let Some(metadata) = &filter.metadata {
        qb.push(" AND metadata @> ")
            .push_bind(Json(Value::Object(metadata.clone())));
    }
    if let Some(condition) = &filter.condition {
        qb.push(" AND ");
        push_pg_condition(qb, condition);
    }
}

async fn fetch(conn: &mut PgConnection, scope: &Scope, id: Uuid) -> StorageResult<Option<Cron>> {
    let sql = format!(
        "SELECT {CRON_COLUMNS} FROM crons WHERE cron_id = $1 AND (user_id = $2 OR user_id IS NULL)"
    );
    let row: Option<CronRow<Uuid>> = sqlx::query_as(&sql)
        .bind(id)
        .bind(&scope.user_id)
        .fetch_optional(conn)
        .await?;
    row.map(Cron::try_from).transpose()
}

#[async_trait]
impl CronStore for PostgresStorage {
    async fn create_cron(&self, scope: &Scope, new: NewCron) -> StorageResult<Cron> {
        let mut tx = self.pool.begin().await?;
        if let Some(thread_id) = new.thread_id {
            let visible: Option<i32> = sqlx::query_scalar(
                "SELECT 1 FROM threads WHERE thread_id = $1 AND (user_id = $2 OR user_id IS NULL)",
            )
            .bind(thread_id)
            .bind(&scope.user_id)
            .fetch_optional(&mut *tx)
            .await?;
            if visible.is_none() {
                return Err(StorageError::NotFound("thread"));
            }
        }
        let f = &new.fields;
        let now = Utc::now();
        sqlx::query(
            "INSERT INTO crons (cron_id, user_id, assistant_id, thread_id, schedule, timezone, \
             payload, metadata, on_run_completed, end_time, enabled, next_run_date, created_at, \
             updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13)",
        )
        .bind(new.cron_id)
        .bind(&scope.user_id)
        .bind(new.assistant_id)
        .bind(new.thread_id)
        .bind(&f.schedule)
        .bind(&f.timezone)
        .bind(Json(&f.payload))
        .bind(Json(&f.metadata))
        .bind(f.on_run_completed.map(OnRunCompleted::as_str))
        .bind(f.end_time)
        .bind(f.enabled)
        .bind(f.next_run_date)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let cron = fetch(&mut tx, scope, new.cron_id)
            .await?
            .ok_or(StorageError::NotFound("cron"))?;
        // Every process's scheduler sleeps until its earliest due cron: this may be earlier.
        notify(&mut tx, CRONS, [String::new()]).await?;
        tx.commit().await?;
        Ok(cron)
    }

    async fn get_cron(&self, scope: &Scope, id: Uuid) -> StorageResult<Cron> {
        let mut conn = self.pool.acquire().await?;
        fetch(&mut conn, scope, id)
            .await?
            .ok_or(StorageError::NotFound("cron"))
    }

    async fn update_cron(&self, scope: &Scope, id: Uuid, f: CronFields) -> StorageResult<Cron> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            // Disabling drops a firing in flight: the run its scheduler (or one taking over)
            // then tries to create is refused, as the firing is no longer in flight.
            "UPDATE crons SET schedule = $3, timezone = $4, payload = $5, metadata = $6, \
             on_run_completed = $7, end_time = $8, enabled = $9, next_run_date = $10, \
             updated_at = $11, firing_due = CASE WHEN $9 THEN firing_due END, \
             firing_claimed_at = CASE WHEN $9 THEN firing_claimed_at END \
             WHERE cron_id = $1 AND (user_id = $2 OR user_id IS NULL)",
        )
        .bind(id)
        .bind(&scope.user_id)
        .bind(&f.schedule)
        .bind(&f.timezone)
        .bind(Json(&f.payload))
        .bind(Json(&f.metadata))
        .bind(f.on_run_completed.map(OnRunCompleted::as_str))
        .bind(f.end_time)
        .bind(f.enabled)
        .bind(f.next_run_date)
        .bind(Utc::now())
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StorageError::NotFound("cron"));
        }
        let cron = fetch(&mut tx, scope, id)
            .await?
            .ok_or(StorageError::NotFound("cron"))?;
        notify(&mut tx, CRONS, [String::new()]).await?;
        tx.commit().await?;
        Ok(cron)
    }

    async fn delete_cron(&self, scope: &Scope, id: Uuid) -> StorageResult<()> {
        let done = sqlx::query(
            "DELETE FROM crons WHERE cron_id = $1 AND (user_id = $2 OR user_id IS NULL)",
        )
        .bind(id)
        .bind(&scope.user_id)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StorageError::NotFound("cron"));
        }
        Ok(())
    }

    async fn search_crons(&self, scope: &Scope, search: CronSearch) -> StorageResult<Vec<Cron>> {
        let mut qb = QueryBuilder::new(format!("SELECT {CRON_COLUMNS} FROM crons"));
        push_filter(&mut qb, scope, &search.filter);
        let order = search.sort_order.sql();
        qb.push(format!(
            " ORDER BY {} {order}, cron_id {order} LIMIT ",
            search.sort_by.column()
        ))
        .push_bind(search.page.limit)
        .push(" OFFSET ")
        .push_bind(search.page.offset);
        let rows: Vec<CronRow<Uuid>> = qb.build_query_as().fetch_all(&self.pool).await?;
        rows.into_iter().map(Cron::try_from).collect()
    }

    async fn count_crons(&self, scope: &Scope, filter: CronFilter) -> StorageResult<i64> {
        let mut qb = QueryBuilder::new("SELECT COUNT(*) FROM crons");
        push_filter(&mut qb, scope, &filter);
        Ok(qb.build_query_scalar().fetch_one(&self.pool).await?)
    }

    async fn next_cron_due(&self) -> StorageResult<Option<DateTime<Utc>>> {
        let (due, in_flight): (Option<DateTime<Utc>>, Option<DateTime<Utc>>) = sqlx::query_as(
            "SELECT (SELECT MIN(next_run_date) FROM crons WHERE enabled AND firing_due IS NULL \
                     AND (end_time IS NULL OR next_run_date <= end_time)), \
                    (SELECT MIN(firing_claimed_at) FROM crons WHERE firing_due IS NOT NULL)",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(due.into_iter().chain(in_flight.map(firing_stale_at)).min())
    }

    async fn claim_due_crons(
        &self,
        now: DateTime<Utc>,
        limit: i64,
        next: &NextRun,
    ) -> StorageResult<Vec<CronFiring>> {
        let mut tx = self.pool.begin().await?;
        let mut firings = take_over_stale(&mut tx, now, limit).await?;
        let sql = format!(
            "SELECT {CRON_COLUMNS} FROM crons WHERE enabled AND next_run_date <= $1 \
             AND firing_due IS NULL AND (end_time IS NULL OR next_run_date <= end_time) \
             ORDER BY next_run_date LIMIT $2 FOR UPDATE SKIP LOCKED"
        );
        let rows: Vec<CronRow<Uuid>> = sqlx::query_as(&sql)
            .bind(now)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        for row in rows {
            let cron = Cron::try_from(row)?;
            let Some(due) = is_due(&cron, now) else {
                continue;
            };
            sqlx::query(
                "UPDATE crons SET next_run_date = $2, firing_due = $3, firing_claimed_at = $4 \
                 WHERE cron_id = $1",
            )
            .bind(cron.cron_id)
            .bind(next(&cron, now))
            .bind(due)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            firings.push(CronFiring { cron, due });
        }
        tx.commit().await?;
        Ok(firings)
    }

    async fn release_cron_firing(&self, firing: FiringId) -> StorageResult<()> {
        sqlx::query(
            "UPDATE crons SET firing_due = NULL, firing_claimed_at = NULL \
             WHERE cron_id = $1 AND firing_due = $2",
        )
        .bind(firing.cron_id)
        .bind(firing.due)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// Takes over the firings whose scheduler died between claiming them and creating their run
/// (rows another scheduler holds are skipped).
async fn take_over_stale(
    tx: &mut PgConnection,
    now: DateTime<Utc>,
    limit: i64,
) -> StorageResult<Vec<CronFiring>> {
    let stale: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(
        "SELECT cron_id, firing_due FROM crons WHERE firing_due IS NOT NULL \
         AND firing_claimed_at < $1 ORDER BY firing_claimed_at LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind(stale_claims_before(now))
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    let mut firings = Vec::with_capacity(stale.len());
    for (cron_id, due) in stale {
        let sql = format!(
            "UPDATE crons SET firing_claimed_at = $2 WHERE cron_id = $1 RETURNING {CRON_COLUMNS}"
        );
        let row: CronRow<Uuid> = sqlx::query_as(&sql)
            .bind(cron_id)
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
        firings.push(CronFiring {
            cron: Cron::try_from(row)?,
            due,
        });
    }
    Ok(firings)
}
