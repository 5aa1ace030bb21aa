//! Creations of plain threads and of runs on idle threads on PostgreSQL, grouped from
//! concurrent requests into shared transactions.
//!
//! A waited run costs the API two creations (its thread, then the run), and each was a
//! single-statement transaction of its own: its round trip, its `COMMIT` and WAL flush. As the
//! runs' writer does for what runs write (`pg_writer`), creations queue here; one task takes
//! everything queued and makes it in one call of `spindle_create_group` (migration 0015), one
//! round trip and one commit, and answers every caller after it. Alone, a creation takes the
//! same path at the cost of a hand-over between tasks; under load, creations arriving while a
//! group is being made form the next group.
//!
//! What the call leaves out (a thread id taken; a run whose thread is not idle, is locked by
//! another transaction, or whose assistant changed) is answered `None`, for the caller to
//! decide it in a transaction of its own, as before. A group that fails (a run id taken) is
//! made again one call per creation, so only the faulty one fails; one whose connection was
//! lost is not (it may have committed), and its callers are told the database was unreachable.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sqlx::postgres::PgPool;
use sqlx::PgConnection;
use tokio::sync::{mpsc, oneshot};

pub(crate) mod group;

use crate::pg_pool;
use crate::{ConnectionPool, StorageError, StorageResult, Thread};
use group::{Made, RunMade};
pub(crate) use group::{RunCreation, ThreadCreation};

/// Most creations one call makes: a bound on the locks its transaction holds and on how long
/// its first caller waits.
const MAX_GROUP: usize = 128;

enum Creation {
    Thread(Box<ThreadCreation>),
    Run(Box<RunCreation>),
}

/// What a creation answers: the thread or run made, `None` when it was left out.
enum Answer {
    Thread(Option<Thread>),
    Run(Option<RunMade>),
}

struct Job {
    creation: Creation,
    reply: oneshot::Sender<StorageResult<Answer>>,
}

/// The queue of the creating task.
pub(crate) struct PgCreator {
    queue: mpsc::UnboundedSender<Job>,
    connection: Arc<ConnectionState>,
}

/// The task's connection as the process's metrics show it (`pool="creation"`).
#[derive(Default)]
struct ConnectionState {
    open: AtomicBool,
    busy: AtomicBool,
}

impl PgCreator {
    /// Starts the creating task on the current runtime; it stops when the creator is dropped.
    pub(crate) fn start(pool: PgPool) -> Self {
        let (queue, jobs) = mpsc::unbounded_channel();
        let connection = Arc::new(ConnectionState::default());
        tokio::spawn(create_groups(pool, jobs, connection.clone()));
        Self { queue, connection }
    }

    /// Creates a plain thread; `None` when its id is taken.
    pub(crate) async fn thread(&self, creation: ThreadCreation) -> StorageResult<Option<Thread>> {
        match self.submit(Creation::Thread(Box::new(creation))).await? {
            Answer::Thread(thread) => Ok(thread),
            Answer::Run(_) => Err(mismatched()),
        }
    }

    /// Creates a run on an idle thread (`decided` false: `runs::postgres::Decided::IfIdle`);
    /// `None` when that did not hold.
    pub(crate) async fn run(&self, creation: RunCreation) -> StorageResult<Option<RunMade>> {
        match self.submit(Creation::Run(Box::new(creation))).await? {
            Answer::Run(run) => Ok(run),
            Answer::Thread(_) => Err(mismatched()),
        }
    }

    async fn submit(&self, creation: Creation) -> StorageResult<Answer> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Job { creation, reply })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// The task's connection as a pool of one in the process's metrics.
    pub(crate) fn stats(&self) -> ConnectionPool {
        let open = self.connection.open.load(Ordering::Relaxed);
        let busy = self.connection.busy.load(Ordering::Relaxed);
        ConnectionPool {
            name: "creation",
            open: u32::from(open),
            idle: u32::from(open && !busy),
            max: 1,
        }
    }
}

