-- Runs' status indexes hold only the runs that can still change: pending and running ones.
--
-- A thread's active runs (`thread_id = $1 AND status IN ('pending', 'running')`, looked up at
-- every run's creation and end) had no index of their own, and plans found them through
-- `runs_to_claim (status, run_after, created_at)`, reading every running entry of every
-- thread. A run's row is updated as it ends, so each run left a running entry behind, for
-- vacuum to clear: until it did (or with autovacuum off), those reads grew with every run
-- made (42 million index entries read in 20 s of create + wait; runs/s fell by a third).
-- Partial indexes over the active runs stay as small as the work in flight, and ended runs
-- cost them nothing.
DROP INDEX runs_to_claim;
-- Claiming: due pending runs, oldest first.
CREATE INDEX runs_pending ON runs (run_after, created_at) WHERE status = 'pending';
-- A thread's active runs, oldest first.
CREATE INDEX runs_active_by_thread ON runs (thread_id, created_at)
    WHERE status IN ('pending', 'running');
