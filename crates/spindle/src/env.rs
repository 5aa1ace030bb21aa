//! The config file's `env` (a dotenv file or a map) as the whole server's environment, as
//! LangGraph Platform loads it before the graphs: graph files' model settings
//! (`api_key_env`, `base_url_env`, ...), the store's embedder, `auth`'s `key_env`/`secret_env`,
//! OpenTelemetry's variables and the Python workers (which inherit it) all see it. A variable
//! the real environment already has wins, as with python-dotenv's default (`override=False`).

use std::collections::BTreeMap;

use anyhow::{bail, Result};

use crate::config::LoadedConfig;

/// Puts the config's `env` into this process's environment and returns the names it set
/// (those the environment did not have).
///
/// Why `set_var` rather than passing the values to every reader: the readers are many and
/// some are not ours (reqwest's proxy settings, the OTLP exporter, the Python workers'
/// inherited environment), so an explicit lookup would miss some. `set_var` is sound only
/// while no other thread may read the environment at the same time (libc's `getenv` is not
/// synchronised with `setenv`), so this is called from `main` before the tokio runtime, the
/// telemetry exporter or any worker starts a thread, and never again.
pub fn load(config: &LoadedConfig) -> Result<Vec<String>> {
    let missing = to_set(config.env_variables()?, |name| {
        std::env::var_os(name).is_some()
    })?;
    let names = missing.iter().map(|(name, _)| name.clone()).collect();
    for (name, value) in missing {
        std::env::set_var(name, value);
    }
    Ok(names)
}

/// The variables of `env` that the environment (`is_set`) lacks, after checking that every
/// one can be set at all (`set_var` panics otherwise): nothing is set unless all are valid.
fn to_set(
    vars: BTreeMap<String, String>,
    is_set: impl Fn(&str) -> bool,
) -> Result<Vec<(String, String)>> {
    for (name, value) in &vars {
        if name.is_empty() || name.contains(['=', '\0']) {
            bail!("env: {name:?} is not a variable name (empty, or with `=` or a NUL byte)");
        }
        if value.contains('\0') {
            bail!("env: the value of `{name}` holds a NUL byte");
        }
    }
    Ok(vars.into_iter().filter(|(name, _)| !is_set(name)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_real_environment_wins() {
        let set = to_set(vars(&[("A", "file"), ("B", "file")]), |name| name == "A").unwrap();
        assert_eq!(set, vec![("B".to_owned(), "file".to_owned())]);
    }

    #[test]
    fn a_variable_that_cannot_be_set_is_refused_naming_it_and_nothing_is_set() {
        for bad in [vars(&[("A=B", "1"), ("C", "1")]), vars(&[("", "1")])] {
            let err = to_set(bad, |_| false).unwrap_err().to_string();
            assert!(err.contains("is not a variable name"), "{err}");
        }
        let err = to_set(vars(&[("KEY", "a\0b")]), |_| false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`KEY`"), "{err}");
    }
}
