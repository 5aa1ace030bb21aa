//! Nearest-neighbour indexes of the store's embeddings on SQLite, for searches by meaning.
//!
//! One sqlite-vec `vec0` table per embedding length (`store_vec_<dims>`), made the first time
//! embeddings of that length are stored or searched for, filled with those already stored,
//! and kept in step with `store_vectors` by triggers. It is partitioned by user and carries
//! each embedding's namespace, so a search reads the nearest embeddings of its user under
//! its prefix. Embeddings of all zeros are left out: their cosine is undefined (the exact
//! ranking scores them 0).
//!
//! The index answers before the search's JSON filters and the items' expiry apply, so its
//! answer is used only when it provably equals the exact ranking ([`decides`]).

use std::collections::HashSet;
use std::sync::Mutex;

use rusqlite::Connection;

/// The most neighbours one query may ask sqlite-vec 0.1 for.
pub(crate) const MAX_K: i64 = 4096;
/// The longest embeddings sqlite-vec 0.1 indexes.
pub(crate) const MAX_DIMS: usize = 8192;

/// The lengths whose index this process knows to exist.
#[derive(Default)]
pub(crate) struct NearestIndexes {
    ready: Mutex<HashSet<usize>>,
}

impl NearestIndexes {
    pub(crate) fn is_ready(&self, dims: usize) -> bool {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&dims)
    }

    /// Records that the index of `dims` exists (once the transaction that made it committed).
    pub(crate) fn mark_ready(&self, dims: usize) {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(dims);
    }

    /// Forgets what was made, as a restart does.
    #[cfg(test)]
    pub(crate) fn forget(&self) {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// The index table of `dims`-long embeddings.
pub(crate) fn table(dims: usize) -> String {
    format!("store_vec_{dims}")
}

/// Makes the index of `dims`-long embeddings unless it exists, with what is stored already
/// (on the writer thread's connection, in its transaction).
pub(crate) fn create(conn: &Connection, dims: usize) -> rusqlite::Result<()> {
    let exists: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [table(dims)],
        |row| row.get(0),
    )?;
    if !exists {
        conn.execute_batch(&definition(dims))?;
        tracing::info!(dims, "made the store's nearest-neighbour index");
    }
    Ok(())
}

/// The index table, its triggers and its first rows.
fn definition(dims: usize) -> String {
    let table = table(dims);
    let indexable = |row: &str| {
        let bytes = dims * 4;
        format!(
            "length({row}.embedding) = {bytes} \
             AND vec_distance_l2({row}.embedding, zeroblob({bytes})) > 0"
        )
    };
    let (new, old, stored) = (
        indexable("new"),
        indexable("old"),
        indexable("store_vectors"),
    );
    format!(
        "CREATE VIRTUAL TABLE {table} USING vec0(user_id text partition key, namespace text, \
             embedding float[{dims}] distance_metric=cosine);
         CREATE TRIGGER {table}_insert AFTER INSERT ON store_vectors WHEN {new} BEGIN
             INSERT INTO {table} (rowid, user_id, namespace, embedding)
                 VALUES (new.id, new.user_id, new.namespace, new.embedding);
         END;
         CREATE TRIGGER {table}_delete AFTER DELETE ON store_vectors WHEN {old} BEGIN
             DELETE FROM {table} WHERE rowid = old.id;
         END;
         CREATE TRIGGER {table}_update AFTER UPDATE ON store_vectors BEGIN
             DELETE FROM {table} WHERE rowid = old.id;
             INSERT INTO {table} (rowid, user_id, namespace, embedding)
                 SELECT new.id, new.user_id, new.namespace, new.embedding WHERE {new};
         END;
         INSERT INTO {table} (rowid, user_id, namespace, embedding)
             SELECT id, user_id, namespace, embedding FROM store_vectors WHERE {stored};"
    )
}

/// Whether the page ranked from the `k` nearest embeddings is the exact ranking's.
///
/// `scores` are the page's items' best scores among the neighbours found, best first, for a
/// page that needs `need` items; `worst` is the score of the farthest neighbour found, and
/// `exhausted` says the index had fewer than `k` (every embedding of the user's prefix was
/// read). An item the neighbours missed scores at most `worst`; one whose embeddings are not
/// indexed (zeros, another length) scores 0 in the exact ranking. So the page stands when it
/// is full and its last item beats both, strictly, as ties are broken by namespace and key.
pub(crate) fn decides(scores: &[f64], need: usize, worst: Option<f64>, exhausted: bool) -> bool {
    let Some(&last) = scores.last() else {
        return false;
    };
    let beats_unseen = exhausted || worst.is_some_and(|worst| last > worst);
    scores.len() == need && last > 0.0 && beats_unseen
}

#[cfg(test)]
mod tests {
    use super::decides;

    #[test]
    fn a_page_stands_only_when_nothing_unseen_can_beat_or_tie_it() {
        assert!(decides(&[0.9, 0.8], 2, Some(0.5), false));
        // Something not read may score as much as the farthest neighbour read.
        assert!(!decides(&[0.9, 0.5], 2, Some(0.5), false));
        assert!(decides(&[0.9, 0.5], 2, Some(0.5), true));
        // Unindexed embeddings score 0.
        assert!(!decides(&[0.9, 0.0], 2, Some(-0.5), true));
        assert!(!decides(&[0.9, -0.1], 2, Some(-0.5), true));
        // A short page: items may be missing that only the exact ranking finds.
        assert!(!decides(&[0.9], 2, Some(0.5), true));
        assert!(!decides(&[], 2, None, true));
    }
}
