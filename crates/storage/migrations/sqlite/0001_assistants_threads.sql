-- Assistants: the current (pinned) version's fields live on the assistant row so that reads
-- need no join; every version, including the current one, is kept in assistant_versions.
CREATE TABLE assistants (
    assistant_id TEXT PRIMARY KEY NOT NULL,
    user_id      TEXT,
    graph_id     TEXT NOT NULL,
    name         TEXT NOT NULL,
    description  TEXT,
    config       TEXT NOT NULL DEFAULT '{}',
    context      TEXT NOT NULL DEFAULT '{}',
    metadata     TEXT NOT NULL DEFAULT '{}',
    version      INTEGER NOT NULL,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
);
CREATE INDEX assistants_by_graph ON assistants (graph_id);
CREATE INDEX assistants_by_created ON assistants (created_at);

CREATE TABLE assistant_versions (
    assistant_id TEXT NOT NULL REFERENCES assistants (assistant_id) ON DELETE CASCADE,
    version      INTEGER NOT NULL,
    graph_id     TEXT NOT NULL,
    name         TEXT NOT NULL,
    description  TEXT,
    config       TEXT NOT NULL DEFAULT '{}',
    context      TEXT NOT NULL DEFAULT '{}',
    metadata     TEXT NOT NULL DEFAULT '{}',
    created_at   TEXT NOT NULL,
    PRIMARY KEY (assistant_id, version)
);

CREATE TABLE threads (
    thread_id        TEXT PRIMARY KEY NOT NULL,
    user_id          TEXT,
    status           TEXT NOT NULL DEFAULT 'idle',
    metadata         TEXT NOT NULL DEFAULT '{}',
    config           TEXT NOT NULL DEFAULT '{}',
    state_values     TEXT,
    interrupts       TEXT NOT NULL DEFAULT '{}',
    error            TEXT,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL,
    state_updated_at TEXT NOT NULL
);
CREATE INDEX threads_by_user_updated ON threads (user_id, updated_at);
CREATE INDEX threads_by_status ON threads (status);
