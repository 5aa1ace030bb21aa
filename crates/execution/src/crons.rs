//! Crons: schedules and the scheduler that fires them.
//!
//! A schedule is a standard 5-field cron expression, or 6 fields with seconds first, read in
//! the cron's IANA time zone (UTC when it has none) with croner and chrono-tz, so daylight
//! saving changes move the due times as a local clock would. Due times are kept in UTC.
//!
//! The scheduler of each process sleeps until the earliest due time (at most
//! [`POLL`], so crons made by other processes are seen), then claims the due crons: storage
//! moves each one's next due time past now in the claiming transaction (PostgreSQL skips
//! rows another process holds), so a due time fires once, and a cron that missed several while
//! no server ran fires once for the whole window. What a firing does is the [`FireCron`] the
//! scheduler is given: the server creates the run through the same path as
//! `POST /threads/{id}/runs` (or `POST /runs` for a cron without a thread), as a cron's payload
//! is a run request of its API.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use croner::parser::{CronParser, Seconds, Year};
use spindle_storage::{Cron, CronFiring, OnRunCompleted, ResourceId, Storage};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::metrics::Metrics;
use crate::start::Stateless;

/// The longest a scheduler sleeps without looking for due crons.
pub const POLL: Duration = Duration::from_secs(1);
/// Crons one claim takes at most.
const BATCH: i64 = 100;

/// A parsed schedule and the time zone it is read in.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: croner::Cron,
    tz: chrono_tz::Tz,
}

/// Why a schedule or time zone is refused (the field, and the message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleError {
    pub field: &'static str,
    pub message: String,
}

impl Schedule {
    pub fn parse(expression: &str, timezone: Option<&str>) -> Result<Self, ScheduleError> {
        let tz = match timezone {
            None => chrono_tz::UTC,
            Some(name) => name.parse::<chrono_tz::Tz>().map_err(|_| ScheduleError {
                field: "timezone",
                message: format!(
                    "Unknown time zone {name:?}: expected an IANA name such as America/New_York"
                ),
            })?,
        };
        let fields = expression.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(ScheduleError {
                field: "schedule",
                message: format!(
                    "A schedule has 5 fields (minute hour day-of-month month day-of-week), or 6 \
                     with seconds first; {expression:?} has {fields}"
                ),
            });
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expression)
            .map_err(|e| ScheduleError {
                field: "schedule",
                message: format!("Invalid cron schedule {expression:?}: {e}"),
            })?;
        Ok(Self { cron, tz })
    }

    /// The first due time strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&after.with_timezone(&self.tz), false)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    }
}

/// A cron's next due time after `after`, from its stored schedule.
pub fn next_run(cron: &Cron, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let f = &cron.fields;
    match Schedule::parse(&f.schedule, f.timezone.as_deref()) {
        Ok(schedule) => schedule.next_after(after),
        Err(err) => {
            tracing::warn!(cron_id = %cron.cron_id, error = %err.message, "a stored cron has an invalid schedule; it will not fire again");
            None
        }
    }
}

/// Wakes this process's scheduler when a cron is created or changed here.
#[derive(Default)]
pub struct Scheduler {
    wake: Notify,
    /// Whether crons changed by other processes are announced ([`crate::wakeups`]): the
    /// scheduler then sleeps until the earliest due time instead of looking every [`POLL`].
    announced: std::sync::atomic::AtomicBool,
}

impl Scheduler {
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    pub fn set_announced(&self) {
        self.announced
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn announced(&self) -> bool {
        self.announced.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The longest sleep between two looks at the crons.
    fn longest_wait(&self) -> Duration {
        if self.announced() {
            // Only a firing whose scheduler died (taken over after its lease) is not
            // announced.
            FIRING_LEASE_CHECK
        } else {
            POLL
        }
    }
}

/// How often an announced scheduler looks anyway: a firing claimed by a scheduler that died
/// before making its run is announced by nobody (a cheap read, every few seconds).
const FIRING_LEASE_CHECK: Duration = Duration::from_secs(5);

/// What a due cron does: creates its run, and answers the run's id or why there is none.
#[async_trait::async_trait]
pub trait FireCron: Send + Sync {
    async fn fire(&self, firing: &CronFiring) -> Result<Uuid, String>;
}

/// Fires due crons until `shutdown`; `scheduler` wakes it when a cron changes here. Each
/// firing is counted in `metrics`.
pub async fn run_scheduler(
    storage: Arc<dyn Storage>,
    scheduler: Arc<Scheduler>,
    firer: Arc<dyn FireCron>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        let wait = match storage.next_cron_due().await {
            Ok(Some(due)) if due <= Utc::now() => {
                fire_due(storage.as_ref(), firer.as_ref(), &metrics).await;
                continue;
            }
            Ok(Some(due)) => Some(
                (due - Utc::now())
                    .to_std()
                    .unwrap_or_default()
                    .min(scheduler.longest_wait()),
            ),
            // No cron at all: where crons are announced, nothing can come due unannounced.
            Ok(None) if scheduler.announced() => None,
            Ok(None) => Some(scheduler.longest_wait()),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read when crons are due; retrying");
                Some(POLL)
            }
        };
        tokio::select! {
            () = crate::sleep_or_forever(wait) => {}
            () = scheduler.wake.notified() => {}
            () = shutdown.cancelled() => {}
        }
    }
}

