//! `spindle dev` reloads the project's graphs when their files change, as `langgraph dev`
//! does. Python graphs: new workers load the changed code, and runs in flight on the old ones
//! resume on the new ones from their last checkpoint. Graph files: the changed file is read
//! again and its graph takes the old one's place for new runs (runs in flight finish on the
//! version they started with); a file that no longer loads keeps the old version serving. A
//! graph file is also read again when a graph file it imports changes (`graphs: {x: ./x.yaml}`,
//! also outside the project), and what it imports is learnt again at each reload.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use notify_debouncer_mini::notify::{RecursiveMode, Watcher};
use notify_debouncer_mini::{new_debouncer, DebounceEventResult};
use spindle_execution::python::pool::PythonPool;
use spindle_execution::GraphRegistry;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::graphs::GraphFile;

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
    /// The graph files and the files each one's graph was compiled from (as last loaded: a
    /// reload learns them again, since what a file imports can change).
    graph_files: Mutex<Vec<GraphFile>>,
}

impl Reloadable {
    pub fn new(
        pool: Option<Arc<PythonPool>>,
        registry: Arc<GraphRegistry>,
        graph_files: Vec<GraphFile>,
    ) -> Self {
        Self {
            pool,
            registry,
            graph_files: Mutex::new(graph_files),
        }
    }

    /// Whether a changed path means some graph may have changed: a graph file or a graph
    /// file one imports, or (with Python graphs) a Python file outside the folders of tools
    /// and data.
    fn reloads(&self, path: &Path) -> bool {
        self.graph_files()
            .iter()
            .any(|graph| graph.path == path || graph.files.iter().any(|f| f == path))
            || (self.pool.is_some() && python_source(path))
    }

    fn graph_files(&self) -> std::sync::MutexGuard<'_, Vec<GraphFile>> {
        // A panic while holding the lock leaves the list as whole as before it.
        self.graph_files
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The folders holding imported graph files outside `project_dir` (which is watched
    /// whole): each is watched too, without its subfolders.
    fn folders_outside(&self, project_dir: &Path) -> BTreeSet<PathBuf> {
        self.graph_files()
            .iter()
            .flat_map(|graph| &graph.files)
            .filter(|file| !file.starts_with(project_dir))
            .filter_map(|file| file.parent().map(Path::to_path_buf))
            .collect()
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
    let mut outside = BTreeSet::new();
    watch_outside(
        debouncer.watcher(),
        &mut outside,
        reloadable.folders_outside(&project_dir),
    );
    tokio::spawn(async move {
        // The debouncer stops when dropped: it lives as long as this task.
        let mut debouncer = debouncer;
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
            watch_outside(
                debouncer.watcher(),
                &mut outside,
                reloadable.folders_outside(&project_dir),
            );
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

/// Watches the folders in `wanted` (outside the project) that are not watched yet, and stops
/// watching those no longer wanted; `watched` is what is watched.
fn watch_outside(
    watcher: &mut dyn Watcher,
    watched: &mut BTreeSet<PathBuf>,
    wanted: BTreeSet<PathBuf>,
) {
    for dir in watched.difference(&wanted) {
        let _ = watcher.unwatch(dir);
    }
    for dir in wanted.difference(watched) {
        match watcher.watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), "watching imported graph files outside the project")
            }
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot watch imported graph files for changes")
            }
        }
    }
    *watched = wanted;
}

