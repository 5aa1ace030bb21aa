-- Crons: a schedule and the run to create at each due time (`payload`, the run request's
-- fields). `next_run_date` is the next due time in UTC; the scheduler claims due crons and
-- moves it on in one transaction, so each due time fires once.
CREATE TABLE crons (
    cron_id          TEXT PRIMARY KEY NOT NULL,
    user_id          TEXT,
    assistant_id     TEXT NOT NULL REFERENCES assistants (assistant_id) ON DELETE CASCADE,
    -- NULL: each firing runs on a new thread (kept or removed per on_run_completed).
    thread_id        TEXT REFERENCES threads (thread_id) ON DELETE CASCADE,
    schedule         TEXT NOT NULL,
    timezone         TEXT,
    payload          TEXT NOT NULL DEFAULT '{}',
    metadata         TEXT NOT NULL DEFAULT '{}',
    on_run_completed TEXT CHECK (on_run_completed IN ('delete', 'keep')),
    end_time         TEXT,
    enabled          INTEGER NOT NULL DEFAULT 1,
    next_run_date    TEXT,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL
);
CREATE INDEX crons_due ON crons (next_run_date) WHERE enabled;
CREATE INDEX crons_by_user ON crons (user_id, created_at);
