-- Checkpoints of the graph engine (see spindle_graph::checkpoint for the blob model).
--
-- Thread ids are the engine's strings, not references to `threads`: a checkpoint may be
-- written for a thread whose row is managed elsewhere, and deleting a thread deletes its
-- checkpoints explicitly.

-- One row per checkpoint: the serialised checkpoint without its channel values (those are in
-- checkpoint_blobs) and its metadata. Checkpoint ids are time-ordered UUIDs, so the primary
-- key, read backwards, is the "newest first" index: the latest checkpoint and a page of
-- history cost O(page), not O(thread length).
CREATE TABLE checkpoints (
    thread_id            TEXT NOT NULL,
    checkpoint_ns        TEXT NOT NULL DEFAULT '',
    checkpoint_id        TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    checkpoint           TEXT NOT NULL,
    metadata             TEXT NOT NULL DEFAULT '{}',
    created_at           TEXT NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);

-- Channel values per version, written once: a version is never rewritten with other
-- content, so inserts ignore conflicts. `value` is a serialised BlobValue (a full value or
-- a delta); `base` repeats the version a delta applies to, so a load can walk the delta chain
-- in SQL (one recursive query) instead of one round trip per link.
CREATE TABLE checkpoint_blobs (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    channel       TEXT NOT NULL,
    version       INTEGER NOT NULL,
    base          INTEGER,
    value         BLOB NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);

-- Writes of finished tasks against the checkpoint their step started from. `idx` orders
-- the writes of one checkpoint (0, 1, 2, ... in the order they were saved).
CREATE TABLE checkpoint_writes (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    task_id       TEXT NOT NULL,
    channel       TEXT NOT NULL,
    value         BLOB NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, idx)
);
