-- The event log's rows and a thread's runs are kept consistent by the statements that write
-- them, not by foreign keys.
--
-- A foreign key is checked by a trigger per inserted row, each running a query of its own
-- (`SELECT 1 ... FOR KEY SHARE`): 2 per event, about 17 for a run of `chain`, the costliest
-- part of the statements that log events (measured with auto_explain on create + wait). The
-- statements already reach the same rows at no extra cost:
-- - a run is inserted by a statement that locks its thread's row and inserts nothing when the
--   thread is gone (`runs::postgres::insert_run`);
-- - events are inserted by a statement that moves their threads' counters (failing when a
--   thread is gone) and locks their runs' rows `FOR KEY SHARE` once per run, not per event
--   (failing when a run is gone), as the foreign key's trigger did;
-- - deleting a thread or a run deletes its runs and events after it, in its transaction
--   (what `ON DELETE CASCADE` did); the deleted row's lock orders it with those statements.
ALTER TABLE run_events DROP CONSTRAINT run_events_thread_id_fkey;
ALTER TABLE run_events DROP CONSTRAINT run_events_run_id_fkey;
ALTER TABLE runs DROP CONSTRAINT runs_thread_id_fkey;
