//! Creations applied as one call of `spindle_create_group` (migration 0015): one round trip, in
//! an implicit transaction of its own when called outside `BEGIN`.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgConnection, Row};
use uuid::Uuid;

use crate::model::JsonObject;
use crate::runs::{ClaimStart, RunRow};
use crate::sqlite_values::json;
use crate::{ResourceId, Run, StorageError, StorageResult, Thread, ThreadStatus};

/// The call, each run made expanded into its row's columns with its place among the runs
/// given and what its claim needs; a single row of NULL runs when none was made.
const CREATE_GROUP: &str = "SELECT g.threads_made, r.*, g.run_places[r.ordinality] AS place, \
         g.last_seqs[r.ordinality] AS last_seq, g.threads_new[r.ordinality] AS thread_is_new \
     FROM spindle_create_group($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
         $15, $16, $17, $18, $19, $20, $21, $22) AS g \
     LEFT JOIN LATERAL ROWS FROM (unnest(g.runs_made)) WITH ORDINALITY AS r ON true";

/// A plain thread's creation: no TTL, no state, an error if the id is taken.
pub(crate) struct ThreadCreation {
    pub(crate) thread_id: ResourceId,
    pub(crate) user_id: String,
    pub(crate) metadata: JsonObject,
    /// Its timestamps, as PostgreSQL keeps them (microseconds).
    pub(crate) now: DateTime<Utc>,
}

impl ThreadCreation {
    /// The thread as its row is once inserted: what it was given and the table's defaults
    /// (migration 0001), so that the call need not send the row back.
    fn thread(&self) -> Thread {
        Thread {
            thread_id: self.thread_id,
            user_id: Some(self.user_id.clone()),
            status: ThreadStatus::Idle,
            metadata: self.metadata.clone(),
            config: JsonObject::new(),
            values: None,
            interrupts: JsonObject::new(),
            error: None,
            created_at: self.now,
            updated_at: self.now,
            state_updated_at: self.now,
            ttl: None,
            expires_at: None,
        }
    }
}

/// A run's creation as the function takes it (`runs::postgres::insert_run` fills it in).
pub(crate) struct RunCreation {
    pub(crate) run_id: Uuid,
    pub(crate) thread_id: ResourceId,
    pub(crate) assistant_id: ResourceId,
    pub(crate) user_id: String,
    pub(crate) status: &'static str,
    /// Its kwargs and metadata, as JSON text.
    pub(crate) kwargs: String,
    pub(crate) metadata: String,
    pub(crate) multitask_strategy: &'static str,
    pub(crate) attempt: i32,
    pub(crate) run_after: DateTime<Utc>,
    pub(crate) now: DateTime<Utc>,
    pub(crate) lease_owner: Option<String>,
    pub(crate) lease_expires_at: Option<DateTime<Utc>>,
    pub(crate) started_at: Option<DateTime<Utc>>,
    /// Its first event's data (JSON text) when it is claimed as it is made.
    pub(crate) start_data: Option<String>,
    /// Whether a transaction already decided it goes in (else only on an idle thread).
    pub(crate) decided: bool,
    /// The assistant as the run was made from it (version, `updated_at`), to check.
    pub(crate) assistant_read: Option<(i64, DateTime<Utc>)>,
}

/// A run the call made, with its claim's start when it was claimed as it was made.
pub(crate) type RunMade = (Run, Option<ClaimStart>);

/// What a call made: the threads that went in, and the runs made by their place in the call.
pub(crate) struct Made {
    threads: HashSet<ResourceId>,
    runs: HashMap<usize, RunMade>,
}

impl Made {
    /// The thread, if it went in (its id was not taken).
    pub(crate) fn thread(&self, creation: &ThreadCreation) -> Option<Thread> {
        self.threads
            .contains(&creation.thread_id)
            .then(|| creation.thread())
    }

    /// The run at `place` among the call's runs, if it was made.
    pub(crate) fn run(&mut self, place: usize) -> Option<RunMade> {
        self.runs.remove(&place)
    }
}

/// Makes `threads` and `runs` in one call on `conn` (all or, on error, none of them).
pub(crate) async fn create(
    conn: &mut PgConnection,
    threads: &[&ThreadCreation],
    runs: &[&RunCreation],
) -> StorageResult<Made> {
    let metadata = threads
        .iter()
        .map(|thread| json(&thread.metadata))
        .collect::<StorageResult<_>>()?;
    let rows = bind(sqlx::query(CREATE_GROUP), threads, metadata, runs)
        .fetch_all(conn)
        .await?;
    let mut made = Made {
        threads: HashSet::new(),
        runs: HashMap::new(),
    };
    if let Some(first) = rows.first() {
        let ids: Option<Vec<ResourceId>> = first.try_get("threads_made")?;
        made.threads.extend(ids.into_iter().flatten());
    }
    for row in &rows {
        let Some(place) = row.try_get::<Option<i32>, _>("place")? else {
            continue;
        };
        let run = Run::try_from(RunRow::<Uuid>::from_row(row)?)?;
        let start = match run.status {
            crate::RunStatus::Running => Some(ClaimStart {
                last_seq: row.try_get("last_seq")?,
                thread_is_new: row.try_get("thread_is_new")?,
            }),
            _ => None,
        };
        let place = usize::try_from(place - 1)
            .map_err(|_| StorageError::Corrupt(format!("a run made at place {place}")))?;
        made.runs.insert(place, (run, start));
    }
    Ok(made)
}

/// Binds the function's parallel arrays: a column each of the threads (their metadata as
/// JSON text), then of the runs.
fn bind<'q>(
    query: crate::postgres::PgQuery<'q>,
    threads: &[&ThreadCreation],
    metadata: Vec<String>,
    runs: &[&RunCreation],
) -> crate::postgres::PgQuery<'q> {
    fn column<T, U>(rows: &[&T], f: impl Fn(&T) -> U) -> Vec<U> {
        rows.iter().map(|row| f(row)).collect()
    }
    query
        .bind(column(threads, |t| t.thread_id))
        .bind(column(threads, |t| t.user_id.clone()))
        .bind(metadata)
        .bind(column(threads, |t| t.now))
        .bind(column(runs, |r| r.run_id))
        .bind(column(runs, |r| r.thread_id))
        .bind(column(runs, |r| r.assistant_id))
        .bind(column(runs, |r| r.user_id.clone()))
        .bind(column(runs, |r| r.status))
        .bind(column(runs, |r| r.kwargs.clone()))
        .bind(column(runs, |r| r.metadata.clone()))
        .bind(column(runs, |r| r.multitask_strategy))
        .bind(column(runs, |r| r.attempt))
        .bind(column(runs, |r| r.run_after))
        .bind(column(runs, |r| r.now))
        .bind(column(runs, |r| r.lease_owner.clone()))
        .bind(column(runs, |r| r.lease_expires_at))
        .bind(column(runs, |r| r.started_at))
        .bind(column(runs, |r| r.start_data.clone()))
        .bind(column(runs, |r| r.decided))
        .bind(column(runs, |r| {
            r.assistant_read.map(|(version, _)| version)
        }))
        .bind(column(runs, |r| r.assistant_read.map(|(_, at)| at)))
}