/// Reads each graph file again whose file, or a graph file it imports, changed, swaps its
/// graph in, and learns again which files it imports.
fn reload_graph_files(reloadable: &Reloadable, changed: &[PathBuf]) {
    let touched: Vec<GraphFile> = reloadable
        .graph_files()
        .iter()
        .filter(|graph| {
            changed
                .iter()
                .any(|c| *c == graph.path || graph.files.contains(c))
        })
        .cloned()
        .collect();
    for graph in touched {
        let (graph_id, file) = (&graph.id, &graph.path);
        let loaded = spindle_graph::spec::load_file_with_imports(file);
        let files = match loaded.graph {
            Ok(new) => {
                reloadable.registry.replace(graph_id, new);
                tracing::info!(graph_id = %graph_id, file = %file.display(), "graph file changed; new runs use the new version");
                loaded.files
            }
            Err(error) => {
                tracing::error!(
                    graph_id = %graph_id,
                    file = %file.display(),
                    error = format!("{error:#}"),
                    "graph file changed but does not load; the version from before keeps serving"
                );
                // The files read before the error and the ones from before: a fix to any
                // of them reloads.
                let mut files = graph.files.clone();
                for f in loaded.files {
                    if !files.contains(&f) {
                        files.push(f);
                    }
                }
                files
            }
        };
        if let Some(known) = reloadable
            .graph_files()
            .iter_mut()
            .find(|g| g.id == graph.id)
        {
            known.files = files;
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
        let reloadable = Reloadable::new(
            None,
            Arc::new(GraphRegistry::new()),
            vec![GraphFile {
                id: "chain".into(),
                path: PathBuf::from("/p/graphs/chain.yaml"),
                files: vec![PathBuf::from("/p/graphs/chain.yaml")],
            }],
        );
        assert!(reloadable.reloads(Path::new("/p/graphs/chain.yaml")));
        assert!(!reloadable.reloads(Path::new("/p/graphs/other.yaml")));
        // Without Python graphs there are no workers to reload.
        assert!(!reloadable.reloads(Path::new("/p/src/agent/graph.py")));
    }

    /// A graph file whose imported file changes is read again, and what it imports is learnt
    /// again: an import added by the change is followed, one it removed no longer is.
    #[test]
    fn imported_graph_files_reload_and_are_learnt_again() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("project");
        let shared = dir.path().join("shared");
        std::fs::create_dir_all(&project).unwrap();
        std::fs::create_dir_all(&shared).unwrap();
        let child = |n: u32| {
            format!(
                "state: {{n: {{type: integer, default: 0}}}}\nnodes:\n  step: {{kind: script, code: '#{{ n: (state.n ?? 0) + {n} }}'}}\nedges:\n  - {{from: __start__, to: step}}\n  - {{from: step, to: __end__}}\n"
            )
        };
        let parent = |import: &str| {
            format!(
                "state: {{n: {{type: integer, default: 0}}}}\ngraphs:\n  child: {import}\nnodes:\n  child: {{kind: subgraph, graph: child}}\nedges:\n  - {{from: __start__, to: child}}\n  - {{from: child, to: __end__}}\n"
            )
        };
        std::fs::write(project.join("child.yaml"), child(1)).unwrap();
        std::fs::write(shared.join("other.yaml"), child(2)).unwrap();
        let main = project.join("main.yaml");
        std::fs::write(&main, parent("./child.yaml")).unwrap();
        let main = std::fs::canonicalize(&main).unwrap();
        let project = std::fs::canonicalize(&project).unwrap();
        let shared = std::fs::canonicalize(&shared).unwrap();

        let loaded = spindle_graph::spec::load_file_with_imports(&main);
        let mut registry = GraphRegistry::new();
        registry.insert("main", loaded.graph.unwrap());
        assert_eq!(loaded.files, vec![main.clone(), project.join("child.yaml")]);
        let reloadable = Reloadable::new(
            None,
            Arc::new(registry),
            vec![GraphFile {
                id: "main".into(),
                path: main.clone(),
                files: loaded.files,
            }],
        );
        assert!(reloadable.reloads(&project.join("child.yaml")));
        assert!(!reloadable.reloads(&shared.join("other.yaml")));
        assert!(reloadable.folders_outside(&project).is_empty());

        // The imported file changes: the graph is loaded again.
        let before = reloadable.registry.get("main").unwrap();
        std::fs::write(project.join("child.yaml"), child(3)).unwrap();
        reload_graph_files(&reloadable, &[project.join("child.yaml")]);
        let after = reloadable.registry.get("main").unwrap();
        assert!(!Arc::ptr_eq(&before, &after), "not reloaded");

        // The main file now imports a file outside the project.
        std::fs::write(&main, parent("../shared/other.yaml")).unwrap();
        reload_graph_files(&reloadable, std::slice::from_ref(&main));
        assert!(reloadable.reloads(&shared.join("other.yaml")));
        assert!(!reloadable.reloads(&project.join("child.yaml")));
        assert_eq!(
            reloadable.folders_outside(&project),
            BTreeSet::from([shared.clone()])
        );

        // A broken imported file keeps the graph and the files it was compiled from.
        std::fs::write(shared.join("other.yaml"), "nodes: [broken").unwrap();
        let before = reloadable.registry.get("main").unwrap();
        reload_graph_files(&reloadable, &[shared.join("other.yaml")]);
        assert!(reloadable.reloads(&shared.join("other.yaml")));
        let after = reloadable.registry.get("main").unwrap();
        assert!(
            Arc::ptr_eq(&before, &after),
            "a broken file replaced the graph"
        );
    }
}
