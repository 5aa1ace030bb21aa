-- A cron firing in flight: claimed (`next_run_date` moved on) but its run not created yet.
-- The run's creation clears it in its own transaction, so a firing whose scheduler died in
-- between is found (claimed long ago) and made by another scheduler, once.
ALTER TABLE crons ADD COLUMN firing_due TEXT;
ALTER TABLE crons ADD COLUMN firing_claimed_at TEXT;
CREATE INDEX crons_firing ON crons (firing_claimed_at) WHERE firing_due IS NOT NULL;
