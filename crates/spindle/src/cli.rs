//! The command line. Every flag can also come from an environment variable; settings left
//! unset fall back to the config file, then to the defaults.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// `spindle --help`'s examples: each line under 80 columns (a long one continued with `\`),
/// so that a terminal never wraps one in the middle of an option.
const EXAMPLES: &str = "Examples:
  spindle dev
  spindle serve --config langgraph.json --host 0.0.0.0 --port 8000 \\
      --database-url postgres://user@db/spindle
  spindle migrate --database-url postgres://user@db/spindle
  spindle check graphs/agent.yaml langgraph.json";

#[derive(Debug, Parser)]
#[command(
    name = "spindle",
    version,
    about = "Spindle: a self-hosted agent run server that speaks the LangGraph agent-server API.",
    long_about = "Spindle: a self-hosted agent run server that speaks the LangGraph agent-server API.\n\n\
                  Point the official LangGraph clients (langgraph-sdk, @langchain/langgraph-sdk) at it.\n\
                  `spindle dev` needs nothing else; `spindle serve` runs on PostgreSQL for several processes.",
    after_help = EXAMPLES
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a development server: an embedded SQLite database under --data-dir and the example
    /// graphs when no config file is found.
    // Its help leaves out what only `serve` is for: PostgreSQL's writers (still accepted, for a
    // dev server given a postgres:// URL) and --examples (dev serves them anyway).
    #[command(mut_arg("pg_writers", |arg| arg.hide(true)), mut_arg("examples", |arg| arg.hide(true)))]
    Dev(ServerArgs),
    /// Run a production server on the database given by --database-url (PostgreSQL for several
    /// processes, or a SQLite file), serving the graphs of the config file (or, with
    /// --examples, the example graphs).
    #[command(mut_arg("no_reload", |arg| arg.hide(true)))]
    Serve(ServerArgs),
    /// Apply pending schema migrations to the database and exit.
    Migrate(DatabaseArgs),
    /// Check graph files and config files (langgraph.json) as a server would load them,
    /// without starting one; exits non-zero when any file fails.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Graph files (.yaml, .yml, .json) and config files (langgraph.json, spindle.json)
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Python interpreter that imports a config's Python graphs [default: as `serve` chooses]
    #[arg(long, env = "SPINDLE_PYTHON")]
    pub python: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address to listen on [default: 127.0.0.1]
    #[arg(long, env = "SPINDLE_HOST")]
    pub host: Option<String>,

    /// Port to listen on [default: 2024]
    #[arg(long, env = "SPINDLE_PORT")]
    pub port: Option<u16>,

    /// Runs this process executes at once [default: 64]
    #[arg(long, env = "SPINDLE_WORKERS")]
    pub workers: Option<usize>,

    /// PostgreSQL: tasks that group the writes of runs in progress into shared transactions,
    /// each on a connection of its own [default: one per two CPUs, 1 to 4]
    #[arg(long, env = "SPINDLE_PG_WRITERS", value_parser = clap::value_parser!(u64).range(1..=64))]
    pub pg_writers: Option<u64>,

    /// A run still executing after this many seconds ends `timeout` [default: no limit]
    #[arg(long, env = "SPINDLE_RUN_TIMEOUT_SECS")]
    pub run_timeout_secs: Option<u64>,

    /// Attempts before a run whose worker keeps dying ends `error` [default: 3]
    #[arg(long, env = "SPINDLE_MAX_ATTEMPTS", value_parser = clap::value_parser!(i32).range(1..))]
    pub max_attempts: Option<i32>,

    /// Seconds a worker's claim on a run lasts without renewal; a run whose process died is
    /// resumed by another worker after this [default: 30]
    #[arg(long, env = "SPINDLE_RUN_LEASE_SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub run_lease_secs: Option<u64>,

    /// Seconds a stopping process (SIGTERM, Ctrl-C) lets its running runs finish before it
    /// hands them back to the queue, where another process resumes them at once [default: 30]
    #[arg(long, env = "SPINDLE_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,

    /// Seconds between keepalive comments on event streams, so idle proxies keep them open
    /// [default: 5]
    #[arg(long, env = "SPINDLE_KEEPALIVE_INTERVAL_SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub keepalive_interval_secs: Option<u64>,

    /// Seconds a client has to send a request's headers whole, after connecting or after its
    /// last response (so a kept-alive connection left idle this long is closed too)
    /// [default: 30]
    #[arg(long, env = "SPINDLE_HEADER_TIMEOUT_SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_secs: Option<u64>,

    /// Client connections served at once; beyond them new ones wait until one closes
    /// [default: 100000, or the open-file limit less 256 when lower]
    #[arg(long, env = "SPINDLE_MAX_CONNECTIONS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,

    /// Hours the events of ended runs are kept for replay (`Last-Event-ID`, thread streams);
    /// 0 keeps them forever [default: 168]
    #[arg(long, env = "SPINDLE_EVENT_RETENTION_HOURS")]
    pub event_retention_hours: Option<u64>,

    /// Minutes a thread without a TTL of its own lives after its last update before the
    /// thread TTL strategy applies to it; fractions allowed [default: no default TTL]
    #[arg(long, env = "SPINDLE_THREAD_TTL_MINUTES")]
    pub thread_ttl_minutes: Option<f64>,

    /// What the default thread TTL does: `delete` the thread, or `keep_latest` (only its
    /// latest checkpoint stays) [default: delete]
    #[arg(long, env = "SPINDLE_THREAD_TTL_STRATEGY", value_parser = ["delete", "keep_latest"])]
    pub thread_ttl_strategy: Option<String>,

    /// Seconds between sweeps for threads whose TTL ran out [default: 300]
    #[arg(long, env = "SPINDLE_THREAD_SWEEP_INTERVAL_SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub thread_sweep_interval_secs: Option<u64>,

    /// Deliver webhooks to private-network and loopback addresses (a receiver on this host or
    /// its network); `--webhook-allow-private` alone means true. Link-local addresses (cloud
    /// metadata) stay refused [default: false]
    #[arg(long, env = "SPINDLE_WEBHOOK_ALLOW_PRIVATE", num_args = 0..=1,
          default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub webhook_allow_private: Option<bool>,

    /// Python interpreter of the workers that run LangGraph Python graphs [default: the
    /// active virtualenv's, else ./.venv/bin/python, else python3]
    #[arg(long, env = "SPINDLE_PYTHON")]
    pub python: Option<PathBuf>,

    /// Python worker processes [default: 1 in dev; in serve, one per CPU up to 4]
    #[arg(long, env = "SPINDLE_PYTHON_WORKERS", value_parser = clap::value_parser!(u64).range(1..))]
    pub python_workers: Option<u64>,

    /// Runs each Python worker executes at once [default: 10]
    #[arg(long, env = "SPINDLE_PYTHON_RUNS_PER_WORKER", value_parser = clap::value_parser!(u32).range(1..))]
    pub python_runs_per_worker: Option<u32>,

    /// Replace a Python worker after it has started this many runs (its memory starts over)
    /// [default: never]
    #[arg(long, env = "SPINDLE_PYTHON_RECYCLE_AFTER_RUNS", value_parser = clap::value_parser!(u64).range(1..))]
    pub python_recycle_after_runs: Option<u64>,

    /// Replace a Python worker once its memory passes this many MiB (it finishes its runs
    /// first) [default: no limit]
    #[arg(long, env = "SPINDLE_PYTHON_MAX_MEMORY_MB", value_parser = clap::value_parser!(u64).range(1..))]
    pub python_max_memory_mb: Option<u64>,

    /// Serve the example graphs built into the binary when the config names no graphs.
    /// `dev` does so anyway; `serve` refuses to start without graphs unless given this
    #[arg(long, env = "SPINDLE_EXAMPLES")]
    pub examples: bool,

    /// `dev` only: do not reload the graphs (Python graphs and graph files) when their files change
    #[arg(long, env = "SPINDLE_NO_RELOAD")]
    pub no_reload: bool,

    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// Config file (graphs and settings). When not given, ./spindle.json is used, else a
    /// ./langgraph.json or ./aegra.json in the same format.
    #[arg(long, env = "SPINDLE_CONFIG")]
    pub config: Option<PathBuf>,

    /// Folder of the embedded database [default: .spindle]
    #[arg(long, env = "SPINDLE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Database: `postgres://...`, or a SQLite path or `sqlite:` URL [default: <data-dir>/spindle.db]
    #[arg(long, env = "SPINDLE_DATABASE_URL")]
    pub database_url: Option<String>,
}

