//! Crons: scheduled runs. A cron keeps its schedule, the run request to make at each due time
//! (`payload`) and its next due time (`next_run_date`, UTC). Schedules are evaluated by the
//! server; storage keeps the rows and hands out due firings.
//!
//! [`CronStore::claim_due_crons`] takes the due crons (PostgreSQL: `FOR UPDATE SKIP LOCKED`,
//! so schedulers of several processes never take the same row; SQLite: the one writer) and
//! moves each one's `next_run_date` past now in the same transaction: a due time is handed out
//! once, and a cron that missed several due times (the server was down) fires once.

pub(crate) mod postgres;
pub(crate) mod sqlite;

use crate::ResourceId;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::model::{JsonObject, Page, Scope, SortOrder};
use crate::{StorageError, StorageResult};

/// What becomes of the thread of a cron without one, after each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRunCompleted {
    Delete,
    Keep,
}

impl OnRunCompleted {
    pub fn as_str(self) -> &'static str {
        match self {
            OnRunCompleted::Delete => "delete",
            OnRunCompleted::Keep => "keep",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Delete, Self::Keep]
            .into_iter()
            .find(|o| o.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Cron {
    pub cron_id: Uuid,
    pub assistant_id: ResourceId,
    /// The thread every run uses; `None`: each run gets a new thread.
    pub thread_id: Option<ResourceId>,
    pub user_id: Option<String>,
    pub fields: CronFields,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What a cron is made of, and what an update replaces.
#[derive(Debug, Clone, PartialEq)]
pub struct CronFields {
    pub schedule: String,
    /// IANA time zone the schedule is read in; `None`: UTC.
    pub timezone: Option<String>,
    /// The run request made at each due time.
    pub payload: JsonObject,
    pub metadata: JsonObject,
    pub on_run_completed: Option<OnRunCompleted>,
    /// No run is due after this.
    pub end_time: Option<DateTime<Utc>>,
    pub enabled: bool,
    /// The next due time.
    pub next_run_date: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone)]
pub struct NewCron {
    pub cron_id: Uuid,
    pub assistant_id: ResourceId,
    pub thread_id: Option<ResourceId>,
    pub fields: CronFields,
}

#[derive(Debug, Clone, Default)]
pub struct CronFilter {
    pub assistant_id: Option<ResourceId>,
    pub thread_id: Option<ResourceId>,
    pub enabled: Option<bool>,
    /// Containment: every key/value given must be in the cron's metadata.
    pub metadata: Option<JsonObject>,
    /// A further condition on the metadata (a custom-auth handler's filter).
    pub condition: Option<crate::MetadataCondition>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CronSortBy {
    CronId,
    AssistantId,
    ThreadId,
    #[default]
    CreatedAt,
    UpdatedAt,
    NextRunDate,
    EndTime,
}

impl CronSortBy {
    pub fn column(self) -> &'static str {
        match self {
            CronSortBy::CronId => "cron_id",
            CronSortBy::AssistantId => "assistant_id",
            CronSortBy::ThreadId => "thread_id",
            CronSortBy::CreatedAt => "created_at",
            CronSortBy::UpdatedAt => "updated_at",
            CronSortBy::NextRunDate => "next_run_date",
            CronSortBy::EndTime => "end_time",
        }
    }
}

#[derive(Debug, Clone)]
pub struct CronSearch {
    pub filter: CronFilter,
    pub sort_by: CronSortBy,
    pub sort_order: SortOrder,
    pub page: Page,
}

/// A due time handed to the scheduler: the cron as it was when claimed, and the due time.
#[derive(Debug, Clone)]
pub struct CronFiring {
    pub cron: Cron,
    pub due: DateTime<Utc>,
}

impl CronFiring {
    /// What the firing's run is created with ([`crate::NewRun::cron_firing`]).
    pub fn id(&self) -> FiringId {
        FiringId {
            cron_id: self.cron.cron_id,
            due: self.due,
        }
    }
}

/// One due time of one cron. A claimed firing stays in flight (`crons.firing_due`) until the
/// transaction that creates its run clears it, so it is made once even if its scheduler dies
/// in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FiringId {
    pub cron_id: Uuid,
    pub due: DateTime<Utc>,
}

/// How long a claimed firing may stay in flight before another scheduler takes it over: its
/// own scheduler died between the claim and the run's creation.
pub const FIRING_LEASE: std::time::Duration = std::time::Duration::from_secs(30);

/// The refusal of a run for a firing that is no longer in flight (another scheduler made it).
pub(crate) fn firing_made(firing: &FiringId) -> crate::StorageError {
    crate::StorageError::Conflict(format!(
        "the firing of cron {} due {} was already made",
        firing.cron_id, firing.due
    ))
}

/// [`FIRING_LEASE`] as a span of calendar time.
fn firing_lease() -> chrono::Duration {
    chrono::Duration::from_std(FIRING_LEASE).unwrap_or_default()
}

/// When a firing claimed at `claimed_at` may be taken over.
pub(crate) fn firing_stale_at(claimed_at: DateTime<Utc>) -> DateTime<Utc> {
    claimed_at + firing_lease()
}

/// Claimed before this, a firing still in flight is taken over.
pub(crate) fn stale_claims_before(now: DateTime<Utc>) -> DateTime<Utc> {
    now - firing_lease()
}

/// The due time of a cron after `after`, by its schedule; `None` when it has none.
pub type NextRun = dyn Fn(&Cron, DateTime<Utc>) -> Option<DateTime<Utc>> + Send + Sync;

/// Crons and their firings.
#[async_trait::async_trait]
pub trait CronStore: Send + Sync {
    /// Stores a cron owned by the caller. A `thread_id` the caller cannot see is `NotFound`.
    async fn create_cron(&self, scope: &Scope, new: NewCron) -> StorageResult<Cron>;
    async fn get_cron(&self, scope: &Scope, id: Uuid) -> StorageResult<Cron>;
    /// Replaces the cron's fields.
    async fn update_cron(&self, scope: &Scope, id: Uuid, fields: CronFields)
        -> StorageResult<Cron>;
    async fn delete_cron(&self, scope: &Scope, id: Uuid) -> StorageResult<()>;
    async fn search_crons(&self, scope: &Scope, search: CronSearch) -> StorageResult<Vec<Cron>>;
    async fn count_crons(&self, scope: &Scope, filter: CronFilter) -> StorageResult<i64>;
    /// The earliest due time of any enabled cron of any user, or the time a firing in flight
    /// may be taken over (what a scheduler sleeps until).
    async fn next_cron_due(&self) -> StorageResult<Option<DateTime<Utc>>>;
    /// In one transaction: takes the firings in flight for longer than [`FIRING_LEASE`], and
    /// up to `limit` enabled crons of every user that are due at `now`, not past their
    /// `end_time` and with no firing in flight; sets each one's `next_run_date` to
    /// `next(cron, now)` and marks its firing in flight. Crons another scheduler holds at this
    /// moment are skipped. A firing stays in flight until its run is created
    /// ([`crate::NewRun::cron_firing`]) or it is released.
    async fn claim_due_crons(
        &self,
        now: DateTime<Utc>,
        limit: i64,
        next: &NextRun,
    ) -> StorageResult<Vec<CronFiring>>;
    /// Ends a firing in flight that will make no run (its run request was refused).
    async fn release_cron_firing(&self, firing: FiringId) -> StorageResult<()>;
}

/// The columns a cron is read with, in [`CronRow`]'s order.
const CRON_COLUMNS: &str = "cron_id, assistant_id, thread_id, user_id, schedule, timezone, \
     payload, metadata, on_run_completed, end_time, enabled, next_run_date, created_at, updated_at";

#[derive(sqlx::FromRow)]
struct CronRow<Id> {
    cron_id: Id,
    assistant_id: ResourceId,
    thread_id: Option<ResourceId>,
    user_id: Option<String>,
    schedule: String,
    timezone: Option<String>,
    payload: sqlx::types::Json<JsonObject>,
    metadata: sqlx::types::Json<JsonObject>,
    on_run_completed: Option<String>,
    end_time: Option<DateTime<Utc>>,
    enabled: bool,
    next_run_date: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl<Id: crate::rows::IntoUuid> TryFrom<CronRow<Id>> for Cron {
    type Error = StorageError;

    fn try_from(row: CronRow<Id>) -> StorageResult<Self> {
        let on_run_completed =
            match row.on_run_completed.as_deref() {
                None => None,
                Some(s) => Some(OnRunCompleted::parse(s).ok_or_else(|| {
                    StorageError::Corrupt(format!("unknown on_run_completed {s:?}"))
                })?),
            };
        Ok(Cron {
            cron_id: row.cron_id.into_uuid(),
            assistant_id: row.assistant_id,
            thread_id: row.thread_id,
            user_id: row.user_id,
            fields: CronFields {
                schedule: row.schedule,
                timezone: row.timezone,
                payload: row.payload.0,
                metadata: row.metadata.0,
                on_run_completed,
                end_time: row.end_time,
                enabled: row.enabled,
                next_run_date: row.next_run_date,
            },
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

/// Whether a claimed cron is due at `now` (the claim's query says so too; this keeps the
/// rule in one readable place for both backends).
fn is_due(cron: &Cron, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let f = &cron.fields;
    let due = f.next_run_date.filter(|due| *due <= now)?;
    (f.enabled && f.end_time.is_none_or(|end| due <= end)).then_some(due)
}
