-- A thread's event counter: the seq of the last event it ever logged. It lives on the thread,
-- not derived from the log, so that removing events (a rolled-back run's, or old ones by
-- retention) never lets a seq be handed out twice: a client resuming after seq N must never
-- miss a later event numbered N or below.
ALTER TABLE threads ADD COLUMN event_seq BIGINT NOT NULL DEFAULT 0;
UPDATE threads SET event_seq = COALESCE(
    (SELECT MAX(seq) FROM run_events e WHERE e.thread_id = threads.thread_id), 0);