/// Claims the due crons and creates their runs.
async fn fire_due(storage: &dyn Storage, firer: &dyn FireCron, metrics: &Metrics) {
    let firings = match storage.claim_due_crons(Utc::now(), BATCH, &next_run).await {
        Ok(firings) => firings,
        Err(err) => {
            tracing::warn!(error = %err, "cannot claim due crons; retrying");
            tokio::time::sleep(POLL).await;
            return;
        }
    };
    for firing in firings {
        let (cron_id, due) = (firing.cron.cron_id, firing.due);
        let fired = firer.fire(&firing).await;
        metrics.cron_fired(fired.is_ok());
        match fired {
            Ok(run_id) => tracing::info!(%cron_id, %due, %run_id, "cron fired"),
            Err(message) => {
                // Also when the firing is no longer in flight: the cron was disabled meanwhile,
                // or another scheduler made it (this one was thought dead). Then the release
                // finds nothing in flight and changes nothing.
                tracing::warn!(%cron_id, %due, error = %message, "cron firing created no run");
                if let Err(err) = storage.release_cron_firing(firing.id()).await {
                    // Taken over after FIRING_LEASE, and most likely refused again.
                    tracing::warn!(%cron_id, %due, error = %err, "cannot release the cron firing");
                }
            }
        }
    }
}

/// Where a cron's run goes: the cron's thread, or a new thread that the worker removes after
/// the run (`on_run_completed: delete`, the default) or keeps.
pub fn firing_thread(cron: &Cron) -> (ResourceId, Stateless) {
    match cron.thread_id {
        Some(thread_id) => (thread_id, Stateless::No),
        None => match cron.fields.on_run_completed {
            Some(OnRunCompleted::Keep) => (ResourceId::generate(), Stateless::Keep),
            _ => (ResourceId::generate(), Stateless::DeleteByWorker),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn five_and_six_fields() {
        let every_minute = Schedule::parse("* * * * *", None).unwrap();
        assert_eq!(
            every_minute.next_after(utc("2025-01-01T00:00:30Z")),
            Some(utc("2025-01-01T00:01:00Z"))
        );
        let every_two_seconds = Schedule::parse("*/2 * * * * *", None).unwrap();
        assert_eq!(
            every_two_seconds.next_after(utc("2025-01-01T00:00:01Z")),
            Some(utc("2025-01-01T00:00:02Z"))
        );
        for bad in [
            "",
            "* * * *",
            "* * * * * * *",
            "61 * * * *",
            "not a cron at all",
        ] {
            assert_eq!(
                Schedule::parse(bad, None).unwrap_err().field,
                "schedule",
                "{bad:?}"
            );
        }
        assert_eq!(
            Schedule::parse("* * * * *", Some("Mars/Olympus"))
                .unwrap_err()
                .field,
            "timezone"
        );
    }

    #[test]
    fn time_zones_follow_daylight_saving() {
        // 09:00 in New York is 14:00 UTC in winter and 13:00 UTC in summer; DST began on
        // 2025-03-09.
        let nine = Schedule::parse("0 9 * * *", Some("America/New_York")).unwrap();
        assert_eq!(
            nine.next_after(utc("2025-03-08T12:00:00Z")),
            Some(utc("2025-03-08T14:00:00Z"))
        );
        assert_eq!(
            nine.next_after(utc("2025-03-09T12:00:00Z")),
            Some(utc("2025-03-09T13:00:00Z"))
        );
        // 02:30 does not exist on the day clocks jump from 02:00 to 03:00: that day's run is
        // not at a made-up time, and the next day's is at 02:30 local (06:30 UTC).
        let half_two = Schedule::parse("30 2 * * *", Some("America/New_York")).unwrap();
        let next = half_two.next_after(utc("2025-03-09T05:00:00Z")).unwrap();
        let local = next.with_timezone(&chrono_tz::America::New_York);
        assert!(
            next == utc("2025-03-10T06:30:00Z") || local.format("%H").to_string() == "03",
            "{next}"
        );
    }
}
