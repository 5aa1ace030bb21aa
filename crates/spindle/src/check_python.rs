//! `spindle check`'s Python graphs: imported in a Python worker as `serve` imports them (the
//! same interpreter choice, `PYTHONPATH`, config `env` and custom auth), so a graph `serve`
//! would refuse (a misspelt variable, a module that fails to import) fails the check too.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use futures::future::BoxFuture;
use rmpv::Value;
use spindle_execution::python::{
    check_interpreter, choose_interpreter, InitReport, RemoteError, Reply, WorkerCalls,
    WorkerProcess, WorkerSpec,
};

use crate::config::LoadedConfig;

/// How long the worker gets to exit once the check has its answer.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Imports `specs` (graph id -> spec) and the config's custom auth in one worker; an error
/// when the interpreter cannot run workers or the auth fails to load.
pub fn import(
    config: &LoadedConfig,
    specs: &BTreeMap<String, String>,
    python: Option<&Path>,
) -> Result<InitReport> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let report = runtime.block_on(import_in_worker(config, specs, python))?;
    if let Some(auth) = report.auth.as_ref().filter(|load| !load.ok) {
        let error = auth.error.as_deref().unwrap_or("it failed to load");
        let traceback = auth.traceback.as_deref().unwrap_or_default();
        bail!("the custom auth (auth.path) failed to load: {error}\n{traceback}");
    }
    Ok(report)
}

async fn import_in_worker(
    config: &LoadedConfig,
    specs: &BTreeMap<String, String>,
    python: Option<&Path>,
) -> Result<InitReport> {
    let project_dir = config.base_dir();
    let env = worker_env(config)?;
    // `--python`/`SPINDLE_PYTHON`, else the config's, else what `serve` would find.
    let setting = python.or(config.file.server.python.as_deref());
    let interpreter = choose_interpreter(setting, &project_dir);
    check_interpreter(&interpreter, &project_dir, &env)
        .await
        .map_err(|e| anyhow!("the Python graphs cannot be imported: {e}"))?;
    let spec = WorkerSpec {
        name: "check".into(),
        python: interpreter.program.clone(),
        project_dir,
        env,
        max_runs: 1,
    };
    let worker = WorkerProcess::spawn(spec, Arc::new(NoServer))?;
    let report = worker
        .init_project(specs, config.custom_auth().as_deref())
        .await
        .context("the Python worker could not import the graphs");
    worker.shutdown(EXIT_GRACE).await;
    report
}

/// What the worker adds to this process's environment: the config's `env` (the variables the
/// environment lacks, which `serve` would have loaded) and the workers' `PYTHONPATH`.
fn worker_env(config: &LoadedConfig) -> Result<BTreeMap<String, String>> {
    let mut env: BTreeMap<String, String> = config
        .env_variables()?
        .into_iter()
        .filter(|(name, _)| std::env::var_os(name).is_none())
        .collect();
    if let Some(path) = config.worker_python_path(&env) {
        env.insert("PYTHONPATH".into(), path);
    }
    Ok(env)
}

/// A worker's calls during a check: importing graphs needs none (no run, checkpoint or store).
struct NoServer;

impl WorkerCalls for NoServer {
    fn request(&self, op: &str, _body: Value) -> Reply {
        let error = RemoteError::bad_request(format!("{op}: `spindle check` runs no server"));
        Box::pin(async move { Err(error) })
    }

    fn event(&self, _op: &str, _body: Value) -> Option<BoxFuture<'static, ()>> {
        None
    }
}
