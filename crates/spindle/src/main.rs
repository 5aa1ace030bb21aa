//! The `spindle` binary: command line, configuration and wiring.

mod check;
mod check_python;
mod cli;
mod config;
mod database;
mod env;
mod graphs;
mod http_section;
mod python;
mod reload;
mod store;
mod telemetry;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use spindle_execution::metrics::MeteredStorage;
use spindle_execution::{Metrics, WebhookConfig, WorkerConfig};
use spindle_server::connections::ConnectionLimits;
use spindle_server::{AppState, ThreadTtlConfig};
use spindle_storage::{ThreadTtl, TtlStrategy};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use cli::{Cli, Command, DatabaseArgs, ServerArgs};
use config::LoadedConfig;

/// mimalloc: the server allocates and frees many small values per request and per run
/// event, across threads; glibc's allocator spent a fifth of the runtime threads' time there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const DEFAULT_HOST: &str = "127.0.0.1";
const DEFAULT_PORT: u16 = 2024;
const DEFAULT_DATA_DIR: &str = ".spindle";

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Reads files and prints; no config's environment, no logging (a runtime only for a
    // worker importing Python graphs).
    if let Command::Check(args) = &cli.command {
        return check::run(&args.files, args.python.as_deref());
    }
    // First, while this is the process's only thread (see `env::load`).
    let (cli, config, loaded_env) = match configure(cli) {
        Ok(configured) => configured,
        Err(err) => {
            eprintln!("error: {err:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let _telemetry = match telemetry::init() {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("error: {err:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if !loaded_env.is_empty() {
        tracing::debug!(variables = ?loaded_env, "the config's env is loaded");
    }
    if let Some(path) = config.missing_env_file() {
        tracing::warn!(file = %path.display(), "the config's env file does not exist: no variables are loaded from it");
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli, config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Reads the config file and loads its `env` into the environment, before anything reads
/// the environment. When `env` sets `SPINDLE_*` variables the command line is read again, so
/// they count as the environment's own (the config file stays the one already read).
fn configure(cli: Cli) -> Result<(Cli, LoadedConfig, Vec<String>)> {
    let config = LoadedConfig::discover(cli.config_path())?;
    let loaded = env::load(&config)?;
    let cli = match loaded.iter().any(|name| name.starts_with("SPINDLE_")) {
        true => Cli::parse(),
        false => cli,
    };
    Ok((cli, config, loaded))
}

async fn run(cli: Cli, config: LoadedConfig) -> Result<()> {
    match cli.command {
        Command::Dev(args) => serve(args, Mode::Dev, config).await,
        Command::Serve(args) => serve(args, Mode::Serve, config).await,
        Command::Migrate(args) => migrate(args, config).await,
        Command::Check(_) => unreachable!("`check` returns before the runtime starts"),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Dev,
    Serve,
}

/// The database URL: the flag or environment, else the config file, else a SQLite file in the
/// data folder (which is created; the guard removes it again unless the start succeeds).
fn database_url(args: &DatabaseArgs, config: &LoadedConfig) -> Result<(String, NewDataDir)> {
    let given = match (&args.database_url, &config.file.server.database_url) {
        (Some(url), _) => Some((url, "--database-url (or SPINDLE_DATABASE_URL)")),
        (None, Some(url)) => Some((url, "the config file's server.database_url")),
        (None, None) => None,
    };
    if let Some((url, option)) = given {
        check_given(url, option)?;
        return Ok((url.clone(), NewDataDir(None)));
    }
    let data_dir: PathBuf = args
        .data_dir
        .clone()
        .or_else(|| config.file.server.data_dir.clone())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    let created = prepare_data_dir(&data_dir)?;
    let url = data_dir.join("spindle.db").to_string_lossy().into_owned();
    Ok((url, NewDataDir(created.then_some(data_dir))))
}

/// Creates the data folder if needed, with a `.gitignore` of `*` so that a `.spindle/` in a
/// project never shows in `git status`. An existing folder gets one when it lacks it and is
/// empty or holds a Spindle database (not any folder named by --data-dir, which could be the
/// project itself). Answers whether the folder was created now.
fn prepare_data_dir(data_dir: &Path) -> Result<bool> {
    let existed = data_dir.is_dir();
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create the data folder {}", data_dir.display()))?;
    let gitignore = data_dir.join(".gitignore");
    let is_data_dir = !existed
        || data_dir.join("spindle.db").exists()
        || std::fs::read_dir(data_dir).is_ok_and(|mut entries| entries.next().is_none());
    if is_data_dir && !gitignore.exists() {
        std::fs::write(&gitignore, "# Spindle's data folder: never committed.\n*\n")
            .with_context(|| format!("cannot write {}", gitignore.display()))?;
    }
    Ok(!existed)
}

/// A data folder this start created: removed when dropped, so that a start that fails leaves
/// nothing behind, unless `keep` says the start succeeded.
struct NewDataDir(Option<PathBuf>);

impl NewDataDir {
    fn keep(&mut self) {
        self.0 = None;
    }
}

impl Drop for NewDataDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `serve` without graphs would put the built-in examples into production by accident: it
/// refuses unless they are asked for (`--examples`). `dev` serves them when no graph is given.
fn check_graphs_given(args: &ServerArgs, mode: Mode, config: &LoadedConfig) -> Result<()> {
    if mode == Mode::Dev || args.examples || !config.file.graphs.is_empty() {
        return Ok(());
    }
    let found = match &config.path {
        Some(path) => format!("the config file {} names no graphs", path.display()),
        None => "no config file was given (--config) or found (./spindle.json, \
                 ./langgraph.json, ./aegra.json)"
            .to_owned(),
    };
    anyhow::bail!(
        "no graphs to serve: {found}.\n  \
         Name your graphs in a config file's `graphs` section and pass it: \
         spindle serve --config path/to/langgraph.json (see \"Graphs\" in the README).\n  \
         To serve the built-in example graphs on purpose: spindle serve --examples"
    )
}

/// Listens on the server's address. Called before anything is written to disk, so that a start
/// that cannot listen (most often: the port is taken) leaves nothing behind.
async fn listen(host: &str, port: u16) -> Result<TcpListener> {
    match TcpListener::bind((host, port)).await {
        Ok(listener) => Ok(listener),
        Err(err) if err.kind() == std::io::ErrorKind::AddrInUse => {
            let example = match free_port_after(host, port) {
                Some(free) => format!("--port {free} (free now)"),
                None => "--port N".to_owned(),
            };
            anyhow::bail!(
                "cannot listen on {host}:{port}: port {port} is already in use (by another \
                 server, perhaps another spindle); start on another port with {example}"
            )
        }
        Err(err) => Err(err).with_context(|| format!("cannot listen on {host}:{port}")),
    }
}

/// The first of the next few ports that can be listened on now, to suggest one.
fn free_port_after(host: &str, port: u16) -> Option<u16> {
    (1..=50)
        .filter_map(|offset| port.checked_add(offset))
        .find(|&candidate| std::net::TcpListener::bind((host, candidate)).is_ok())
}

/// Refuses a database URL that cannot be what its writer meant, naming the `option` it came
/// from: an empty one (SQLite would take it for a temporary database per connection, a server
/// whose every request fails), one without a scheme that names a host, and an unknown scheme.
fn check_given(url: &str, option: &str) -> Result<()> {
    if url.trim().is_empty() {
        anyhow::bail!(
            "{option} is empty: give a database (postgres://user@host/db, or a SQLite file \
             such as ./spindle.db), or leave it unset for an embedded SQLite database in the \
             data folder (--data-dir, default .spindle)"
        )
    }
    if let Some(host) = schemeless_host(url) {
        anyhow::bail!(
            "database URL {bare} ({option}) has no scheme but names a host ({host}); for \
             PostgreSQL write postgres://{bare}, for a SQLite file a path (./spindle.db)",
            bare = redact_bare(url)
        )
    }
    check_scheme(url)
}

/// The `host:port` a URL without a scheme starts with (`localhost:5432/db`,
/// `user@db.example:5432`), which a person meant for PostgreSQL and SQLite would take for a
/// file's name; `None` for anything else (a path, `sqlite:file.db`).
fn schemeless_host(url: &str) -> Option<&str> {
    if url.contains("://") {
        return None;
    }
    let authority = url.split(['/', '?']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = host_port.rsplit_once(':')?;
    let is_port = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
    (is_port && !host.is_empty()).then_some(host_port)
}

/// A URL without a scheme with any password hidden (`user:***@host`).
fn redact_bare(url: &str) -> String {
    redact(&format!("postgres://{url}"))
        .trim_start_matches("postgres://")
        .to_owned()
}

/// Refuses a URL whose scheme names no database Spindle reads (`mysql://`, a misspelt
/// `postgress://`), which would otherwise be taken for a SQLite file's path.
fn check_scheme(url: &str) -> Result<()> {
    const KNOWN: [&str; 3] = ["postgres", "postgresql", "sqlite"];
    match url.split_once("://") {
        Some((scheme, _)) if !KNOWN.contains(&scheme.to_ascii_lowercase().as_str()) => {
            anyhow::bail!(
                "database URL {}: unknown scheme `{scheme}://`; use postgres:// (or \
                 postgresql://) for PostgreSQL, or sqlite:// (or a file path) for SQLite",
                redact(url)
            )
        }
        _ => Ok(()),
    }
}

/// The URL with any password hidden, for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

async fn serve(args: ServerArgs, mode: Mode, config: LoadedConfig) -> Result<()> {
    let started = Instant::now();
    check_graphs_given(&args, mode, &config)?;
    if mode == Mode::Serve
        && args.database.database_url.is_none()
        && config.file.server.database_url.is_none()
    {
        tracing::warn!("no --database-url given: using an embedded SQLite database, which one process at a time can serve");
    }
    http_section::log_unused(config.file.http.as_ref());
    let http = config.http()?;
    let auth = config.auth()?;
    let graphs::Graphs {
        mut registry,
        python: python_graphs,
        files: graph_files,
    } = graphs::load(&config)?;
    let host = args
        .host
        .clone()
        .or(config.file.server.host.clone())
        .unwrap_or_else(|| DEFAULT_HOST.into());
    let port = args
        .port
        .or(config.file.server.port)
        .unwrap_or(DEFAULT_PORT);
    // Connections wait in the listen queue until the server is ready to answer them.
    let listener = listen(&host, port).await?;
    let addr = listener.local_addr()?;
    // Declared before the storage, so dropped after it: a failed start removes a data folder
    // it created once the database is closed.
    let (url, mut new_data_dir) = database_url(&args.database, &config)?;
    // One registry for the process; every storage call is timed into it from here on.
    let metrics = Arc::new(Metrics::new());
    let options = connect_options(&args, &config);
    let storage = MeteredStorage::wrap(database::open(&url, &options).await?, metrics.clone());
    let store = store::store_config(&config)?;
    // LangGraph's custom auth runs in the Python workers too: they start for it alone.
    let python = match python_graphs.is_empty() && config.custom_auth().is_none() {
        true => None,
        false => Some(
            python::start(
                &args,
                &config,
                mode,
                python_graphs,
                storage.clone(),
                store.clone(),
                &mut registry,
            )
            .await?,
        ),
    };
    graphs::ensure_default_assistants(storage.as_ref(), &registry).await?;
    new_data_dir.keep();
    let interrupted = match mode {
        Mode::Dev => interrupted_runs(storage.as_ref()).await,
        Mode::Serve => 0,
    };

    let graph_ids = registry.ids();
    let described = graphs::described(&registry);
    println!(
        "Spindle {} ready in {} ms",
        env!("CARGO_PKG_VERSION"),
        started.elapsed().as_millis()
    );
    println!("  API:      http://{addr}");
    match http.disabled.meta {
        true => println!("  Docs:     off (http.disable_meta)"),
        false => println!("  Docs:     http://{addr}/docs"),
    }
    println!(
        "  Database: {} ({})",
        redact(&url),
        storage.backend().as_str()
    );
    match (&config.path, config.file.graphs.is_empty()) {
        (Some(path), false) => println!("  Config:   {}", path.display()),
        (Some(path), true) => println!(
            "  Config:   {} (names no graphs); serving the example graphs",
            path.display()
        ),
        (None, _) => println!("  Config:   none found; serving the example graphs"),
    }
    match described.as_slice() {
        [] => println!("  Graphs:   none"),
        [first, rest @ ..] => {
            println!("  Graphs:   {first}");
            for graph in rest {
                println!("            {graph}");
            }
        }
    }
    if interrupted > 0 {
        println!(
            "  Resuming: {} the last stop interrupted, from {} last checkpoint (the log names {})",
            plural(interrupted, "run"),
            if interrupted == 1 { "its" } else { "their" },
            if interrupted == 1 { "it" } else { "them" },
        );
    }
    tracing::info!(%addr, backend = storage.backend().as_str(), graphs = graph_ids.len(), "listening");

    let workers = WorkerConfig {
        store: store.clone(),
        readable_tracebacks: mode == Mode::Dev,
        ..worker_config(&args, &config)
    };
    let registry = Arc::new(registry);
    let mut state = AppState::with_settings(
        storage,
        registry.clone(),
        workers,
        webhook_config(&args, &config),
        metrics,
    );
    state.thread_ttl = thread_ttl_config(&args, &config)?;
    state.cors = cors_layer(&config, mode)?;
    state.http = http;
    if let Some(auth) = auth {
        tracing::info!(methods = %auth.describe(), "authentication is on");
        state.auth = Some(Arc::new(auth));
    }
    state.store = store;
    if let Some(secs) = args
        .keepalive_interval_secs
        .or(config.file.server.keepalive_interval_secs)
    {
        state.keepalive = Duration::from_secs(secs);
    }
    state.connections = connection_limits(&args, &config);
    let stopping = CancellationToken::new();
    if let Some(pool) = &python {
        state.workers.set_python(pool.clone());
        pool.supervise(stopping.clone());
    }
    if mode == Mode::Dev && !args.no_reload && (python.is_some() || !graph_files.is_empty()) {
        let reloadable = reload::Reloadable::new(python, registry, graph_files);
        reload::watch(config.base_dir(), reloadable, stopping.clone())?;
    }
    let workers = state.workers.clone();
    let served = spindle_server::serve(listener, state, shutdown_signal(workers, mode)).await;
    // The Python workers close after the server: runs still draining may need them.
    stopping.cancel();
    served?;
    tracing::info!("stopped");
    Ok(())
}

/// How many runs a `dev` process that stopped left running (handed back, or its process
/// killed): its workers resume them from their last checkpoint, which the banner says rather
/// than letting a model be called again with no word. (`serve` shares its database with other
/// processes, whose runs are running too; there each resumed run's log line says it.)
async fn interrupted_runs(storage: &dyn spindle_storage::Storage) -> usize {
    match storage.count_queued_runs().await {
        Ok(queued) => usize::try_from(queued.running).unwrap_or(0),
        Err(err) => {
            tracing::warn!(error = %err, "cannot count the runs the last stop interrupted");
            0
        }
    }
}

/// Bounds on client connections: flag or environment, else the config file, else the defaults.
fn connection_limits(args: &ServerArgs, config: &LoadedConfig) -> ConnectionLimits {
    let file = &config.file.server;
    let defaults = ConnectionLimits::default();
    ConnectionLimits {
        header_timeout: args
            .header_timeout_secs
            .or(file.header_timeout_secs)
            .map_or(defaults.header_timeout, |secs| {
                Duration::from_secs(secs.max(1))
            }),
        max_connections: args
            .max_connections
            .or(file.max_connections)
            .map_or(defaults.max_connections, |n| {
                usize::try_from(n.max(1)).unwrap_or(usize::MAX)
            }),
    }
}

/// Browsers' access: the config's `http.cors`, else in `dev` what `langgraph dev` allows
/// (any origin), else (`serve`) none.
fn cors_layer(
    config: &LoadedConfig,
    mode: Mode,
) -> Result<Option<spindle_server::cors::CorsLayer>> {
    let cors = match (config.cors()?, mode) {
        (Some(cors), _) => cors,
        (None, Mode::Dev) => spindle_server::cors::Cors::dev(),
        (None, Mode::Serve) => return Ok(None),
    };
    Ok(Some(cors.layer()?))
}

/// How the database is used: flag or environment, else the config file, else the storage's
/// defaults.
fn connect_options(args: &ServerArgs, config: &LoadedConfig) -> spindle_storage::ConnectOptions {
    spindle_storage::ConnectOptions {
        pg_writers: args
            .pg_writers
            .or(config.file.server.pg_writers)
            .map(|n| n.max(1) as usize),
    }
}

/// Run execution settings: flag or environment, else the config file, else the defaults.
fn worker_config(args: &ServerArgs, config: &LoadedConfig) -> WorkerConfig {
    let file = &config.file.server;
    let defaults = WorkerConfig::default();
    WorkerConfig {
        concurrency: args
            .workers
            .or(file.workers)
            .unwrap_or(defaults.concurrency)
            .max(1),
        max_attempts: args
            .max_attempts
            .or(file.max_attempts)
            .unwrap_or(defaults.max_attempts)
            .max(1),
        run_timeout: args
            .run_timeout_secs
            .or(file.run_timeout_secs)
            .map(Duration::from_secs)
            .or(defaults.run_timeout),
        lease: args
            .run_lease_secs
            .or(file.run_lease_secs)
            .map(Duration::from_secs)
            .unwrap_or(defaults.lease),
        shutdown_grace: args
            .shutdown_grace_secs
            .or(file.shutdown_grace_secs)
            .map(Duration::from_secs)
            .unwrap_or(defaults.shutdown_grace),
        event_retention: match args.event_retention_hours.or(file.event_retention_hours) {
            Some(0) => None,
            Some(hours) => Some(Duration::from_secs(hours.saturating_mul(3600))),
            None => defaults.event_retention,
        },
        ..defaults
    }
}

/// Thread TTL settings: flag or environment, else the config file, else the defaults (no
/// default TTL; a sweep every five minutes).
fn thread_ttl_config(args: &ServerArgs, config: &LoadedConfig) -> Result<ThreadTtlConfig> {
    let file = &config.file.server;
    let defaults = ThreadTtlConfig::default();
    let strategy = args
        .thread_ttl_strategy
        .as_deref()
        .or(file.thread_ttl_strategy.as_deref())
        .map(|s| {
            TtlStrategy::parse(s).with_context(|| {
                format!("thread_ttl_strategy {s:?}: expected \"delete\" or \"keep_latest\"")
            })
        })
        .transpose()?
        .unwrap_or_default();
    let default = match args.thread_ttl_minutes.or(file.thread_ttl_minutes) {
        None => None,
        Some(m) if m.is_finite() && m > 0.0 => Some(ThreadTtl {
            strategy,
            minutes: m,
        }),
        Some(m) => {
            anyhow::bail!("thread_ttl_minutes must be a positive number of minutes, got {m}")
        }
    };
    Ok(ThreadTtlConfig {
        default,
        sweep_every: args
            .thread_sweep_interval_secs
            .or(file.thread_sweep_interval_secs)
            .map(|s| Duration::from_secs(s.max(1)))
            .unwrap_or(defaults.sweep_every),
    })
}

/// Webhook settings: flag or environment, else the config file, else the defaults.
fn webhook_config(args: &ServerArgs, config: &LoadedConfig) -> WebhookConfig {
    let defaults = WebhookConfig::default();
    let allow_private = args
        .webhook_allow_private
        .or(config.file.server.webhook_allow_private)
        .unwrap_or(defaults.allow_private);
    if allow_private {
        tracing::warn!(
            "webhooks may reach private-network and loopback addresses (--webhook-allow-private)"
        );
    }
    WebhookConfig {
        allow_private,
        ..defaults
    }
}

async fn migrate(args: DatabaseArgs, config: LoadedConfig) -> Result<()> {
    let (url, mut new_data_dir) = database_url(&args, &config)?;
    let applied = database::migrate(&url).await?;
    new_data_dir.keep();
    println!(
        "{}: applied {applied} migration(s); the schema is up to date",
        redact(&url)
    );
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM, so that deploys stop the server cleanly: the runs still
/// executing get the shutdown grace to finish. It says how many there are, and that a second
/// Ctrl-C (or SIGTERM) stops now, handing them back (without one, a run waiting on a model
/// held the terminal for the whole grace with no word).
async fn shutdown_signal(workers: Arc<spindle_execution::RunWorkers>, mode: Mode) {
    stop_signal().await;
    tracing::info!("shutting down");
    let running = workers.executing_count();
    if running > 0 {
        let grace = workers.shutdown_grace().as_secs();
        let resume = match mode {
            Mode::Dev => "at the next start",
            Mode::Serve => "on another process or at the next start",
        };
        tracing::warn!(
            runs = running,
            "{} still running: waiting up to {grace} s for {} to finish; press Ctrl-C again \
             to stop now ({} handed back, to resume from {} last checkpoint {resume})",
            plural(running, "run"),
            if running == 1 { "it" } else { "them" },
            if running == 1 { "it is" } else { "they are" },
            if running == 1 { "its" } else { "their" },
        );
    }
    tokio::spawn(async move {
        stop_signal().await;
        workers.stop_now();
    });
}

/// `1 run`, `2 runs`.
fn plural(count: usize, noun: &str) -> String {
    match count {
        1 => format!("1 {noun}"),
        _ => format!("{count} {noun}s"),
    }
}

/// Resolves on the next Ctrl-C or SIGTERM.
async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact(".spindle/spindle.db"), ".spindle/spindle.db");
    }

    fn server_args(argv: &[&str]) -> ServerArgs {
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Dev(args) | Command::Serve(args) => args,
            Command::Migrate(_) | Command::Check(_) => panic!("not a server command"),
        }
    }

    #[test]
    fn pg_writers_come_from_the_flag_then_the_file() {
        let mut file = LoadedConfig::default();
        file.file.server.pg_writers = Some(3);
        let writers = |argv: &[&str], config: &LoadedConfig| {
            connect_options(&server_args(argv), config).pg_writers
        };
        assert_eq!(
            writers(&["spindle", "serve"], &LoadedConfig::default()),
            None
        );
        assert_eq!(writers(&["spindle", "serve"], &file), Some(3));
        assert_eq!(
            writers(&["spindle", "serve", "--pg-writers", "2"], &file),
            Some(2)
        );
        assert!(Cli::try_parse_from(["spindle", "serve", "--pg-writers", "0"]).is_err());
    }

    #[test]
    fn webhook_allow_private_comes_from_the_flag_then_the_file() {
        let none = LoadedConfig::default();
        let mut file_allows = LoadedConfig::default();
        file_allows.file.server.webhook_allow_private = Some(true);
        let allowed = |argv: &[&str], config: &LoadedConfig| {
            webhook_config(&server_args(argv), config).allow_private
        };
        assert!(!allowed(&["spindle", "dev"], &none));
        assert!(allowed(
            &["spindle", "dev", "--webhook-allow-private"],
            &none
        ));
        assert!(allowed(
            &["spindle", "serve", "--webhook-allow-private=true"],
            &none
        ));
        assert!(allowed(&["spindle", "dev"], &file_allows));
        assert!(!allowed(
            &["spindle", "dev", "--webhook-allow-private=false"],
            &file_allows
        ));
    }

    #[test]
    fn thread_ttl_comes_from_the_flags_then_the_file() {
        let none = LoadedConfig::default();
        let ttl =
            |argv: &[&str], config: &LoadedConfig| thread_ttl_config(&server_args(argv), config);
        let plain = ttl(&["spindle", "dev"], &none).unwrap();
        assert!(plain.default.is_none());
        assert_eq!(plain.sweep_every, Duration::from_secs(300));
        let set = ttl(
            &[
                "spindle",
                "dev",
                "--thread-ttl-minutes",
                "0.5",
                "--thread-ttl-strategy",
                "keep_latest",
                "--thread-sweep-interval-secs",
                "1",
            ],
            &none,
        )
        .unwrap();
        let default = set.default.unwrap();
        assert_eq!(default.strategy, TtlStrategy::KeepLatest);
        assert_eq!(default.minutes, 0.5);
        assert_eq!(set.sweep_every, Duration::from_secs(1));
        let mut file = LoadedConfig::default();
        file.file.server.thread_ttl_minutes = Some(60.0);
        let from_file = ttl(&["spindle", "serve"], &file).unwrap();
        assert_eq!(from_file.default.unwrap().strategy, TtlStrategy::Delete);
        file.file.server.thread_ttl_minutes = Some(-1.0);
        assert!(ttl(&["spindle", "serve"], &file).is_err());
    }

    #[test]
    fn a_database_url_of_an_unknown_scheme_is_refused_naming_the_accepted_ones() {
        for bad in ["mysql://root@localhost/db", "postgress://u:secret@h/db"] {
            let args = DatabaseArgs {
                config: None,
                data_dir: None,
                database_url: Some(bad.into()),
            };
            let err = database_url(&args, &LoadedConfig::default())
                .map(|(url, _)| url)
                .unwrap_err()
                .to_string();
            let scheme = bad.split("://").next().unwrap();
            assert!(err.contains(&format!("`{scheme}://`")), "{err}");
            assert!(
                err.contains("postgres://") && err.contains("sqlite://"),
                "{err}"
            );
            assert!(!err.contains("secret"), "the password is hidden: {err}");
        }
        for good in [
            "postgres://u@h/db",
            "postgresql://u@h/db",
            "sqlite:///tmp/x.db",
            "/tmp/x.db",
        ] {
            assert!(check_scheme(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn an_empty_database_url_is_refused_naming_where_it_came_from() {
        let flag = DatabaseArgs {
            config: None,
            data_dir: None,
            database_url: Some(" ".into()),
        };
        let err = database_url(&flag, &LoadedConfig::default())
            .map(|(url, _)| url)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--database-url (or SPINDLE_DATABASE_URL) is empty"),
            "{err}"
        );
        let mut file = LoadedConfig::default();
        file.file.server.database_url = Some(String::new());
        let none = DatabaseArgs {
            database_url: None,
            ..flag
        };
        let err = database_url(&none, &file)
            .map(|(url, _)| url)
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.database_url is empty"), "{err}");
    }

    #[test]
    fn a_host_without_a_scheme_is_told_apart_from_a_sqlite_path() {
        for host in [
            "localhost:5432/db",
            "db.example:6543",
            "u:secret@db:5432/x",
            "[::1]:5432/db",
        ] {
            assert!(schemeless_host(host).is_some(), "{host}");
        }
        for path in [
            ".spindle/spindle.db",
            "/var/lib/spindle.db",
            "spindle.db",
            "sqlite:spindle.db",
            "sqlite://x.db",
            "C:/data/spindle.db",
            "postgres://localhost:5432/db",
        ] {
            assert_eq!(schemeless_host(path), None, "{path}");
        }
        let err = check_given("u:secret@db:5432/x", "--database-url")
            .unwrap_err()
            .to_string();
        assert!(err.contains("write postgres://u:***@db:5432/x"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn database_url_defaults_to_a_file_in_the_data_dir() {
        let dir = tempfile::tempdir().unwrap();
        let args = DatabaseArgs {
            config: None,
            data_dir: Some(dir.path().join("data")),
            database_url: None,
        };
        let (url, mut created) = database_url(&args, &LoadedConfig::default()).unwrap();
        assert!(Path::new(&url).starts_with(dir.path().join("data")));
        assert!(dir.path().join("data").is_dir());
        created.keep();
        drop(created);
        assert!(
            dir.path().join("data").is_dir(),
            "kept once the start succeeded"
        );
    }

    #[test]
    fn a_data_dir_created_by_a_failed_start_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let args = DatabaseArgs {
            config: None,
            data_dir: Some(dir.path().join("data")),
            database_url: None,
        };
        let (_, created) = database_url(&args, &LoadedConfig::default()).unwrap();
        drop(created);
        assert!(!dir.path().join("data").exists());
        // An existing folder is never removed.
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let (_, existing) = database_url(&args, &LoadedConfig::default()).unwrap();
        drop(existing);
        assert!(dir.path().join("data").is_dir());
    }

    #[test]
    fn a_data_dir_gets_a_gitignore_but_not_any_existing_folder() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new");
        assert!(prepare_data_dir(&new).unwrap());
        assert_eq!(
            std::fs::read_to_string(new.join(".gitignore"))
                .unwrap()
                .lines()
                .last(),
            Some("*")
        );
        // An existing data folder (it holds a database) without one gets one.
        let old = dir.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::write(old.join("spindle.db"), "").unwrap();
        assert!(!prepare_data_dir(&old).unwrap());
        assert!(old.join(".gitignore").exists());
        // A folder with other files (the project itself as --data-dir) is left as it is.
        let project = dir.path().join("project");
        std::fs::create_dir(&project).unwrap();
        std::fs::write(project.join("langgraph.json"), "{}").unwrap();
        assert!(!prepare_data_dir(&project).unwrap());
        assert!(!project.join(".gitignore").exists());
    }

    #[test]
    fn serve_without_graphs_is_refused_unless_the_examples_are_asked_for() {
        let none = LoadedConfig::default();
        let err = check_graphs_given(&server_args(&["spindle", "serve"]), Mode::Serve, &none)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--config") && err.contains("--examples"),
            "{err}"
        );
        let examples = server_args(&["spindle", "serve", "--examples"]);
        assert!(check_graphs_given(&examples, Mode::Serve, &none).is_ok());
        let dev = server_args(&["spindle", "dev"]);
        assert!(check_graphs_given(&dev, Mode::Dev, &none).is_ok());
        let mut with_graphs = LoadedConfig::default();
        with_graphs
            .file
            .graphs
            .insert("echo".into(), "./echo.yaml".into());
        let serve = server_args(&["spindle", "serve"]);
        assert!(check_graphs_given(&serve, Mode::Serve, &with_graphs).is_ok());
    }
}
