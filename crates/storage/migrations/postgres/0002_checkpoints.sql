-- Checkpoints of the graph engine (see spindle_graph::checkpoint for the blob model).
--
-- Thread ids are the engine's strings (TEXT, not UUID) and not references to `threads`: a
-- checkpoint may be written for a thread whose row is managed elsewhere, and deleting a
-- thread deletes its checkpoints explicitly. Key columns sort bytewise (COLLATE "C"), as in
-- SQLite, so `before` and "newest first" follow the ids' byte order whatever the locale.

-- One row per checkpoint: the checkpoint without its channel values (those are in
-- checkpoint_blobs) and its metadata. Checkpoint ids are time-ordered UUIDs, so the primary
-- key, scanned backwards, is the "newest first" index: the latest checkpoint and a page of
-- history cost O(page), not O(thread length). No GIN index on metadata: filters are always
-- within one thread, and a GIN entry per step would be paid on every write.
CREATE TABLE checkpoints (
    thread_id            TEXT COLLATE "C" NOT NULL,
    checkpoint_ns        TEXT COLLATE "C" NOT NULL DEFAULT '',
    checkpoint_id        TEXT COLLATE "C" NOT NULL,
    parent_checkpoint_id TEXT COLLATE "C",
    checkpoint           JSONB NOT NULL,
    metadata             JSONB NOT NULL DEFAULT '{}',
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);

-- Channel values per version, written once: a version is never rewritten with other
-- content, so inserts ignore conflicts. `value` is a serialised BlobValue (a full value or a
-- delta), kept as bytes: it is only ever read back whole, so jsonb's parsing would be paid
-- for nothing. `base` repeats the version a delta applies to, so a load can walk the delta
-- chain in SQL (one recursive query) instead of one round trip per link.
CREATE TABLE checkpoint_blobs (
    thread_id     TEXT COLLATE "C" NOT NULL,
    checkpoint_ns TEXT COLLATE "C" NOT NULL DEFAULT '',
    channel       TEXT COLLATE "C" NOT NULL,
    version       BIGINT NOT NULL,
    base          BIGINT,
    value         BYTEA NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);

-- Writes of finished tasks against the checkpoint their step started from. `idx` orders
-- the writes of one checkpoint (0, 1, 2, ... in the order they were saved).
CREATE TABLE checkpoint_writes (
    thread_id     TEXT COLLATE "C" NOT NULL,
    checkpoint_ns TEXT COLLATE "C" NOT NULL DEFAULT '',
    checkpoint_id TEXT COLLATE "C" NOT NULL,
    idx           BIGINT NOT NULL,
    task_id       TEXT NOT NULL,
    channel       TEXT NOT NULL,
    value         BYTEA NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, idx)
);
