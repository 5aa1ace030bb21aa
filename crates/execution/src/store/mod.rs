//! The long-term store's settings and background work: the default TTL of items, whether
//! reads refresh it, the sweeper that removes expired items, and the semantic index (which
//! fields of an item are embedded, and by what).

pub mod embed;
mod for_graphs;
#[cfg(feature = "local-embeddings")]
pub mod minilm;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use spindle_storage::store::ITEM_SWEEP_BATCH;
use spindle_storage::{ItemVector, Storage};
use tokio_util::sync::CancellationToken;

pub use embed::{Embedder, HashEmbedder, OpenAiEmbedder};
pub use for_graphs::GraphStore;

/// Whether this build has the `local:<folder>` MiniLM embedder (cargo feature
/// `local-embeddings` of this crate, which the server's and the binary's features enable):
/// what `/info` reports, from where the embedder is compiled.
pub const LOCAL_EMBEDDINGS: bool = cfg!(feature = "local-embeddings");

/// Store settings (`store.ttl` and `store.index` of the config file).
#[derive(Clone)]
pub struct StoreConfig {
    /// Minutes an item lives when its put gives no `ttl`; `None`: items without one stay.
    pub default_ttl: Option<f64>,
    /// Whether reads restart an item's TTL when the request does not say (`refresh_ttl`).
    pub refresh_on_read: bool,
    /// How often expired items are removed.
    pub sweep_every: Duration,
    /// Semantic search, when configured.
    pub index: Option<Arc<StoreIndex>>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            default_ttl: None,
            refresh_on_read: true,
            sweep_every: Duration::from_secs(3600),
            index: None,
        }
    }
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("default_ttl", &self.default_ttl)
            .field("refresh_on_read", &self.refresh_on_read)
            .field("sweep_every", &self.sweep_every)
            .field("index", &self.index.as_ref().map(|i| (i.dims, &i.fields)))
            .finish()
    }
}

/// What makes items searchable by meaning.
pub struct StoreIndex {
    /// Length of every embedding.
    pub dims: usize,
    /// The paths embedded when a put does not name its own (`$` is the whole value).
    pub fields: Vec<String>,
    pub embedder: Arc<dyn Embedder>,
}

impl StoreIndex {
    /// The embeddings of `value` at `fields` (the index's own when `None`): one per text found.
    pub async fn vectors(
        &self,
        value: &Value,
        fields: Option<&[String]>,
    ) -> Result<Vec<ItemVector>, String> {
        let mut ids = Vec::new();
        let mut texts = Vec::new();
        for field in fields.unwrap_or(&self.fields) {
            let found = texts_at(value, field);
            let many = found.len() > 1;
            for (i, text) in found.into_iter().enumerate() {
                ids.push(if many {
                    format!("{field}#{i}")
                } else {
                    field.clone()
                });
                texts.push(text);
            }
        }
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let embeddings = self.embed(&texts).await?;
        Ok(ids
            .into_iter()
            .zip(embeddings)
            .map(|(field, embedding)| ItemVector { field, embedding })
            .collect())
    }

    /// Embeds `texts`, checking that each embedding has the index's length.
    pub async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        let embeddings = self.embedder.embed(texts).await?;
        if embeddings.len() != texts.len() {
            return Err(format!(
                "the embedder returned {} embeddings for {} texts",
                embeddings.len(),
                texts.len()
            ));
        }
        if let Some(bad) = embeddings.iter().find(|e| e.len() != self.dims) {
            return Err(format!(
                "the embedder returned {} dimensions; the index is configured with dims = {}",
                bad.len(),
                self.dims
            ));
        }
        Ok(embeddings)
    }
}

/// The texts at `path` of `value`, as LangGraph's store reads them: `$` is the whole value,
/// `a.b` a nested field, `a[0]` an element, `a[*]` every element. A string is its own text;
/// anything else is its JSON. Missing fields give nothing.
pub fn texts_at(value: &Value, path: &str) -> Vec<String> {
    let mut nodes = vec![value];
    if path != "$" {
        for step in path.trim_start_matches("$.").split('.') {
            let (name, indexes) = match step.find('[') {
                Some(at) => (&step[..at], &step[at..]),
                None => (step, ""),
            };
            if !name.is_empty() {
                nodes = nodes.into_iter().filter_map(|n| n.get(name)).collect();
            }
            for index in indexes.split(']').filter_map(|i| i.strip_prefix('[')) {
                nodes = nodes
                    .into_iter()
                    .flat_map(|n| match (index, n) {
                        ("*", Value::Array(items)) => items.iter().collect::<Vec<_>>(),
                        (i, Value::Array(items)) => i
                            .parse::<usize>()
                            .ok()
                            .and_then(|i| items.get(i))
                            .into_iter()
                            .collect(),
                        _ => Vec::new(),
                    })
                    .collect();
            }
        }
    }
    nodes
        .into_iter()
        .filter(|n| !n.is_null())
        .map(|n| match n {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

/// Removes expired items until `shutdown`: at start, then every `config.sweep_every`.
pub async fn sweep_items(
    storage: Arc<dyn Storage>,
    sweep_every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let mut removed = 0;
        loop {
            match storage
                .sweep_expired_items(Utc::now(), ITEM_SWEEP_BATCH)
                .await
            {
                Ok(n) => {
                    removed += n;
                    if n < ITEM_SWEEP_BATCH as u64 {
                        break;
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot sweep expired store items; retrying later");
                    break;
                }
            }
        }
        if removed > 0 {
            tracing::info!(removed, "removed store items past their TTL");
        }
        tokio::select! {
            () = tokio::time::sleep(sweep_every) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn texts_are_read_at_paths() {
        let v = json!({"a": "hello", "b": {"c": 3}, "list": ["x", {"t": "y"}], "n": null});
        assert_eq!(texts_at(&v, "$"), vec![v.to_string()]);
        assert_eq!(texts_at(&v, "a"), vec!["hello"]);
        assert_eq!(texts_at(&v, "b.c"), vec!["3"]);
        assert_eq!(texts_at(&v, "list[0]"), vec!["x"]);
        assert_eq!(
            texts_at(&v, "list[*]"),
            vec!["x".to_owned(), r#"{"t":"y"}"#.to_owned()]
        );
        assert_eq!(texts_at(&v, "list[1].t"), vec!["y"]);
        assert!(texts_at(&v, "missing").is_empty());
        assert!(texts_at(&v, "n").is_empty());
    }
}
