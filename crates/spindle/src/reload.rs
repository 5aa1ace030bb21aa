//! `spindle dev` reloads the project's graphs when their files change, as `langgraph dev`
//! does. Python graphs: new workers load the changed code, and runs in flight on the old ones
//! resume on the new ones from their last checkpoint. Graph files: the changed file is read
//! again and its graph takes the old one's place for new runs (runs in flight finish on the
//! version they started with); a file that no longer loads keeps the old version serving.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use notify_debouncer_mini::notify::RecursiveMode;
use notify_debouncer_mini::{new_debouncer, DebounceEventResult};
use spindle_execution::python::pool::PythonPool;
use spindle_execution::GraphRegistry;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Changes closer together than this make one reload (an editor saving several files).
const DEBOUNCE: Duration = Duration::from_millis(400);

/// Folders whose changes never mean the graphs changed.
const IGNORED_DIRS: [&str; 7] = [
    ".venv",
    "venv",
    "__pycache__",
    ".git",
    "node_modules",
    ".spindle",
    ".langgraph_api",
];

/// What a change can reload.
pub struct Reloadable {
    /// The Python workers, when the project has Python graphs.
    pub pool: Option<Arc<PythonPool>>,
    /// The registry the graph files' graphs are swapped into.
    pub registry: Arc<GraphRegistry>,
    /// Each graph file's graph id and path (absolute).
    pub graph_files: Vec<(String, PathBuf)>,
}

impl Reloadable {
    /// Whether a changed path means some graph may have changed: a graph file, or (with
    /// Python graphs) a Python file outside the folders of tools and data.
    fn reloads(&self, path: &Path) -> bool {
        self.graph_files.iter().any(|(_, file)| file == path)
            || (self.pool.is_some() && python_source(path))
    }
}

/// Watches `project_dir` until `shutdown`; each batch of changes reloads what it touches.
/// (The config file and its `env` are read at start: a change to them needs a restart, as
/// with `langgraph dev`.)
pub fn watch(
    project_dir: PathBuf,
    reloadable: Reloadable,
    shutdown: CancellationToken,
) -> Result<()> {
    // Absolute, as the graph files' paths are: the watcher reports paths under this one.
    let project_dir = std::fs::canonicalize(&project_dir).unwrap_or(project_dir);
    let reloadable = Arc::new(reloadable);
    let (changed, mut changes) = mpsc::unbounded_channel::<Vec<PathBuf>>();
    let filter = reloadable.clone();
    let mut debouncer = new_debouncer(DEBOUNCE, move |events: DebounceEventResult| match events {
        Ok(events) => {
            let paths: Vec<PathBuf> = events
                .into_iter()
                .map(|e| e.path)
                .filter(|p| filter.reloads(p))
                .collect();
            if !paths.is_empty() {
                let _ = changed.send(paths);
            }
        }
        Err(error) => tracing::warn!(%error, "watching the project's files failed"),
    })
    .context("cannot watch the project's files for changes")?;
    debouncer
        .watcher()
        .watch(&project_dir, RecursiveMode::Recursive)
        .with_context(|| format!("cannot watch {} for changes", project_dir.display()))?;
    tracing::info!(dir = %project_dir.display(), "watching the project's graph files; a change reloads the graphs");
    tokio::spawn(async move {
        // The debouncer stops when dropped: it lives as long as this task.
        let _debouncer = debouncer;
        let mut modified = Modified::since(SystemTime::now());
        loop {
            let paths = tokio::select! {
                paths = changes.recv() => match paths {
                    Some(paths) => paths,
                    None => return,
                },
                () = shutdown.cancelled() => return,
            };
            let changed = modified.changed(paths);
            reload_graph_files(&reloadable, &changed);
            if let Some(pool) = &reloadable.pool {
                let python: Vec<PathBuf> =
                    changed.into_iter().filter(|p| python_source(p)).collect();
                if !python.is_empty() {
                    reload_python(pool, &python).await;
                }
            }
        }
    });
    Ok(())
}

/// The files' modification times as last seen. The watcher reports reads too (new workers
/// importing the graphs would reload them again, forever), so only a file whose modification
/// time moved counts as changed.
struct Modified {
    since: SystemTime,
    seen: HashMap<PathBuf, SystemTime>,
}

