-- Assistants: the current (pinned) version's fields live on the assistant row so that reads
-- need no join; every version, including the current one, is kept in assistant_versions.
CREATE TABLE assistants (
    assistant_id UUID PRIMARY KEY,
    user_id      TEXT,
    graph_id     TEXT NOT NULL,
    name         TEXT NOT NULL,
    description  TEXT,
    config       JSONB NOT NULL DEFAULT '{}',
    context      JSONB NOT NULL DEFAULT '{}',
    metadata     JSONB NOT NULL DEFAULT '{}',
    version      BIGINT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX assistants_by_graph ON assistants (graph_id);
CREATE INDEX assistants_by_created ON assistants (created_at);
CREATE INDEX assistants_by_metadata ON assistants USING GIN (metadata jsonb_path_ops);

CREATE TABLE assistant_versions (
    assistant_id UUID NOT NULL REFERENCES assistants (assistant_id) ON DELETE CASCADE,
    version      BIGINT NOT NULL,
    graph_id     TEXT NOT NULL,
    name         TEXT NOT NULL,
    description  TEXT,
    config       JSONB NOT NULL DEFAULT '{}',
    context      JSONB NOT NULL DEFAULT '{}',
    metadata     JSONB NOT NULL DEFAULT '{}',
    created_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (assistant_id, version)
);

CREATE TABLE threads (
    thread_id        UUID PRIMARY KEY,
    user_id          TEXT,
    status           TEXT NOT NULL DEFAULT 'idle',
    metadata         JSONB NOT NULL DEFAULT '{}',
    config           JSONB NOT NULL DEFAULT '{}',
    state_values     JSONB,
    interrupts       JSONB NOT NULL DEFAULT '{}',
    error            JSONB,
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    state_updated_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX threads_by_user_updated ON threads (user_id, updated_at);
CREATE INDEX threads_by_status ON threads (status);
CREATE INDEX threads_by_metadata ON threads USING GIN (metadata jsonb_path_ops);
