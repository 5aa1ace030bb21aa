-- The tables a run writes at every step (checkpoints, their blobs and pending writes) and
-- every event (the log) become WITHOUT ROWID: each row then lives once, in its primary key's
-- B-tree, instead of in a rowid table plus the primary key's index. That is one B-tree fewer
-- per table for every insert to update and for every commit to write pages of. Their rows
-- are small (values are stored as deltas) and always read by key prefix. SQLite cannot
-- change this in place, so each table is rebuilt.

CREATE TABLE checkpoints_clustered (
    thread_id            TEXT NOT NULL,
    checkpoint_ns        TEXT NOT NULL DEFAULT '',
    checkpoint_id        TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    checkpoint           TEXT NOT NULL,
    metadata             TEXT NOT NULL DEFAULT '{}',
    created_at           TEXT NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
) WITHOUT ROWID;
INSERT INTO checkpoints_clustered
    SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata,
           created_at FROM checkpoints;
DROP TABLE checkpoints;
ALTER TABLE checkpoints_clustered RENAME TO checkpoints;

CREATE TABLE checkpoint_blobs_clustered (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    channel       TEXT NOT NULL,
    version       INTEGER NOT NULL,
    base          INTEGER,
    value         BLOB NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
) WITHOUT ROWID;
INSERT INTO checkpoint_blobs_clustered
    SELECT thread_id, checkpoint_ns, channel, version, base, value FROM checkpoint_blobs;
DROP TABLE checkpoint_blobs;
ALTER TABLE checkpoint_blobs_clustered RENAME TO checkpoint_blobs;

CREATE TABLE checkpoint_writes_clustered (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    task_id       TEXT NOT NULL,
    channel       TEXT NOT NULL,
    value         BLOB NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, idx)
) WITHOUT ROWID;
INSERT INTO checkpoint_writes_clustered
    SELECT thread_id, checkpoint_ns, checkpoint_id, idx, task_id, channel, value
    FROM checkpoint_writes;
DROP TABLE checkpoint_writes;
ALTER TABLE checkpoint_writes_clustered RENAME TO checkpoint_writes;

CREATE TABLE run_events_clustered (
    thread_id  TEXT NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    run_id     TEXT REFERENCES runs (run_id) ON DELETE CASCADE,
    event      TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (thread_id, seq)
) WITHOUT ROWID;
INSERT INTO run_events_clustered
    SELECT thread_id, seq, run_id, event, data, created_at FROM run_events;
DROP TABLE run_events;
ALTER TABLE run_events_clustered RENAME TO run_events;
CREATE INDEX run_events_by_run ON run_events (run_id, seq);
