//! `spindle check FILE...`: validates graph files and config files without starting a server,
//! so an author (or a CI step) learns what a server would refuse before starting one.
//!
//! A file is a config file when it is JSON with `graphs` or `dependencies` and no `nodes` (a
//! `langgraph.json`); every other file is a graph file. A config file is checked as a server
//! reads it (its keys and `http`, `cors` and `auth` sections), and so is every graph file it
//! names; its Python graphs are imported in a Python worker, as `serve` imports them
//! (`check_python`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::check_python;
use crate::config::LoadedConfig;
use crate::graphs;
use spindle_execution::python::GraphLoad;

/// Checks every file, printing one line per file (and per graph of a config file); fails when
/// any file does.
pub fn run(files: &[std::path::PathBuf], python: Option<&Path>) -> ExitCode {
    let mut failed = 0;
    for file in files {
        match check_file(file, python) {
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
fn check_file(path: &Path, python: Option<&Path>) -> Result<Vec<String>> {
    if is_config_file(path) {
        check_config(path, python)
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

fn check_config(path: &Path, python: Option<&Path>) -> Result<Vec<String>> {
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
    let mut python_graphs = BTreeMap::new();
    for (id, source) in &config.file.graphs {
        if graphs::is_python_graph(source) {
            check_python_file(&config, id, source)?;
            python_graphs.insert(id.clone(), source.clone());
        } else {
            lines.push(check_graph_file(&config, id, source)?);
        }
    }
    if !python_graphs.is_empty() {
        let report = check_python::import(&config, &python_graphs, python)?;
        for (id, source) in &python_graphs {
            lines.push(describe_python_graph(id, source, report.graphs.get(id))?);
        }
    }
    Ok(lines)
}

/// A Python graph's file must exist (said before a worker starts for nothing).
fn check_python_file(config: &LoadedConfig, id: &str, source: &str) -> Result<()> {
    let (target, _) = source.rsplit_once(':').unwrap_or((source, ""));
    if target.ends_with(".py") && !config.resolve(target).is_file() {
        bail!("graph '{id}': the Python file {target} does not exist");
    }
    Ok(())
}

/// How a Python graph imported, or why `serve` would refuse it (as `serve` says it).
fn describe_python_graph(id: &str, source: &str, load: Option<&GraphLoad>) -> Result<String> {
    let load = match load {
        Some(load) if load.ok => load,
        Some(load) => {
            let error = load.error.as_deref().unwrap_or("it failed to load");
            let traceback = load.traceback.as_deref().unwrap_or_default();
            bail!("graph '{id}' ({source}) failed to import: {error}\n{traceback}");
        }
        None => bail!("graph '{id}' ({source}): the Python worker did not report it"),
    };
    let kind = match load.kind {
        Some(spindle_execution::python::GraphKind::Factory) => "graph factory",
        Some(spindle_execution::python::GraphKind::StateGraph) => "StateGraph",
        _ => "compiled graph",
    };
    let name = load
        .name
        .as_deref()
        .map(|name| format!(" `{name}`"))
        .unwrap_or_default();
    Ok(format!(
        "graph '{id}': Python {kind}{name} {source}, imported"
    ))
}

/// A graph file of a config file, compiled.
fn check_graph_file(config: &LoadedConfig, id: &str, source: &str) -> Result<String> {
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
