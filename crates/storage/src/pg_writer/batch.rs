//! A writer's group applied as one call of `spindle_write_group` (migration 0014): one round
//! trip, in an implicit transaction of its own, where its statements one by one took eight.

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use sqlx::postgres::PgRow;
use sqlx::{Connection, FromRow, PgConnection, Row};

use super::{EndWrite, Job, Write, Written};
use crate::checkpoints::{
    as_storage_error, CheckpointArrays, PendingWriteArrays, Put, Save, WritesOf,
};
use crate::postgres::PgQuery;
use crate::runs::{EndArrays, EndOf, EndPrepared, EventArrays, RunRow};
use crate::{LoggedEvent, ResourceId, Run, StorageError, StorageResult};

/// The call, each ended run's row expanded into its columns, with its end event's seq.
const WRITE_GROUP: &str = "SELECT r.*, g.ended_seqs[r.ordinality] AS ended_seq \
     FROM spindle_write_group($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
         $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, \
         $33, $34, $35, $36, $37, $38, $39, $40, $41, $42, $43, $44, $45, $46, $47, $48) AS g, \
     ROWS FROM (unnest(g.ended_runs)) WITH ORDINALITY AS r";

/// A group's writes as one call: every event, the checkpoints and pending writes in rounds,
/// then the ends. This equals applying them in order, given the conditions [`Batch::of`]
/// checks. A group of several rounds is a call per round in one explicit transaction.
pub(super) struct Batch<'a> {
    events: Vec<&'a LoggedEvent>,
    rounds: Vec<Round<'a>>,
    /// The ends, in group order, and each one's place in the group.
    ends: Vec<EndOf<'a>>,
    end_places: Vec<usize>,
    /// How many writes the group holds.
    writes: usize,
}

/// Saves no two of which touch the same checkpoint in a way that their order would tell.
#[derive(Default)]
struct Round<'a> {
    checkpoints: Vec<Put<'a>>,
    writes: Vec<WritesOf<'a>>,
    /// The checkpoints (thread, namespace, id) this round saves.
    saved: HashSet<Key<'a>>,
    /// The checkpoints this round saves pending writes of.
    written: HashSet<Key<'a>>,
}

/// A checkpoint: thread, namespace, id.
type Key<'a> = (&'a str, &'a str, &'a str);

/// A batch's answers, and each thread's last seq.
pub(super) type Applied = (Vec<StorageResult<Written>>, HashMap<ResourceId, i64>);

impl<'a> Batch<'a> {
    /// The group as a batch; `None` when a thread's end comes before another write of that
    /// thread (its events and saves would then go in before the end, out of order).
    pub(super) fn of(group: &'a [Job]) -> Option<Self> {
        let mut batch = Batch {
            events: Vec::new(),
            rounds: vec![Round::default()],
            ends: Vec::new(),
            end_places: Vec::new(),
            writes: group.len(),
        };
        let mut ended: HashSet<&str> = HashSet::new();
        for (place, job) in group.iter().enumerate() {
            if ended.contains(job.thread.as_str()) {
                return None;
            }
            match &job.write {
                Write::Save(save) => {
                    batch.events.extend(&save.events);
                    batch.add_save(Save::of(&save.write));
                }
                Write::Events(events) => batch.events.extend(events),
                Write::End(end) => {
                    batch.events.extend(&end.end.events);
                    let checkpoint_saved = end.end.after_checkpoint.as_deref().is_some_and(|id| {
                        let key = (job.thread.as_str(), "", id);
                        batch.rounds.iter().any(|round| round.saved.contains(&key))
                    });
                    let prepared = EndPrepared {
                        events_logged: true,
                        checkpoint_saved,
                    };
                    batch.ends.push(end_of(end, prepared));
                    batch.end_places.push(place);
                    ended.insert(job.thread.as_str());
                }
            }
        }
        Some(batch)
    }

    /// Adds a save to the last round, or to a new one where the round's statements (its
    /// checkpoints first, then its pending writes) would not do what saving one after the
    /// other does: a checkpoint saved again (it drops its earlier writes, which may be this
    /// round's), or a task's special write replacing its earlier one of this round.
    fn add_save(&mut self, save: Save<'a>) {
        let key = save.key();
        let last = self.rounds.last().expect("a batch has a round");
        let apart = match &save {
            Save::Checkpoint(_) => last.saved.contains(&key) || last.written.contains(&key),
            Save::Writes(of) => {
                of.writes.iter().any(|w| w.channel.starts_with("__")) && last.written.contains(&key)
            }
        };
        if apart {
            self.rounds.push(Round::default());
        }
        let round = self.rounds.last_mut().expect("a batch has a round");
        match save {
            Save::Checkpoint(put) => {
                round.saved.insert(key);
                round.checkpoints.push(put);
            }
            Save::Writes(of) => {
                round.written.insert(key);
                round.writes.push(of);
            }
        }
    }

