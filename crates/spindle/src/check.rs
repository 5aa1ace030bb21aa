//! `spindle check FILE...`: validates graph files and config files without starting a server,
//! so an author (or a CI step) learns what a server would refuse before starting one.
//!
//! A file is a config file when it is JSON with `graphs` or `dependencies` and no `nodes` (a
//! `langgraph.json`); every other file is a graph file. A config file is checked as a server
//! reads it (its keys and `http`, `cors` and `auth` sections), and so is every graph file it
//! names; its Python graphs only as far as their file exists, since importing them takes the
//! Python workers.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::config::LoadedConfig;
use crate::graphs;

/// Checks every file, printing one line per file (and per graph of a config file); fails when
/// any file does.
pub fn run(files: &[std::path::PathBuf]) -> ExitCode {
    let mut failed = 0;
    for file in files {
        match check_file(file) {
            Ok(lines) => lines.iter().for_each(|line| println!("ok: {line}")),
            Err(err) => {
                failed += 1;
                eprintln!("error: {err:#}");
            }
        }
    }
    if failed > 0 {
        eprintln!("{failed} of {} file(s) failed the check", files.len());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// What was checked in `path`, one line each, or why it cannot be used.
fn check_file(path: &Path) -> Result<Vec<String>> {
    if is_config_file(path) {
        check_config(path)
    } else {
        let graph = spindle_graph::spec::load_file(path)?;
        Ok(vec![describe_graph(path, &graph)])
    }
}

fn is_config_file(path: &Path) -> bool {
    let Some(Value::Object(doc)) = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
    else {
        return false;
    };
    !doc.contains_key("nodes") && (doc.contains_key("graphs") || doc.contains_key("dependencies"))
}

fn check_config(path: &Path) -> Result<Vec<String>> {
    let config = LoadedConfig::discover(Some(path))?;
    let name = path.display();
    config
        .http()
        .with_context(|| format!("config file {name}"))?;
    config
        .cors()
        .with_context(|| format!("config file {name}"))?;
    config
        .auth()
        .with_context(|| format!("config file {name}"))?;
    let mut lines = vec![format!(
        "{name}: config file, {} graph(s)",
        config.file.graphs.len()
    )];
    for (id, source) in &config.file.graphs {
        lines.push(check_config_graph(&config, id, source)?);
    }
    Ok(lines)
}

/// One graph of a config file: a graph file is compiled; a Python graph's file must exist.
fn check_config_graph(config: &LoadedConfig, id: &str, source: &str) -> Result<String> {
    if graphs::is_python_graph(source) {
        let (target, _) = source.rsplit_once(':').unwrap_or((source, ""));
        if target.ends_with(".py") && !config.resolve(target).is_file() {
            bail!("graph '{id}': the Python file {target} does not exist");
        }
        return Ok(format!(
            "graph '{id}': Python graph {source} (its code is checked when the workers import it)"
        ));
    }
    let path = config.resolve(source);
    let graph = spindle_graph::spec::load_file(&path)
        .with_context(|| format!("cannot load graph '{id}'"))?;
    Ok(format!("graph '{id}': {}", describe_graph(&path, &graph)))
}

fn describe_graph(path: &Path, graph: &spindle_graph::Graph) -> String {
    format!(
        "{}: graph `{}`, {} node(s)",
        path.display(),
        graph.name(),
        graph.node_names().count()
    )
}
