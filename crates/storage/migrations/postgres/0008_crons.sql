-- Crons: a schedule and the run to create at each due time (`payload`, the run request's
-- fields). `next_run_date` is the next due time; schedulers of every process claim due crons
-- with FOR UPDATE SKIP LOCKED and move it on in the same transaction, so each due time fires
-- once.
CREATE TABLE crons (
    cron_id          UUID PRIMARY KEY,
    user_id          TEXT,
    assistant_id     UUID NOT NULL REFERENCES assistants (assistant_id) ON DELETE CASCADE,
    -- NULL: each firing runs on a new thread (kept or removed per on_run_completed).
    thread_id        UUID REFERENCES threads (thread_id) ON DELETE CASCADE,
    schedule         TEXT NOT NULL,
    timezone         TEXT,
    payload          JSONB NOT NULL DEFAULT '{}',
    metadata         JSONB NOT NULL DEFAULT '{}',
    on_run_completed TEXT CHECK (on_run_completed IN ('delete', 'keep')),
    end_time         TIMESTAMPTZ,
    enabled          BOOLEAN NOT NULL DEFAULT TRUE,
    next_run_date    TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL
);
CREATE INDEX crons_due ON crons (next_run_date) WHERE enabled;
CREATE INDEX crons_by_user ON crons (user_id, created_at);
CREATE INDEX crons_by_thread ON crons (thread_id);
