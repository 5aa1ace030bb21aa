-- A run's final values (the interface's Run.output), written by the transaction that ends the
-- run along with its thread's values; NULL until the run ends.
ALTER TABLE runs ADD COLUMN output JSONB;
