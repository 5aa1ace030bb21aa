//! Starts the Python workers of a project whose config names Python graphs, and records how
//! each graph loaded in the registry.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use spindle_execution::graphs::PythonGraph;
use spindle_execution::python::calls::SpindleCalls;
use spindle_execution::python::pool::{PoolSettings, PythonPool};
use spindle_execution::python::process::GraphKind;
use spindle_execution::python::{check_interpreter, choose_interpreter};
use spindle_execution::{GraphRegistry, StoreConfig};
use spindle_storage::Storage;

use crate::cli::ServerArgs;
use crate::config::LoadedConfig;
use crate::Mode;

/// Runs each worker executes at once unless set: LangGraph Platform's default.
const DEFAULT_RUNS_PER_WORKER: u32 = 10;

/// Starts the pool for `specs` (graph id -> Python spec) and adds the graphs to `registry`.
/// A graph that fails to import stops `serve` (with its traceback); `dev` starts, and that
/// graph's runs fail with the import error.
pub async fn start(
    args: &ServerArgs,
    config: &LoadedConfig,
    mode: Mode,
    specs: BTreeMap<String, String>,
    storage: Arc<dyn Storage>,
    store: StoreConfig,
    registry: &mut GraphRegistry,
) -> Result<Arc<PythonPool>> {
    let project_dir = config.base_dir();
    // The config's `env` is in this process's environment already (`env::load`, under the
    // variables set before it), which the workers inherit; only the path is added.
    let mut env = BTreeMap::new();
    if let Some(path) = config.worker_python_path(&env) {
        env.insert("PYTHONPATH".into(), path);
    }
    let setting = args.python.clone().or(config.file.server.python.clone());
    let interpreter = choose_interpreter(setting.as_deref(), &project_dir);
    let info = check_interpreter(&interpreter, &project_dir, &env)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let settings = PoolSettings {
        python: interpreter.program.clone(),
        project_dir,
        env,
        graphs: specs.clone(),
        auth: config.custom_auth(),
        workers: workers(args, config, mode),
        runs_per_worker: args
            .python_runs_per_worker
            .or(config.file.server.python_runs_per_worker)
            .unwrap_or(DEFAULT_RUNS_PER_WORKER)
            .max(1),
        recycle_after_runs: args
            .python_recycle_after_runs
            .or(config.file.server.python_recycle_after_runs),
        max_rss_bytes: args
            .python_max_memory_mb
            .or(config.file.server.python_max_memory_mb)
            .map(|mb| mb.saturating_mul(1024 * 1024)),
        ping_every: PoolSettings::PING_EVERY,
        missed_pings: PoolSettings::MISSED_PINGS,
    };
    let workers = settings.workers;
    let calls = Arc::new(SpindleCalls::new(storage, store));
    let (pool, report) = PythonPool::start(settings, calls)
        .await
        .context("cannot start the Python workers")?;
    tracing::info!(python = %info.python, langgraph = %info.langgraph, interpreter = %interpreter.program.display(), workers, "Python workers ready");
    if let Some(load) = &report.auth {
        if !load.ok {
            // Never serve without the authentication the config asks for.
            let error = load.error.as_deref().unwrap_or("it failed to load");
            let traceback = load.traceback.as_deref().unwrap_or_default();
            bail!("the custom auth (auth.path) failed to load: {error}\n{traceback}");
        }
    }
    for (graph_id, spec) in specs {
        let load = report.graphs.get(&graph_id);
        let error = match load {
            Some(load) if load.ok => None,
            Some(load) => Some(
                load.error
                    .clone()
                    .unwrap_or_else(|| "it failed to load".into()),
            ),
            None => Some("the worker did not report it".into()),
        };
        if let Some(error) = &error {
            let traceback = load
                .and_then(|l| l.traceback.as_deref())
                .unwrap_or_default();
            if mode == Mode::Serve {
                bail!("graph '{graph_id}' ({spec}) failed to import: {error}\n{traceback}");
            }
            tracing::error!(graph_id = %graph_id, spec = %spec, %error, "graph failed to import; its runs will fail until it is fixed\n{traceback}");
        }
        let kind = load.and_then(|l| l.kind).map(kind_name);
        let name = load.and_then(|l| l.name.clone());
        let graph = PythonGraph {
            spec,
            kind,
            error,
            name,
        };
        registry.insert_python(graph_id, graph);
    }
    Ok(pool)
}

fn workers(args: &ServerArgs, config: &LoadedConfig, mode: Mode) -> usize {
    let set = args
        .python_workers
        .map(|n| n as usize)
        .or(config.file.server.python_workers);
    match (set, mode) {
        (Some(n), _) => n.max(1),
        (None, Mode::Dev) => 1,
        (None, Mode::Serve) => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(4),
    }
}

fn kind_name(kind: GraphKind) -> String {
    match kind {
        GraphKind::Compiled => "compiled graph",
        GraphKind::StateGraph => "StateGraph",
        GraphKind::Factory => "factory",
        GraphKind::Other => "python",
    }
    .to_owned()
}