fn stopped() -> StorageError {
    StorageError::Commit("the PostgreSQL creating task stopped".to_owned())
}

fn mismatched() -> StorageError {
    StorageError::Corrupt("a creation answered as another kind".to_owned())
}

/// The creating task: takes what is queued, makes it as one group, answers, again.
async fn create_groups(
    pool: PgPool,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    state: Arc<ConnectionState>,
) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    let mut conn = Connection {
        pool,
        conn: None,
        state,
    };
    while jobs.recv_many(&mut group, MAX_GROUP).await > 0 {
        conn.state.busy.store(true, Ordering::Relaxed);
        let answers = create(&mut conn, &group).await;
        conn.state.busy.store(false, Ordering::Relaxed);
        for (job, answer) in group.drain(..).zip(answers) {
            // The caller may have stopped waiting; what was made stands (a thread is there
            // to be read; a run made runs).
            let _ = job.reply.send(answer);
        }
    }
}

/// The task's own connection, opened on first use and kept (the call is prepared once on
/// it), and opened again after it was lost.
struct Connection {
    pool: PgPool,
    /// The connection and when its last call ended.
    conn: Option<(PgConnection, Instant)>,
    state: Arc<ConnectionState>,
}

impl Connection {
    /// Makes `group` in one call on the connection: a kept one if it is usable (tested when
    /// in doubt, by the pool's rule), else a new one.
    async fn create_together(&mut self, group: &[Job]) -> StorageResult<Answers> {
        if let Some((conn, since)) = &mut self.conn {
            if !pg_pool::usable(conn, since.elapsed()).await {
                self.conn = None;
            }
        }
        if self.conn.is_none() {
            let options = (*self.pool.connect_options()).clone();
            let conn = sqlx::Connection::connect_with(&options).await;
            self.state.open.store(conn.is_ok(), Ordering::Relaxed);
            self.conn = Some((conn?, Instant::now()));
        }
        let (conn, since) = self.conn.as_mut().expect("connected above");
        let answers = create_together(conn, group).await;
        *since = Instant::now();
        if let Err(StorageError::Database(error)) = &answers {
            if pg_pool::lost_connection(error) {
                self.conn = None;
                self.state.open.store(false, Ordering::Relaxed);
            }
        }
        answers
    }
}

/// An answer per creation, in group order.
type Answers = Vec<StorageResult<Answer>>;

/// Makes the group in one call; when that fails, each creation in a call of its own. Not when
/// the connection was lost: the call may have committed before its answer was lost, and made
/// again its creations would fail as taken, so every caller is told the database was
/// unreachable, as a statement of its own would have told it.
async fn create(conn: &mut Connection, group: &[Job]) -> Answers {
    match conn.create_together(group).await {
        Ok(answers) => return answers,
        Err(StorageError::Database(error)) if pg_pool::lost_connection(&error) => {
            tracing::warn!(%error, creations = group.len(),
                "lost the creating task's PostgreSQL connection during a call");
            return group.iter().map(|_| Err(unreachable(&error))).collect();
        }
        // Rare (a run id taken): each alone tells which failed.
        Err(error) => tracing::debug!(%error, creations = group.len(),
            "a group of creations failed; making them one by one"),
    }
    let mut answers = Vec::with_capacity(group.len());
    for job in group {
        let answer = conn.create_together(std::slice::from_ref(job)).await;
        answers.push(
            answer.and_then(|one| one.into_iter().next().unwrap_or_else(|| Err(mismatched()))),
        );
    }
    answers
}

/// A caller's copy of a lost connection's error (sqlx's errors cannot be cloned): the server
/// answers it as the database unavailable.
fn unreachable(error: &sqlx::Error) -> StorageError {
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, error.to_string());
    StorageError::Database(sqlx::Error::Io(io))
}

