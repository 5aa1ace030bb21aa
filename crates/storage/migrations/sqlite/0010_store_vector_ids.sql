-- An integer key for each embedding: the nearest-neighbour indexes (sqlite-vec `vec0` tables
-- made at run time, one per embedding length) refer to embeddings by it, and VACUUM may
-- renumber the implicit rowids of a table that has no such key.
CREATE TABLE store_vectors_keyed (
    id        INTEGER PRIMARY KEY,
    user_id   TEXT NOT NULL,
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    field     TEXT NOT NULL,
    embedding BLOB NOT NULL,
    UNIQUE (user_id, namespace, key, field),
    FOREIGN KEY (user_id, namespace, key) REFERENCES store_items (user_id, namespace, key)
        ON DELETE CASCADE
);
INSERT INTO store_vectors_keyed (user_id, namespace, key, field, embedding)
    SELECT user_id, namespace, key, field, embedding FROM store_vectors;
DROP TABLE store_vectors;
ALTER TABLE store_vectors_keyed RENAME TO store_vectors;