impl Modified {
    fn since(since: SystemTime) -> Self {
        Self {
            since,
            seen: HashMap::new(),
        }
    }

    /// The paths written since they were last seen (or since the watch began); a removed
    /// file counts as changed.
    fn changed(&mut self, paths: Vec<PathBuf>) -> Vec<PathBuf> {
        paths
            .into_iter()
            .filter(|path| {
                let Ok(now) = std::fs::metadata(path).and_then(|m| m.modified()) else {
                    return self.seen.remove(path).is_some();
                };
                let before = self.seen.insert(path.clone(), now);
                match before {
                    Some(before) => before != now,
                    None => now > self.since,
                }
            })
            .collect()
    }
}

/// Reads each changed graph file again and swaps its graph in.
fn reload_graph_files(reloadable: &Reloadable, changed: &[PathBuf]) {
    for (graph_id, file) in &reloadable.graph_files {
        if !changed.contains(file) {
            continue;
        }
        match spindle_graph::spec::load_file(file) {
            Ok(graph) => {
                reloadable.registry.replace(graph_id, graph);
                tracing::info!(graph_id = %graph_id, file = %file.display(), "graph file changed; new runs use the new version");
            }
            Err(error) => tracing::error!(
                graph_id = %graph_id,
                file = %file.display(),
                error = format!("{error:#}"),
                "graph file changed but does not load; the version from before keeps serving"
            ),
        }
    }
}

async fn reload_python(pool: &Arc<PythonPool>, paths: &[PathBuf]) {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    tracing::info!(changed = ?shown, "project files changed; reloading the Python graphs");
    match pool.reload().await {
        Ok(report) => {
            for (graph_id, load) in &report.graphs {
                if !load.ok {
                    let error = load.error.as_deref().unwrap_or("it failed to load");
                    let traceback = load.traceback.as_deref().unwrap_or_default();
                    tracing::error!(graph_id = %graph_id, %error, "graph failed to import after the change; its runs fail until it is fixed\n{traceback}");
                }
            }
            tracing::info!(graphs = report.graphs.len(), "Python graphs reloaded");
        }
        Err(error) => {
            tracing::error!(%error, "cannot reload the Python graphs; the workers from before keep running")
        }
    }
}

/// A Python source file outside the folders of tools and data.
fn python_source(path: &Path) -> bool {
    let ignored = path.components().any(|c| {
        c.as_os_str()
            .to_str()
            .is_some_and(|name| IGNORED_DIRS.contains(&name))
    });
    let python = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|name| name.ends_with(".py"));
    python && !ignored
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads are reported like writes; only a file whose modification time moved reloads.
    #[test]
    fn only_written_files_count_as_changed() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.py");
        std::fs::write(&old, "x = 1").unwrap();
        let mut modified = Modified::since(SystemTime::now() + Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            modified.changed(vec![old.clone()]).is_empty(),
            "read, not written"
        );
        std::fs::write(&old, "x = 2").unwrap();
        assert_eq!(modified.changed(vec![old.clone()]), vec![old.clone()]);
        assert!(modified.changed(vec![old.clone()]).is_empty(), "read again");
        std::fs::remove_file(&old).unwrap();
        assert_eq!(modified.changed(vec![old.clone()]), vec![old]);
    }

    #[test]
    fn python_files_reload_and_tool_folders_do_not() {
        assert!(python_source(Path::new("/p/src/agent/graph.py")));
        assert!(!python_source(Path::new(
            "/p/.venv/lib/python3.11/site-packages/x.py"
        )));
        assert!(!python_source(Path::new(
            "/p/src/__pycache__/graph.cpython-311.pyc"
        )));
        assert!(!python_source(Path::new("/p/.spindle/spindle.db")));
        assert!(!python_source(Path::new("/p/README.md")));
    }

    #[test]
    fn graph_files_reload_without_python_graphs() {
        let reloadable = Reloadable {
            pool: None,
            registry: Arc::new(GraphRegistry::new()),
            graph_files: vec![("chain".into(), PathBuf::from("/p/graphs/chain.yaml"))],
        };
        assert!(reloadable.reloads(Path::new("/p/graphs/chain.yaml")));
        assert!(!reloadable.reloads(Path::new("/p/graphs/other.yaml")));
        // Without Python graphs there are no workers to reload.
        assert!(!reloadable.reloads(Path::new("/p/src/agent/graph.py")));
    }
}
