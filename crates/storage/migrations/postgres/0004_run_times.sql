-- When a run first started executing (its first claim) and when it ended, for webhook payloads
-- (`run_started_at`, `run_ended_at`). NULL until then; runs that ended before this migration
-- keep NULL, as their times were never recorded.
ALTER TABLE runs ADD COLUMN started_at TIMESTAMPTZ;
ALTER TABLE runs ADD COLUMN ended_at TIMESTAMPTZ;
