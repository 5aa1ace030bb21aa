-- Thread TTL: the thread's own time to live (strategy and minutes, as set by create or patch)
-- and when it runs out. `ttl_swept_at` records when the server's default TTL last trimmed a
-- thread without a TTL of its own (keep_latest), so the next sweep counts from then.
ALTER TABLE threads
    ADD COLUMN ttl_strategy TEXT CHECK (ttl_strategy IN ('delete', 'keep_latest')),
    ADD COLUMN ttl_minutes DOUBLE PRECISION,
    ADD COLUMN expires_at TIMESTAMPTZ,
    ADD COLUMN ttl_swept_at TIMESTAMPTZ;
-- The sweeper's two questions: whose own TTL ran out, and who was idle past the default.
CREATE INDEX threads_by_expiry ON threads (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX threads_by_updated ON threads (updated_at) WHERE ttl_minutes IS NULL;

-- A state update made through the state API is logged for thread streams too, and no run
-- made it: `run_id` becomes optional.
ALTER TABLE run_events ALTER COLUMN run_id DROP NOT NULL;
