-- The long-term store: documents under a namespace (labels joined with '.', which no label
-- holds) and a key, per user. The namespace compares byte by byte (COLLATE "C"), so the items
-- under a namespace prefix are a range of the primary key.
CREATE TABLE store_items (
    user_id     TEXT NOT NULL,
    namespace   TEXT COLLATE "C" NOT NULL,
    key         TEXT NOT NULL,
    value       JSONB NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    -- The item's time to live, restarted by reads that refresh it, and when it runs out.
    ttl_minutes DOUBLE PRECISION,
    expires_at  TIMESTAMPTZ,
    PRIMARY KEY (user_id, namespace, key)
);
CREATE INDEX store_items_by_expiry ON store_items (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX store_items_by_updated ON store_items (user_id, updated_at);

-- Embeddings of an item's indexed fields, for search by meaning. A plain float array, so the
-- schema needs no extension; with pgvector installed, searches cast it to `vector`.
CREATE TABLE store_vectors (
    user_id   TEXT NOT NULL,
    namespace TEXT COLLATE "C" NOT NULL,
    key       TEXT NOT NULL,
    field     TEXT NOT NULL,
    embedding REAL[] NOT NULL,
    PRIMARY KEY (user_id, namespace, key, field),
    FOREIGN KEY (user_id, namespace, key) REFERENCES store_items (user_id, namespace, key)
        ON DELETE CASCADE
);