    /// Applies the batch and commits it, or fails having applied none of it. Once it is
    /// committed nothing fails the batch, for the writer would apply its writes again: an end
    /// whose row is not read back fails alone (its run did end).
    pub(super) async fn apply(self, conn: &mut PgConnection) -> StorageResult<Applied> {
        let rows = self.commit(conn).await?;
        Ok(self.answers(&rows))
    }

    /// Runs the calls and commits them; answers the ended runs' rows.
    async fn commit(&self, conn: &mut PgConnection) -> StorageResult<Vec<PgRow>> {
        let mut calls = self.calls()?;
        if calls.len() == 1 {
            let call = calls.pop().expect("one call");
            return Ok(call.fetch_all(&mut *conn).await?);
        }
        let mut tx = conn.begin().await?;
        let mut rows = Vec::new();
        for call in calls {
            // Only the last call, which holds the ends, answers rows.
            rows = call.fetch_all(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(rows)
    }

    /// The writes' answers and each thread's last seq, from the committed batch.
    fn answers(self, rows: &[PgRow]) -> Applied {
        let mut ended = HashMap::with_capacity(rows.len());
        let mut unread = None;
        for row in rows {
            match ended_run(row) {
                Ok((run, end_seq)) => {
                    ended.insert(run.run_id, (run, end_seq));
                }
                Err(error) => unread = Some(error.to_string()),
            }
        }
        // An event's seq is its thread's counter once the events' statement moved it; an end
        // event, logged after the thread's other events of the batch, is its last.
        let mut last_seqs: HashMap<ResourceId, i64> = HashMap::new();
        for event in &self.events {
            let last = last_seqs.entry(event.thread_id).or_default();
            *last = (*last).max(event.seq);
        }
        let mut answers: Vec<StorageResult<Written>> =
            (0..self.writes).map(|_| Ok(Written::Done)).collect();
        for (place, end) in self.end_places.iter().zip(&self.ends) {
            answers[*place] = match ended.remove(&end.run_id) {
                Some((run, end_seq)) => {
                    last_seqs.insert(run.thread_id, end_seq);
                    Ok(Written::Ended(Some(Box::new(run))))
                }
                None => Err(StorageError::Commit(format!(
                    "run {} ended, but its row was not read back: {}",
                    end.run_id,
                    unread.as_deref().unwrap_or("not answered")
                ))),
            };
        }
        (answers, last_seqs)
    }

    /// The function's calls: one per round, the events with the first, the ends with the
    /// last.
    fn calls(&self) -> StorageResult<Vec<PgQuery<'_>>> {
        let last = self.rounds.len() - 1;
        let mut calls = Vec::with_capacity(self.rounds.len());
        for (n, round) in self.rounds.iter().enumerate() {
            let events = match n {
                0 => EventArrays::of(&self.events),
                _ => EventArrays::default(),
            };
            let ends = match n == last {
                true => EndArrays::of(&self.ends),
                false => EndArrays::default(),
            };
            let checkpoints = CheckpointArrays::of(&round.checkpoints).map_err(as_storage_error)?;
            let writes = PendingWriteArrays::of(&round.writes).map_err(as_storage_error)?;
            let call = events.bind(sqlx::query(WRITE_GROUP));
            let call = writes.bind(checkpoints.bind(call));
            calls.push(ends.bind(call, Utc::now()));
        }
        Ok(calls)
    }
}

/// An ended run's row as the call answers it, with its end event's seq.
fn ended_run(row: &PgRow) -> StorageResult<(Run, i64)> {
    let run = Run::try_from(RunRow::<uuid::Uuid>::from_row(row)?)?;
    Ok((run, row.try_get("ended_seq")?))
}

fn end_of(write: &EndWrite, prepared: EndPrepared) -> EndOf<'_> {
    EndOf {
        thread_id: write.thread_id,
        run_id: write.run_id,
        worker_id: &write.worker_id,
        end: &write.end,
        prepared,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use tokio::sync::oneshot;

    use super::*;
    use crate::test_util::{new_run, postgres_url, TestDatabase, TestDb};
    use crate::{
        CancelAction, IfExists, JsonObject, NewThread, RunEnd, RunStatus, Scope, ThreadStatus,
    };

    /// A fresh database with a run claimed by worker `w`, and a connection of its own; `None`
    /// without a test database.
    async fn claimed_run() -> Option<(TestDatabase, TestDb, Run, PgConnection)> {
        let database = TestDatabase::postgres(&postgres_url()?).await;
        let db = database.open().await;
        let s = db.storage();
        let scope = Scope::local();
        let thread = NewThread::new(ResourceId::generate(), JsonObject::new(), IfExists::Raise);
        let thread_id = s.create_thread(&scope, thread).await.unwrap().thread_id;
        s.create_run(&scope, new_run(thread_id)).await.unwrap();
        let claimed = s.claim_run("w", Duration::from_secs(60), 3).await.unwrap();
        let conn = PgConnection::connect(db.url()).await.unwrap();
        Some((database, db, claimed.expect("the run to claim").run, conn))
    }

    /// An event batch of the run, then its end: the group a short run's worker queues.
    fn events_then_end(run: &Run) -> Vec<Job> {
        let event = |seq: i64, name: &str| LoggedEvent {
            thread_id: run.thread_id,
            seq,
            run_id: run.run_id,
            event: name.to_owned(),
            data: json!({"step": seq}),
            created_at: Utc::now(),
        };
        let end = EndWrite {
            thread_id: run.thread_id,
            run_id: run.run_id,
            worker_id: "w".to_owned(),
            end: RunEnd {
                status: RunStatus::Success,
                error: None,
                thread_status: ThreadStatus::Idle,
                thread_values: Some(json!({"done": true})),
                thread_interrupts: JsonObject::new(),
                events: vec![event(12, "values")],
                after_checkpoint: None,
            },
        };
        [
            Write::Events(vec![event(10, "updates"), event(11, "values")]),
            Write::End(Box::new(end)),
        ]
        .into_iter()
        .map(|write| Job {
            write,
            thread: run.thread_id.to_string(),
            reply: oneshot::channel().0,
        })
        .collect()
    }

    /// The call applies a whole group and answers what the writer tells its callers, so the
    /// writer never falls back to one transaction per write for a group that has no fault.
    #[tokio::test]
    async fn a_group_is_applied_by_one_call() {
        let Some((_database, db, run, mut conn)) = claimed_run().await else {
            return;
        };
        let group = events_then_end(&run);
        let (answers, last_seqs) = Batch::of(&group)
            .expect("a batch")
            .apply(&mut conn)
            .await
            .expect("the group applied");
        assert!(matches!(answers[0], Ok(Written::Done)));
        let Ok(Written::Ended(Some(ended))) = &answers[1] else {
            panic!("the run's end answers the ended run");
        };
        assert_eq!(
            (ended.run_id, ended.status),
            (run.run_id, RunStatus::Success)
        );
        // The end event follows the three events logged before it.
        assert_eq!(last_seqs.get(&run.thread_id), Some(&13));
        let logged = db
            .storage()
            .read_events(run.thread_id, 10, None, 100)
            .await
            .unwrap();
        let names: Vec<_> = logged.iter().map(|e| (e.seq, e.event.as_str())).collect();
        assert_eq!(
            names,
            [(11, "values"), (12, "values"), (13, crate::RUN_END_EVENT)]
        );
        let thread = db
            .storage()
            .get_thread(&Scope::local(), run.thread_id)
            .await;
        assert_eq!(thread.unwrap().status, ThreadStatus::Idle);
    }

    /// A group whose end is not plain (here: its run was cancelled with `rollback`) fails
    /// whole, leaving nothing, for the writer to apply write by write.
    #[tokio::test]
    async fn a_group_with_an_end_that_is_not_plain_leaves_nothing() {
        let Some((_database, db, run, mut conn)) = claimed_run().await else {
            return;
        };
        let s = db.storage();
        let scope = Scope::local();
        s.cancel_runs(&scope, run.thread_id, &[run.run_id], CancelAction::Rollback)
            .await
            .unwrap();
        let before = s.read_events(run.thread_id, 0, None, 100).await.unwrap();
        let group = events_then_end(&run);
        let applied = Batch::of(&group).expect("a batch").apply(&mut conn).await;
        assert!(applied.is_err(), "the group is refused");
        let after = s.read_events(run.thread_id, 0, None, 100).await.unwrap();
        assert_eq!(after.len(), before.len(), "no event of the group is logged");
        let still = s.get_run(&scope, run.thread_id, run.run_id).await.unwrap();
        assert_eq!(still.status, RunStatus::Running);
    }
}
