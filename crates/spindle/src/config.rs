//! The config file: `spindle.json`, or a `langgraph.json` / `aegra.json` read the same way.
//!
//! ```json
//! {
//!   "graphs": { "echo": "./graphs/echo.yaml" },
//!   "server": { "host": "0.0.0.0", "port": 8000, "database_url": "postgres://...", "data_dir": ".spindle" },
//!   "store": {}, "auth": {}, "http": {}
//! }
//! ```
//! Graph paths are relative to the config file's folder. A graph is a graph file
//! (`./graphs/echo.yaml`) or a LangGraph Python graph (`./src/agent/graph.py:graph`,
//! `package.module:graph`), run by Python workers. `env` (a dotenv file, or a map) is loaded
//! into the server's environment, which the workers inherit. Keys that LangGraph's format has
//! and Spindle does not use (`dependencies`, `python_version`, `dockerfile_lines`, ...) are
//! ignored: the user installs the graphs' dependencies, as with `langgraph dev`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

/// File names looked for in the working folder, in order, when `--config` is not given.
pub const CONFIG_CANDIDATES: [&str; 3] = ["spindle.json", "langgraph.json", "aegra.json"];

#[derive(Debug, Default, Deserialize)]
pub struct ConfigFile {
    /// Graph id -> graph file (`./graphs/echo.yaml`), relative to the config file.
    #[serde(default)]
    pub graphs: BTreeMap<String, String>,
    #[serde(default)]
    pub server: ServerSection,
    /// Long-term store settings: `ttl` and `index` (semantic search).
    #[serde(default)]
    pub store: Option<StoreSection>,
    /// Authentication settings (read by the auth layer).
    #[serde(default)]
    pub auth: Option<Value>,
    /// HTTP settings: LangGraph's keys (`cors`, `configurable_headers`, `disable_*`; see
    /// `http_section`).
    #[serde(default)]
    pub http: Option<Value>,
    /// The server's environment (and so the Python workers'): a dotenv file (relative to the
    /// config file) or a map, loaded at start-up under the variables already set (`env.rs`).
    #[serde(default)]
    pub env: Option<EnvSection>,
    /// LangGraph's `dependencies`: local folders among them (`"."`, `"./src"`) are put on the
    /// Python workers' path, as `langgraph dev` does; packages are the user's to install.
    #[serde(default)]
    pub dependencies: Vec<Value>,
    /// Every other top-level key: LangGraph's build settings are ignored, anything else is a
    /// mistake (see [`check_keys`]).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// Top-level keys of `langgraph.json` that concern LangGraph's images and cloud, not a server:
/// read and ignored.
const IGNORED_KEYS: [&str; 15] = [
    "python_version",
    "node_version",
    "api_version",
    "base_image",
    "image_distro",
    "pip_config_file",
    "pip_installer",
    "source",
    "dockerfile_lines",
    "checkpointer",
    "encryption",
    "priority",
    "webhooks",
    "ui",
    "keep_pkg_tools",
];

/// The keys Spindle reads, for suggestions.
const READ_KEYS: [&str; 7] = [
    "graphs",
    "server",
    "store",
    "auth",
    "http",
    "env",
    "dependencies",
];

/// Refuses a top-level key that is neither read nor one of LangGraph's known ones: a misspelt
/// `"grahps"` would otherwise leave a server that quietly serves something else.
fn check_keys(file: &ConfigFile) -> Result<()> {
    let unknown = file
        .other
        .keys()
        .find(|k| !k.starts_with('$') && !IGNORED_KEYS.contains(&k.as_str()));
    let Some(key) = unknown else {
        return Ok(());
    };
    let closest = READ_KEYS
        .iter()
        .chain(IGNORED_KEYS.iter())
        .map(|known| (strsim::damerau_levenshtein(key, known), *known))
        .min()
        .filter(|(distance, _)| *distance <= 2);
    match closest {
        Some((_, known)) => bail!("unknown key `{key}` (did you mean `{known}`?)"),
        None => bail!(
            "unknown key `{key}`; the keys read are {}",
            READ_KEYS.map(|k| format!("`{k}`")).join(", ")
        ),
    }
}

/// `env`, as LangGraph's `langgraph.json` spells it.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum EnvSection {
    File(String),
    Map(BTreeMap<String, String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub database_url: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub workers: Option<usize>,
    pub pg_writers: Option<u64>,
    pub run_timeout_secs: Option<u64>,
    pub max_attempts: Option<i32>,
    pub run_lease_secs: Option<u64>,
    pub shutdown_grace_secs: Option<u64>,
    pub keepalive_interval_secs: Option<u64>,
    pub header_timeout_secs: Option<u64>,
    pub max_connections: Option<u64>,
    pub event_retention_hours: Option<u64>,
    pub thread_ttl_minutes: Option<f64>,
    pub thread_ttl_strategy: Option<String>,
    pub thread_sweep_interval_secs: Option<u64>,
    pub webhook_allow_private: Option<bool>,
    /// The interpreter of the Python workers.
    pub python: Option<PathBuf>,
    pub python_workers: Option<usize>,
    pub python_runs_per_worker: Option<u32>,
    pub python_recycle_after_runs: Option<u64>,
    pub python_max_memory_mb: Option<u64>,
}

/// `store`, as LangGraph's `langgraph.json` spells it.
#[derive(Debug, Default, Deserialize)]
pub struct StoreSection {
    #[serde(default)]
    pub ttl: Option<StoreTtlSection>,
    #[serde(default)]
    pub index: Option<StoreIndexSection>,
}

/// `store.ttl`: minutes, fractions allowed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreTtlSection {
    /// The TTL of items put without one.
    pub default_ttl: Option<f64>,
    /// Whether reads restart an item's TTL unless they say otherwise (default true).
    pub refresh_on_read: Option<bool>,
    /// How often expired items are removed (default 60).
    pub sweep_interval_minutes: Option<f64>,
}