/// The whole group made by one call, an answer per creation in group order; an error (and
/// nothing made) if the call failed.
async fn create_together(conn: &mut PgConnection, group: &[Job]) -> StorageResult<Answers> {
    let mut threads = Vec::new();
    let mut runs = Vec::new();
    for job in group {
        match &job.creation {
            Creation::Thread(thread) => threads.push(&**thread),
            Creation::Run(run) => runs.push(&**run),
        }
    }
    let mut made: Made = group::create(conn, &threads, &runs).await?;
    let mut runs_seen = 0;
    Ok(group
        .iter()
        .map(|job| {
            Ok(match &job.creation {
                Creation::Thread(thread) => Answer::Thread(made.thread(thread)),
                Creation::Run(_) => {
                    runs_seen += 1;
                    Answer::Run(made.run(runs_seen - 1))
                }
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::{SubsecRound, Utc};
    use sqlx::Connection as _;

    use super::*;
    use crate::runs::postgres::creation_if_idle;
    use crate::test_util::{new_run, postgres_url, TestDatabase, TestDb};
    use crate::{Claim, IfExists, JsonObject, NewThread, ResourceId, RunStatus, Scope};

    /// A fresh database with an idle thread, and a connection of its own; `None` without a
    /// test database.
    async fn idle_thread() -> Option<(TestDatabase, TestDb, ResourceId, PgConnection)> {
        let database = TestDatabase::postgres(&postgres_url()?).await;
        let db = database.open().await;
        let thread = NewThread::new(ResourceId::generate(), JsonObject::new(), IfExists::Raise);
        let thread_id = db
            .storage()
            .create_thread(&Scope::local(), thread)
            .await
            .unwrap()
            .thread_id;
        let conn = PgConnection::connect(db.url()).await.unwrap();
        Some((database, db, thread_id, conn))
    }

    fn thread_job(thread_id: ResourceId) -> Job {
        let creation = ThreadCreation {
            thread_id,
            user_id: Scope::local().user_id,
            metadata: [("team".to_owned(), "a".into())].into_iter().collect(),
            now: Utc::now().trunc_subsecs(6),
        };
        job(Creation::Thread(Box::new(creation)))
    }

    fn run_job(new: &crate::NewRun) -> Job {
        let creation = creation_if_idle(&Scope::local(), new, Utc::now()).unwrap();
        job(Creation::Run(Box::new(creation)))
    }

    fn job(creation: Creation) -> Job {
        Job {
            creation,
            reply: oneshot::channel().0,
        }
    }

    fn claimed(thread_id: ResourceId) -> crate::NewRun {
        crate::NewRun {
            claim: Some(Claim {
                worker_id: "w".to_owned(),
                lease: Duration::from_secs(60),
            }),
            ..new_run(thread_id)
        }
    }

    /// One call makes what it can of a group of threads and runs and leaves out, for their
    /// callers to decide alone, a thread whose id is taken and a second run of a thread.
    #[tokio::test]
    async fn a_group_makes_what_it_can_in_one_call() {
        let Some((_database, db, idle, mut conn)) = idle_thread().await else {
            return;
        };
        let fresh = ResourceId::generate();
        let first = new_run(idle);
        let group = vec![
            thread_job(fresh),
            thread_job(idle),
            run_job(&first),
            run_job(&new_run(idle)),
            run_job(&claimed(fresh)),
        ];
        let answers = create_together(&mut conn, &group).await.expect("one call");

        let Ok(Answer::Thread(Some(made))) = &answers[0] else {
            panic!("the new thread made");
        };
        let stored = db.storage().get_thread(&Scope::local(), fresh).await;
        assert_eq!(stored.unwrap().created_at, made.created_at);
        assert!(matches!(answers[1], Ok(Answer::Thread(None))), "id taken");
        let Ok(Answer::Run(Some((run, None)))) = &answers[2] else {
            panic!("the idle thread's run made, pending");
        };
        assert_eq!((run.run_id, run.status), (first.run_id, RunStatus::Pending));
        assert!(
            matches!(answers[3], Ok(Answer::Run(None))),
            "its thread is busy now"
        );
        let Ok(Answer::Run(Some((run, Some(start))))) = &answers[4] else {
            panic!("the new thread's run made, claimed");
        };
        assert_eq!(run.status, RunStatus::Running);
        assert_eq!((start.last_seq, start.thread_is_new), (1, true));
    }

    /// A plain thread's answer, built from what it was given and the table's defaults, is
    /// what a read of it finds.
    #[tokio::test]
    async fn a_plain_thread_answers_as_it_is_stored() {
        let Some((_database, db, _, _)) = idle_thread().await else {
            return;
        };
        let metadata: JsonObject = [("k".to_owned(), 1.into())].into_iter().collect();
        let new = NewThread::new(ResourceId::generate(), metadata, IfExists::Raise);
        let made = db
            .storage()
            .create_thread(&Scope::local(), new)
            .await
            .unwrap();
        let read = db
            .storage()
            .get_thread(&Scope::local(), made.thread_id)
            .await;
        assert_eq!(read.unwrap(), made);
    }

    /// A group that fails is made again one call per creation: only the faulty one fails.
    #[tokio::test]
    async fn a_failed_group_fails_only_its_faulty_creation() {
        let Some((_database, db, idle, _)) = idle_thread().await else {
            return;
        };
        let taken = db
            .storage()
            .create_run(&Scope::local(), new_run(idle))
            .await
            .unwrap()
            .run;
        let other = idle_thread_of(&db).await;
        let fresh = ResourceId::generate();
        let group = vec![
            thread_job(fresh),
            run_job(&crate::NewRun {
                run_id: taken.run_id,
                ..new_run(other)
            }),
        ];
        let mut conn = Connection {
            pool: sqlx::PgPool::connect(db.url()).await.unwrap(),
            conn: None,
            state: Arc::default(),
        };
        let answers = create(&mut conn, &group).await;
        assert!(matches!(answers[0], Ok(Answer::Thread(Some(_)))));
        assert!(matches!(answers[1], Err(StorageError::Database(_))));
        assert!(db
            .storage()
            .get_thread(&Scope::local(), fresh)
            .await
            .is_ok());
    }

    /// A group whose connection is lost is not made again (it may have committed before its
    /// answer was lost): its callers hear that the database was unreachable, and the next
    /// group connects again.
    #[tokio::test]
    async fn a_lost_connection_fails_its_group_and_the_next_connects_again() {
        let Some((_database, db, _, mut other)) = idle_thread().await else {
            return;
        };
        let mut conn = Connection {
            pool: sqlx::PgPool::connect(db.url()).await.unwrap(),
            conn: None,
            state: Arc::default(),
        };
        let first = create(&mut conn, &[thread_job(ResourceId::generate())]).await;
        assert!(matches!(first[0], Ok(Answer::Thread(Some(_)))));
        let (kept, _) = conn.conn.as_mut().expect("a connection kept");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(kept)
            .await
            .unwrap();
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&mut other)
            .await
            .unwrap();

        // Just used, so not in doubt (unless another test loses a connection this very
        // millisecond): the call goes out on the dead connection.
        conn.conn.as_mut().expect("a connection kept").1 = Instant::now();
        let lost = ResourceId::generate();
        let answers = create(&mut conn, &[thread_job(lost)]).await;
        assert!(
            matches!(&answers[0], Err(StorageError::Database(sqlx::Error::Io(_)))),
            "{:?}",
            answers[0].as_ref().err()
        );
        let read = db.storage().get_thread(&Scope::local(), lost).await;
        assert!(matches!(read, Err(StorageError::NotFound(_))), "{read:?}");
        let next = create(&mut conn, &[thread_job(ResourceId::generate())]).await;
        assert!(matches!(next[0], Ok(Answer::Thread(Some(_)))));
    }

    async fn idle_thread_of(db: &TestDb) -> ResourceId {
        let thread = NewThread::new(ResourceId::generate(), JsonObject::new(), IfExists::Raise);
        let made = db.storage().create_thread(&Scope::local(), thread).await;
        made.unwrap().thread_id
    }
}
