//! `spindle-loadgen`: N concurrent clients run one scenario against an agent server for a
//! fixed time and print runs/s and exact latency percentiles as JSON.
//!
//! It exists so the benchmark measures the server, not the client: the official Python client
//! tops out far below what Spindle serves. bench/run drives it; bench/README.md says how.
//!
//! `spindle-loadgen hold --streams FILE` holds idle event streams open instead (`hold.rs`), for
//! bench/idle_streams.py.

mod hold;
mod scenario;
mod sse;
mod stats;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use serde_json::Value;

use scenario::{Sample, Scenario, Target};
use stats::{Percentiles, Report};

/// The load scenarios keep their command line (`--url ... --scenario ...`, as bench/run,
/// bench/pair.py and the others call it), hence a subcommand that excludes their flags rather
/// than one per mode.
#[derive(Debug, Parser)]
#[command(
    name = "spindle-loadgen",
    about = "Load an agent server with thread + run operations",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    load: Args,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Open SSE streams and hold them, idle, on one thread, until SIGTERM, SIGINT or the end
    /// of stdin; JSON lines on stdout (see bench/loadgen/src/hold.rs).
    Hold(hold::HoldArgs),
}

#[derive(Debug, clap::Args)]
struct Args {
    /// Base URL of the server, e.g. http://127.0.0.1:2024; or several, comma-separated
    /// (processes of one server on a shared database): client i uses URL i % n for all its
    /// operations, so the load spreads evenly when the clients are a multiple of the URLs.
    #[arg(long, value_delimiter = ',', required = true)]
    url: Vec<String>,
    /// (An Option only so that `hold` can go without it; required otherwise.)
    #[arg(long, value_enum, required = true)]
    scenario: Option<Scenario>,
    /// Concurrent clients; each runs one operation after the other.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds measured, after the warm-up.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of load before measuring (connections, caches, the server's allocator).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    #[arg(long, default_value = "chain")]
    assistant: String,
    /// The run's input, as JSON.
    #[arg(long, default_value = r#"{"n": 1}"#)]
    input: String,
    /// Top-level keys the waited-on output must hold, as a JSON object.
    #[arg(long)]
    expect: Option<String>,
    /// Runtime threads. One is plenty for thousands of requests/s and leaves the cores to the
    /// server it shares the machine with.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Seconds before one request gives up.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Also write every counted operation to this CSV file (its start as Unix time in ms, its
    /// latency and its first event's in ms), to line the slow ones up with the server's logs.
    #[arg(long)]
    samples: Option<std::path::PathBuf>,
}

/// The measured window: operations that end inside it count.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

/// What one client saw during the window.
#[derive(Default)]
struct ClientResult {
    samples: Vec<Sample>,
    errors: u64,
    first_error: Option<String>,
}

impl Args {
    fn scenario(&self) -> Scenario {
        self.scenario
            .expect("clap requires --scenario without a subcommand")
    }
}

fn main() -> Result<()> {
    let Cli {
        command,
        load: args,
    } = Cli::parse();
    if let Some(Command::Hold(hold)) = command {
        return hold::main(hold);
    }
    let runtime = build_runtime(args.threads)?;
    let report = runtime.block_on(run(&args))?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

fn build_runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder.enable_all().build().context("building the runtime")
}

async fn run(args: &Args) -> Result<Report> {
    let target = Arc::new(build_target(args)?);
    // Created before the load, so that a path it cannot write fails at once.
    let samples = args
        .samples
        .as_deref()
        .map(|path| {
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))
        })
        .transpose()?;
    let now = Instant::now();
    let window = Window {
        start: now + Duration::from_secs_f64(args.warmup),
        end: now + Duration::from_secs_f64(args.warmup + args.duration),
    };
    let clients = (0..args.clients.max(1)).map(|i| {
        let base_url = target.base_urls[i % target.base_urls.len()].clone();
        tokio::spawn(client_loop(
            Arc::clone(&target),
            base_url,
            args.scenario(),
            window,
        ))
    });
    let results = futures::future::try_join_all(clients).await?;
    if let Some(file) = samples {
        write_samples(file, &results)?;
    }
    Ok(summarise(args, results))
}

fn build_target(args: &Args) -> Result<Target> {
    let input: Value = serde_json::from_str(&args.input).context("--input is not JSON")?;
    let run_body = serde_json::to_vec(&serde_json::json!({
        "assistant_id": args.assistant,
        "input": input,
    }))?;
    let expect = args
        .expect
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .context("--expect is not a JSON object")?;
    let http = reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(usize::MAX)
        .timeout(Duration::from_secs(args.timeout))
        .build()?;
    Ok(Target {
        http,
        base_urls: base_urls(&args.url)?,
        run_body,
        expect,
    })
}