impl Cli {
    /// The config file the command names (`--config` or `SPINDLE_CONFIG`), if any.
    pub fn config_path(&self) -> Option<&std::path::Path> {
        match &self.command {
            Command::Dev(args) | Command::Serve(args) => args.database.config.as_deref(),
            Command::Migrate(args) => args.config.as_deref(),
            Command::Check(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn help(path: &[&str]) -> String {
        let mut command = Cli::command().term_width(80);
        command.build();
        let mut command = &mut command;
        for name in path {
            command = command.find_subcommand_mut(name).expect(name);
        }
        command.render_long_help().to_string()
    }

    #[test]
    fn the_examples_are_not_wrapped_on_an_80_column_terminal() {
        let help = help(&[]);
        for line in EXAMPLES.lines() {
            assert!(line.len() < 80, "{line}");
            assert!(
                help.lines().any(|shown| shown == line),
                "{line:?} not whole in:\n{help}"
            );
        }
    }

    #[test]
    fn dev_and_serve_list_only_their_own_options() {
        let dev = help(&["dev"]);
        let serve = help(&["serve"]);
        for serve_only in ["--pg-writers", "--examples"] {
            assert!(
                !dev.contains(serve_only),
                "{serve_only} in dev's help:\n{dev}"
            );
            assert!(
                serve.contains(serve_only),
                "{serve_only} not in serve's help"
            );
        }
        assert!(dev.contains("--no-reload") && !serve.contains("--no-reload"));
        // Hidden, still accepted: a dev server on PostgreSQL may set its writers.
        assert!(Cli::try_parse_from(["spindle", "dev", "--pg-writers", "2", "--examples"]).is_ok());
    }
}
