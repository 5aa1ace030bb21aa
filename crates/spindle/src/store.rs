//! The long-term store's settings from the config file's `store` section: item TTL defaults
//! and the semantic index with its embedder.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use spindle_execution::store::{Embedder, HashEmbedder, OpenAiEmbedder, StoreIndex};
use spindle_execution::StoreConfig;

use crate::config::{EmbedSpec, LoadedConfig, StoreIndexSection};

const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// Store settings: the file's, else the defaults (no default TTL, reads refresh, a sweep every
/// hour, no index).
pub fn store_config(config: &LoadedConfig) -> Result<StoreConfig> {
    let mut store = StoreConfig::default();
    let Some(section) = &config.file.store else {
        return Ok(store);
    };
    if let Some(ttl) = &section.ttl {
        store.default_ttl = match ttl.default_ttl {
            Some(m) if !(m.is_finite() && m > 0.0) => {
                bail!("store.ttl.default_ttl must be a positive number of minutes, got {m}")
            }
            other => other,
        };
        store.refresh_on_read = ttl.refresh_on_read.unwrap_or(store.refresh_on_read);
        if let Some(minutes) = ttl.sweep_interval_minutes {
            if !(minutes.is_finite() && minutes > 0.0) {
                bail!("store.ttl.sweep_interval_minutes must be positive, got {minutes}");
            }
            store.sweep_every = Duration::from_secs_f64((minutes * 60.0).max(0.1));
        }
    }
    if let Some(index) = &section.index {
        store.index = Some(Arc::new(store_index(config, index).context("store.index")?));
    }
    Ok(store)
}

fn store_index(config: &LoadedConfig, index: &StoreIndexSection) -> Result<StoreIndex> {
    if index.dims == 0 {
        bail!("dims must be at least 1");
    }
    let embedder: Arc<dyn Embedder> = match &index.embed {
        EmbedSpec::Name(name) => {
            let (provider, rest) = name.split_once(':').unwrap_or((name.as_str(), ""));
            match provider {
                "openai" => Arc::new(openai(rest, None, None, index.dims)?),
                "local" => local(config, std::path::Path::new(rest))?,
                "spindle" if rest == "hash" => Arc::new(HashEmbedder { dims: index.dims }),
                _ => bail!(
                    "embed {name:?}: expected \"openai:<model>\", \"local:<folder>\" or \
                     \"spindle:hash\" (Python embedding functions are not supported)"
                ),
            }
        }
        EmbedSpec::Detailed {
            provider,
            model,
            base_url,
            api_key_env,
            path,
        } => match provider.as_str() {
            "openai" => Arc::new(openai(
                model
                    .as_deref()
                    .context("embed.model is required for openai")?,
                base_url.as_deref(),
                api_key_env.as_deref(),
                index.dims,
            )?),
            "local" => local(
                config,
                path.as_deref()
                    .context("embed.path is required for local")?,
            )?,
            "hash" => Arc::new(HashEmbedder { dims: index.dims }),
            other => bail!("embed.provider {other:?}: expected openai, local or hash"),
        },
    };
    Ok(StoreIndex {
        dims: index.dims,
        fields: index.fields.clone().unwrap_or_else(|| vec!["$".into()]),
        embedder,
    })
}

/// An OpenAI-compatible endpoint: `base_url`, else `OPENAI_BASE_URL`, else OpenAI's; the key
/// from `api_key_env` (default `OPENAI_API_KEY`), when set.
fn openai(
    model: &str,
    base_url: Option<&str>,
    api_key_env: Option<&str>,
    dims: usize,
) -> Result<OpenAiEmbedder> {
    if model.is_empty() {
        bail!("the openai embedder needs a model name (openai:<model>)");
    }
    let base_url = base_url
        .map(str::to_owned)
        .or_else(|| std::env::var("OPENAI_BASE_URL").ok())
        .unwrap_or_else(|| OPENAI_BASE_URL.to_owned());
    let key = std::env::var(api_key_env.unwrap_or("OPENAI_API_KEY")).ok();
    // OpenAI's own models can shorten their vectors; other servers may refuse the field.
    let dimensions = (base_url == OPENAI_BASE_URL).then_some(dims);
    OpenAiEmbedder::new(base_url, model, key, dimensions).map_err(anyhow::Error::msg)
}

#[cfg(feature = "local-embeddings")]
fn local(config: &LoadedConfig, path: &std::path::Path) -> Result<Arc<dyn Embedder>> {
    let folder = config.resolve(&path.to_string_lossy());
    let model = spindle_execution::store::minilm::MiniLmEmbedder::load(&folder)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("cannot load the embedding model in {}", folder.display()))?;
    Ok(Arc::new(model))
}

#[cfg(not(feature = "local-embeddings"))]
fn local(_config: &LoadedConfig, path: &std::path::Path) -> Result<Arc<dyn Embedder>> {
    bail!(
        "embed \"local:{}\": this spindle was built without the `local-embeddings` feature \
         (cargo build --release --features local-embeddings)",
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(store: &str) -> LoadedConfig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spindle.json");
        std::fs::write(&path, format!(r#"{{"store": {store}}}"#)).unwrap();
        LoadedConfig::discover(Some(&path)).unwrap()
    }

    #[test]
    fn reads_ttl_and_index() {
        let store = store_config(&config(
            r#"{"ttl": {"default_ttl": 5, "refresh_on_read": false, "sweep_interval_minutes": 0.5},
                "index": {"dims": 16, "embed": "spindle:hash", "fields": ["text"]}}"#,
        ))
        .unwrap();
        assert_eq!(store.default_ttl, Some(5.0));
        assert!(!store.refresh_on_read);
        assert_eq!(store.sweep_every, Duration::from_secs(30));
        let index = store.index.unwrap();
        assert_eq!(
            (index.dims, index.fields.clone()),
            (16, vec!["text".to_owned()])
        );
        let plain = store_config(&LoadedConfig::default()).unwrap();
        assert!(plain.refresh_on_read && plain.index.is_none() && plain.default_ttl.is_none());
    }

    #[test]
    fn refuses_bad_settings() {
        for bad in [
            r#"{"ttl": {"default_ttl": -1}}"#,
            r#"{"ttl": {"sweep_interval_minutes": 0}}"#,
            r#"{"index": {"dims": 0, "embed": "spindle:hash"}}"#,
            r#"{"index": {"dims": 4, "embed": "./embed.py:embed"}}"#,
            r#"{"index": {"dims": 4, "embed": "openai:"}}"#,
        ] {
            assert!(store_config(&config(bad)).is_err(), "{bad}");
        }
    }
}