/// `store.index`: what makes items searchable by meaning.
#[derive(Debug, Deserialize)]
pub struct StoreIndexSection {
    /// Length of the embeddings.
    pub dims: usize,
    /// The embedder: `openai:<model>` (any OpenAI-compatible endpoint: `OPENAI_BASE_URL`,
    /// `OPENAI_API_KEY`), `local:<folder>` (a MiniLM model on disk; needs the
    /// `local-embeddings` build), `spindle:hash` (deterministic, for tests); or an object
    /// `{provider, model, base_url, api_key_env, path}`.
    pub embed: EmbedSpec,
    /// Paths embedded by default (default `["$"]`, the whole value).
    #[serde(default)]
    pub fields: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbedSpec {
    Name(String),
    Detailed {
        provider: String,
        #[serde(default)]
        model: Option<String>,
        #[serde(default)]
        base_url: Option<String>,
        /// The environment variable holding the API key (default `OPENAI_API_KEY`).
        #[serde(default)]
        api_key_env: Option<String>,
        /// The model folder of the `local` provider.
        #[serde(default)]
        path: Option<PathBuf>,
    },
}

/// A config file and the folder its relative paths start from.
#[derive(Debug, Default)]
pub struct LoadedConfig {
    pub path: Option<PathBuf>,
    pub file: ConfigFile,
}

impl LoadedConfig {
    /// Reads `explicit` when given (it must exist), else the first candidate file present in
    /// the working folder, else nothing.
    pub fn discover(explicit: Option<&Path>) -> Result<Self> {
        let path = match explicit {
            Some(path) => Some(path.to_path_buf()),
            None => CONFIG_CANDIDATES
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file()),
        };
        match path {
            Some(path) => Self::read(&path),
            None => Ok(Self::default()),
        }
    }

    fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        let file: ConfigFile = serde_json::from_str(&text)
            .with_context(|| format!("config file {} is not valid", path.display()))?;
        check_keys(&file).with_context(|| format!("config file {}", path.display()))?;
        crate::http_section::check_keys(file.http.as_ref())
            .with_context(|| format!("config file {}", path.display()))?;
        if let Some(bad) = file.graphs.keys().find(|id| id.is_empty()) {
            bail!("config file {}: graph id {bad:?} is empty", path.display());
        }
        Ok(Self {
            path: Some(path.to_path_buf()),
            file,
        })
    }

    /// The folder the file's relative paths start from: a Python project's directory. Absolute:
    /// the Python workers run in it, and resolve the graphs' paths from there.
    pub fn base_dir(&self) -> PathBuf {
        let base = self
            .path
            .as_deref()
            .and_then(Path::parent)
            .filter(|base| !base.as_os_str().is_empty())
            .unwrap_or_else(|| Path::new("."));
        std::path::absolute(base).unwrap_or_else(|_| base.to_path_buf())
    }

    /// The rest of `http`: route groups turned off, headers copied into runs, webhooks off.
    pub fn http(&self) -> Result<spindle_server::http_config::HttpConfig> {
        let file = self.display_name();
        crate::http_section::settings(self.file.http.as_ref())
            .with_context(|| format!("config file {file}"))
    }

    /// `http.cors`, when the file has one (LangGraph's keys; an unknown one is an error).
    pub fn cors(&self) -> Result<Option<spindle_server::cors::Cors>> {
        let Some(cors) = self.file.http.as_ref().and_then(|http| http.get("cors")) else {
            return Ok(None);
        };
        let parsed = serde_json::from_value(cors.clone());
        let file = self.display_name();
        parsed
            .map(Some)
            .with_context(|| format!("config file {file}: http.cors is not valid"))
    }

    /// The `auth` section's authentication, when the file has one. Environment variables it
    /// names (`key_env`, `secret_env`) are read from the process, where `env::load` has put
    /// the file's `env` at start-up.
    pub fn auth(&self) -> Result<Option<spindle_server::auth::Auth>> {
        let Some(section) = &self.file.auth else {
            return Ok(None);
        };
        let file = self.display_name();
        let config: spindle_server::auth::AuthConfig = serde_json::from_value(section.clone())
            .with_context(|| format!("config file {file}: auth is not valid"))?;
        let read = |name: &str| std::env::var(name).ok();
        let auth = config
            .build(&self.base_dir(), &read)
            .with_context(|| format!("config file {file}: auth cannot be used"))?;
        Ok(Some(auth))
    }

    /// `auth.path`: LangGraph's custom auth, a Python `Auth` object the workers load.
    pub fn custom_auth(&self) -> Option<String> {
        let path = self.file.auth.as_ref()?.get("path")?.as_str()?;
        Some(path.to_owned())
    }

    fn display_name(&self) -> String {
        self.path
            .as_deref()
            .map_or_else(|| "the config".to_owned(), |p| p.display().to_string())
    }

    /// The variables of `env`: the file's, or the map. `env::load` puts them into the
    /// process's environment at start-up.
    /// A file that does not exist has none, as with LangGraph (python-dotenv reads it as
    /// empty): a project's `"env": ".env"` whose variables are exported instead still starts
    /// (`main` warns, see [`Self::missing_env_file`]).
    pub fn env_variables(&self) -> Result<BTreeMap<String, String>> {
        match &self.file.env {
            None => Ok(BTreeMap::new()),
            Some(EnvSection::Map(map)) => Ok(map.clone()),
            Some(EnvSection::File(_)) if self.missing_env_file().is_some() => Ok(BTreeMap::new()),
            Some(EnvSection::File(file)) => {
                let path = self.resolve(file);
                let entries = dotenvy::from_path_iter(&path)
                    .with_context(|| format!("cannot read the env file {}", path.display()))?;
                entries
                    .map(|entry| {
                        entry.with_context(|| format!("env file {} is not valid", path.display()))
                    })
                    .collect()
            }
        }
    }

    /// The env file `env` names, when it does not exist.
    pub fn missing_env_file(&self) -> Option<PathBuf> {
        let Some(EnvSection::File(file)) = &self.file.env else {
            return None;
        };
        let path = self.resolve(file);
        (!path.exists()).then_some(path)
    }

    /// The `PYTHONPATH` of the Python workers: the local folders of `dependencies` (those
    /// that exist), before any `PYTHONPATH` already set (in `env`, else Spindle's own).
    pub fn worker_python_path(&self, env: &BTreeMap<String, String>) -> Option<String> {
        let mut parts: Vec<String> = self
            .file
            .dependencies
            .iter()
            .filter_map(Value::as_str)
            .map(|dep| self.resolve(dep))
            .filter(|path| path.is_dir())
            .map(|path| path.display().to_string())
            .collect();
        if parts.is_empty() {
            return None;
        }
        let existing = env
            .get("PYTHONPATH")
            .cloned()
            .or_else(|| std::env::var("PYTHONPATH").ok());
        parts.extend(existing.filter(|p| !p.is_empty()));
        Some(parts.join(":"))
    }

    /// A graph path from the file, resolved against the file's folder.
    pub fn resolve(&self, relative: &str) -> PathBuf {
        let base = self
            .path
            .as_deref()
            .and_then(Path::parent)
            .unwrap_or_else(|| Path::new("."));
        base.join(relative)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_langgraph_json_and_ignores_its_python_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("langgraph.json");
        std::fs::write(
            &path,
            r#"{"dependencies": ["."], "graphs": {"echo": "./graphs/echo.yaml"}, "env": ".env"}"#,
        )
        .unwrap();
        let config = LoadedConfig::discover(Some(&path)).unwrap();
        assert_eq!(config.file.graphs["echo"], "./graphs/echo.yaml");
        assert_eq!(
            config.resolve("./graphs/echo.yaml"),
            dir.path().join("./graphs/echo.yaml")
        );
    }

    /// A config named by a relative path (`--config project/langgraph.json`): the workers,
    /// which run in the project's folder, get that folder as an absolute path.
    #[test]
    fn the_base_dir_is_absolute() {
        let config = LoadedConfig {
            path: Some(PathBuf::from("project/langgraph.json")),
            file: ConfigFile::default(),
        };
        let base = config.base_dir();
        assert!(base.is_absolute(), "{}", base.display());
        assert!(base.ends_with("project"), "{}", base.display());
        let here = LoadedConfig {
            path: Some(PathBuf::from("langgraph.json")),
            file: ConfigFile::default(),
        };
        assert_eq!(here.base_dir(), std::env::current_dir().unwrap());
    }

    #[test]
    fn a_misspelt_or_unknown_top_level_key_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("langgraph.json");
        let read = |json: &str| {
            std::fs::write(&path, json).unwrap();
            LoadedConfig::discover(Some(&path)).map_err(|e| format!("{e:#}"))
        };
        let err = read(r#"{"grahps": {"echo": "./echo.yaml"}}"#).unwrap_err();
        assert!(
            err.contains("`grahps`") && err.contains("did you mean `graphs`"),
            "{err}"
        );
        let err = read(r#"{"graphs": {}, "colour": "blue"}"#).unwrap_err();
        assert!(
            err.contains("`colour`") && err.contains("`graphs`"),
            "{err}"
        );
        // LangGraph's build keys and a `$schema` are read and ignored.
        let ok = read(
            r#"{"$schema": "x", "graphs": {}, "python_version": "3.11", "dockerfile_lines": []}"#,
        );
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn env_is_a_dotenv_file_or_a_map() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".env"), "A=1\n# comment\nB=\"two words\"\n").unwrap();
        let path = dir.path().join("langgraph.json");
        std::fs::write(&path, r#"{"graphs": {}, "env": ".env"}"#).unwrap();
        let env = LoadedConfig::discover(Some(&path))
            .unwrap()
            .env_variables()
            .unwrap();
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "two words");

        std::fs::write(&path, r#"{"graphs": {}, "env": {"C": "3"}}"#).unwrap();
        let env = LoadedConfig::discover(Some(&path))
            .unwrap()
            .env_variables()
            .unwrap();
        assert_eq!(env["C"], "3");

        // A missing file has no variables, as in LangGraph; one that cannot be read is an
        // error naming it.
        std::fs::write(&path, r#"{"graphs": {}, "env": "missing.env"}"#).unwrap();
        let config = LoadedConfig::discover(Some(&path)).unwrap();
        assert!(config.env_variables().unwrap().is_empty());
        let missing = config.missing_env_file().unwrap();
        assert!(missing.ends_with("missing.env"), "{}", missing.display());
        std::fs::create_dir(dir.path().join("folder.env")).unwrap();
        std::fs::write(&path, r#"{"graphs": {}, "env": "folder.env"}"#).unwrap();
        let err = LoadedConfig::discover(Some(&path))
            .unwrap()
            .env_variables()
            .unwrap_err();
        assert!(format!("{err:#}").contains("folder.env"), "{err:#}");
    }

    #[test]
    fn local_dependencies_go_on_the_workers_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        let path = dir.path().join("langgraph.json");
        std::fs::write(
            &path,
            r#"{"dependencies": [".", "./src", "langchain-openai", "./missing"], "graphs": {}}"#,
        )
        .unwrap();
        let config = LoadedConfig::discover(Some(&path)).unwrap();
        let env = BTreeMap::from([("PYTHONPATH".to_owned(), "/opt/lib".to_owned())]);
        let joined = config.worker_python_path(&env).unwrap();
        let parts: Vec<&str> = joined.split(':').collect();
        assert_eq!(parts.len(), 3, "{joined}");
        assert!(parts[1].ends_with("src"), "{joined}");
        assert_eq!(parts[2], "/opt/lib");
    }

    #[test]
    fn names_the_file_when_it_is_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spindle.json");
        std::fs::write(&path, r#"{"graphs": 5}"#).unwrap();
        let err = LoadedConfig::discover(Some(&path)).unwrap_err();
        assert!(format!("{err:#}").contains("spindle.json"), "{err:#}");
    }

    #[test]
    fn refuses_unknown_server_settings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spindle.json");
        std::fs::write(&path, r#"{"server": {"prot": 1}}"#).unwrap();
        assert!(LoadedConfig::discover(Some(&path)).is_err());
    }
}
