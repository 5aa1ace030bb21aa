-- The long-term store: documents under a namespace (labels joined with '.', which no label
-- holds) and a key, per user. Text compares byte by byte, so the items under a namespace
-- prefix are a range of the primary key.
CREATE TABLE store_items (
    user_id     TEXT NOT NULL,
    namespace   TEXT NOT NULL,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    -- The item's time to live, restarted by reads that refresh it, and when it runs out.
    ttl_minutes REAL,
    expires_at  TEXT,
    PRIMARY KEY (user_id, namespace, key)
);
CREATE INDEX store_items_by_expiry ON store_items (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX store_items_by_updated ON store_items (user_id, updated_at);

-- Embeddings of an item's indexed fields (little-endian f32), for search by meaning.
CREATE TABLE store_vectors (
    user_id   TEXT NOT NULL,
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    field     TEXT NOT NULL,
    embedding BLOB NOT NULL,
    PRIMARY KEY (user_id, namespace, key, field),
    FOREIGN KEY (user_id, namespace, key) REFERENCES store_items (user_id, namespace, key)
        ON DELETE CASCADE
);