/// The `--url` values without trailing slashes; at least one, none empty.
fn base_urls(urls: &[String]) -> Result<Vec<String>> {
    let out: Vec<String> = urls
        .iter()
        .map(|url| url.trim().trim_end_matches('/').to_string())
        .collect();
    anyhow::ensure!(
        !out.is_empty() && out.iter().all(|url| !url.is_empty()),
        "--url holds an empty URL: {urls:?}"
    );
    Ok(out)
}

/// One client: operations back to back on its server (`base_url`) until the window closes.
/// Operations that end before the window opens warm up; those that end after it closes are
/// not counted.
async fn client_loop(
    target: Arc<Target>,
    base_url: String,
    scenario: Scenario,
    window: Window,
) -> ClientResult {
    let mut result = ClientResult::default();
    while Instant::now() < window.end {
        let outcome = target.run_once(&base_url, scenario).await;
        let ended = Instant::now();
        let counted = ended >= window.start && ended <= window.end;
        match outcome {
            Ok(sample) if counted => result.samples.push(sample),
            Ok(_) => {}
            Err(err) => {
                if counted {
                    result.errors += 1;
                    result.first_error.get_or_insert_with(|| format!("{err:#}"));
                }
                // A refused connection fails at once; do not spin on it.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    result
}

/// Writes every counted operation as a CSV row (`--samples`).
fn write_samples(file: std::fs::File, results: &[ClientResult]) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(file);
    // Instants have no epoch: place them through one reading of both clocks.
    let (now, unix_now) = (Instant::now(), std::time::SystemTime::now());
    let unix_ms = |at: Instant| {
        let unix = unix_now - now.saturating_duration_since(at);
        ms(unix
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default())
    };
    writeln!(out, "start_unix_ms,latency_ms,first_event_ms")?;
    for s in results.iter().flat_map(|r| &r.samples) {
        let start = unix_ms(s.started);
        let first = s
            .first_event
            .map(|d| format!("{:.3}", ms(d)))
            .unwrap_or_default();
        writeln!(out, "{start:.3},{:.3},{first}", ms(s.latency))?;
    }
    out.flush().context("writing the samples")
}

fn summarise(args: &Args, results: Vec<ClientResult>) -> Report {
    let mut latencies = Vec::new();
    let mut first_events = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    for r in results {
        errors += r.errors;
        first_error = first_error.or(r.first_error);
        for s in r.samples {
            latencies.push(ms(s.latency));
            first_events.extend(s.first_event.map(ms));
        }
    }
    let runs = latencies.len();
    Report {
        tool: "spindle-loadgen",
        scenario: args.scenario().name().to_string(),
        clients: args.clients,
        urls: args.url.len(),
        duration_s: args.duration,
        runs,
        errors,
        runs_per_s: runs as f64 / args.duration,
        latency_ms: Percentiles::of(latencies),
        first_event_ms: Percentiles::of(first_events),
        first_error,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::{base_urls, Cli, Command};
    use clap::Parser;

    #[test]
    fn the_load_command_line_is_unchanged_and_hold_is_a_subcommand() {
        let cli = Cli::try_parse_from([
            "spindle-loadgen",
            "--url",
            "http://a:1,http://b:2",
            "--scenario",
            "wait",
            "--clients",
            "16",
            "--duration",
            "5",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.load.url.len(), 2);
        assert_eq!(cli.load.scenario(), super::Scenario::Wait);
        assert!(Cli::try_parse_from(["spindle-loadgen", "--clients", "16"]).is_err());
        assert!(Cli::try_parse_from(["spindle-loadgen", "--url", "http://a:1"]).is_err());
        let cli = Cli::try_parse_from(["spindle-loadgen", "hold", "--streams", "f.jsonl"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Hold(_))));
        // The load's flags do not mix with `hold`.
        assert!(Cli::try_parse_from([
            "spindle-loadgen",
            "--url",
            "http://a:1",
            "hold",
            "--streams",
            "f"
        ])
        .is_err());
    }

    #[test]
    fn urls_lose_their_trailing_slash_and_none_may_be_empty() {
        let urls =
            |list: &[&str]| base_urls(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            urls(&["http://a:1/", " http://b:2"]).unwrap(),
            ["http://a:1", "http://b:2"]
        );
        assert!(urls(&["http://a:1", ""]).is_err());
        assert!(urls(&[]).is_err());
    }
}
