//! One worker process: `PYTHON -m spindle_worker` with one end of a socketpair as fd 3
//! (`docs/python-worker-protocol.md`, "Process and transport").
//!
//! A [`WorkerProcess`] is the handle a supervisor owns: the [`Connection`] to the worker,
//! `init` and `ping`, and the worker's exit, published once it is reaped. Dropping the handle
//! kills the worker; the worker also exits by itself when its socket closes, so neither side
//! outlives the other.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use command_fds::{CommandFdExt, FdMapping};
use rmpv::Value;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::connection::{CallError, Connection, WorkerCalls};

/// The worker's end of the socket, as the worker finds it (`SPINDLE_WORKER_FD`).
const WORKER_FD: i32 = 3;

/// Lines of stderr kept to explain an exit ("exited with status 2: spindle_worker: ...").
const STDERR_TAIL: usize = 20;

/// A logged output line is cut here: one huge `print` must not make one huge log record.
const MAX_LOG_LINE: usize = 16 * 1024;

/// How long a call that lost its connection waits for the exit to be known, so its error can
/// say how the worker ended instead of only that the socket closed.
const EXIT_EXPLAIN_WAIT: Duration = Duration::from_secs(2);

/// How long the exit report waits for the last stderr lines after the process is reaped (a
/// process the worker started may still hold the pipe).
const STDERR_DRAIN_WAIT: Duration = Duration::from_secs(1);

/// How to start one worker.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// For logs and errors, e.g. `python-1`.
    pub name: String,
    /// The interpreter (see `interpreter::choose_interpreter`).
    pub python: PathBuf,
    /// The project's directory: the worker's working directory, where `./file.py:var` specs
    /// are resolved.
    pub project_dir: PathBuf,
    /// The config's `env`, added to Spindle's own environment.
    pub env: BTreeMap<String, String>,
    /// `SPINDLE_WORKER_MAX_RUNS`: the runs the worker executes at once.
    pub max_runs: u32,
}

/// The worker's answer to `init`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct InitReport {
    pub graphs: BTreeMap<String, GraphLoad>,
    pub python: String,
    pub langgraph: String,
    /// How the custom auth loaded, when one was asked for (`kind` unused).
    #[serde(default)]
    pub auth: Option<GraphLoad>,
}

/// How one graph loaded.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GraphLoad {
    pub ok: bool,
    #[serde(default)]
    pub kind: Option<GraphKind>,
    /// `ExceptionClass: message` when the graph failed to load.
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub traceback: Option<String>,
    /// The compiled graph's own name, when it has one (not LangGraph's default): it names
    /// the graph's default assistant.
    #[serde(default)]
    pub name: Option<String>,
}

/// What a graph spec named: the worker compiles a `StateGraph` and calls a factory per run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GraphKind {
    Compiled,
    StateGraph,
    Factory,
    /// A kind a newer worker reports.
    #[serde(other)]
    Other,
}

/// The worker's answer to `ping`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Health {
    pub active_runs: u64,
    /// How late the worker's event loop ran a timer: a blocked loop shows here first.
    pub loop_lag_ms: f64,
    pub rss_bytes: u64,
}

/// How a worker process ended.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerExit {
    /// Its exit status; `None` when it could not be read (the reason is logged).
    pub status: Option<ExitStatus>,
    /// Spindle killed it (drop, `kill`, or a shutdown past its grace).
    pub killed: bool,
    /// The last lines it wrote on stderr.
    pub stderr_tail: Vec<String>,
}

impl fmt::Display for WorkerExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.status, self.killed) {
            (_, true) => write!(f, "killed by Spindle")?,
            (Some(status), false) => write!(f, "exited ({status})")?,
            (None, false) => write!(f, "ended (its status could not be read)")?,
        }
        if let Some(last) = self.stderr_tail.last() {
            write!(f, "; last stderr line: {last}")?;
        }
        Ok(())
    }
}

/// Why a worker could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot create the worker's socket: {0}")]
    Socket(std::io::Error),
    #[error("cannot start `{python} -m spindle_worker` in {project_dir}: {error}")]
    Start {
        python: String,
        project_dir: String,
        error: std::io::Error,
    },
}

/// Why a call to the worker failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{op}: {error}")]
    Call { op: String, error: CallError },
    #[error("the worker {name} {exit} before answering {op}")]
    Exited {
        name: String,
        op: String,
        exit: WorkerExit,
    },
}

/// A running worker process and the connection to it.
pub struct WorkerProcess {
    name: String,
    pid: Option<u32>,
    connection: Connection,
    exit: watch::Receiver<Option<WorkerExit>>,
    /// Sending (or dropping) it makes the monitor kill the process.
    kill: Option<oneshot::Sender<()>>,
    project_dir: PathBuf,
    /// Spindle asked the worker to exit ([`WorkerProcess::close`]): its exit is planned.
    closing: Arc<AtomicBool>,
}

impl WorkerProcess {
    /// Starts the worker; its requests and events go to `calls`. The worker is not ready for
    /// runs until [`WorkerProcess::init`] has loaded the graphs.
    pub fn spawn(
        spec: WorkerSpec,
        calls: Arc<dyn WorkerCalls>,
    ) -> Result<WorkerProcess, SpawnError> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(SpawnError::Socket)?;
        ours.set_nonblocking(true).map_err(SpawnError::Socket)?;
        let mut command = worker_command(&spec, theirs.into()).map_err(SpawnError::Socket)?;
        let spawned = command.spawn();
        // The command holds our copy of the worker's end; closing it now means EOF on ours
        // once the worker is gone.
        drop(command);
        let mut child = spawned.map_err(|error| SpawnError::Start {
            python: spec.python.display().to_string(),
            project_dir: spec.project_dir.display().to_string(),
            error,
        })?;
        let stream = tokio::net::UnixStream::from_std(ours).map_err(SpawnError::Socket)?;
        let connection = Connection::new(spec.name.clone(), stream, calls);
        let pid = child.id();
        tracing::info!(worker = %spec.name, pid, python = %spec.python.display(), "Python worker started");

        let tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(out) = child.stdout.take() {
            tokio::spawn(log_lines(
                spec.name.clone(),
                out,
                Stream::Stdout,
                tail.clone(),
            ));
        }
        let stderr = child.stderr.take().map(|err| {
            tokio::spawn(log_lines(
                spec.name.clone(),
                err,
                Stream::Stderr,
                tail.clone(),
            ))
        });
        let (kill, killed) = oneshot::channel();
        let (exit_tx, exit) = watch::channel(None);
        let closing = Arc::new(AtomicBool::new(false));
        tokio::spawn(monitor(
            spec.name.clone(),
            child,
            killed,
            stderr,
            tail,
            exit_tx,
            closing.clone(),
        ));
        Ok(WorkerProcess {
            name: spec.name,
            pid,
            connection,
            exit,
            kill: Some(kill),
            project_dir: spec.project_dir,
            closing,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The connection, for the requests a supervisor makes (`run.start`, `state.*`, ...).
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Loads the graphs (`{graph_id: "./path.py:var" | "pkg.module:var"}`). One that fails
    /// is reported in its entry; the others still load.
    pub async fn init(&self, graphs: &BTreeMap<String, String>) -> Result<InitReport, WorkerError> {
        self.init_project(graphs, None).await
    }

    /// [`WorkerProcess::init`], and LangGraph's custom auth (`auth.path`: `./auth.py:auth`)
    /// loaded for `auth.authenticate` and `auth.authorize`.
    pub async fn init_project(
        &self,
        graphs: &BTreeMap<String, String>,
        auth: Option<&str>,
    ) -> Result<InitReport, WorkerError> {
        #[derive(Serialize)]
        struct Init<'a> {
            graphs: &'a BTreeMap<String, String>,
            project_dir: String,
            #[serde(skip_serializing_if = "Option::is_none")]
            auth: Option<&'a str>,
        }
        let body = Init {
            graphs,
            project_dir: self.project_dir.display().to_string(),
            auth,
        };
        self.call("init", &body).await
    }

    /// The worker's health; a supervisor calls it periodically, with its own timeout.
    pub async fn ping(&self) -> Result<Health, WorkerError> {
        self.call("ping", &Value::Nil).await
    }

    /// A typed request; when the worker died meanwhile, the error says how it ended.
    pub async fn call<B: Serialize, R: serde::de::DeserializeOwned>(
        &self,
        op: &str,
        body: &B,
    ) -> Result<R, WorkerError> {
        match self.connection.call(op, body).await {
            Ok(answer) => Ok(answer),
            Err(error @ CallError::Closed(_)) => Err(self.explain_closed(op, error).await),
            Err(error) => Err(WorkerError::Call {
                op: op.to_owned(),
                error,
            }),
        }
    }

    async fn explain_closed(&self, op: &str, error: CallError) -> WorkerError {
        match tokio::time::timeout(EXIT_EXPLAIN_WAIT, wait_exit(self.exit.clone())).await {
            Ok(exit) => WorkerError::Exited {
                name: self.name.clone(),
                op: op.to_owned(),
                exit,
            },
            Err(_) => WorkerError::Call {
                op: op.to_owned(),
                error,
            },
        }
    }

    /// How the process ended, once it has (a supervisor watches this to replace it).
    pub fn exit(&self) -> watch::Receiver<Option<WorkerExit>> {
        self.exit.clone()
    }

    /// Waits for the process to end.
    pub async fn exited(&self) -> WorkerExit {
        wait_exit(self.exit.clone()).await
    }

    /// Kills the process now (SIGKILL); [`WorkerProcess::exited`] then reports it.
    pub fn kill(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
    }

    /// Asks the worker to exit: closes its socket, on which it cancels its runs and exits by
    /// itself. Its exit is then planned (a reload, a recycle, a shutdown) and logged as such,
    /// not as a worker that died.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.connection.close();
    }

    /// Closes the socket so the worker exits by itself (its runs are cancelled there), and
    /// kills it if it has not within `grace`.
    pub async fn shutdown(mut self, grace: Duration) -> WorkerExit {
        self.close();
        let exit = self.exit.clone();
        if let Ok(ended) = tokio::time::timeout(grace, wait_exit(exit.clone())).await {
            return ended;
        }
        tracing::warn!(worker = %self.name, ?grace, "Python worker did not exit after its socket closed; killing it");
        self.kill();
        wait_exit(exit).await
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        // Dropping the sender is enough for the monitor; said here so it is not missed.
        self.kill.take();
    }
}

impl fmt::Debug for WorkerProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerProcess")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .finish()
    }
}

async fn wait_exit(mut exit: watch::Receiver<Option<WorkerExit>>) -> WorkerExit {
    let ended = match exit.wait_for(Option::is_some).await {
        Ok(ended) => ended.clone(),
        Err(_) => None,
    };
    // The monitor always publishes before it ends; `None` is only left if it panicked.
    ended.unwrap_or(WorkerExit {
        status: None,
        killed: false,
        stderr_tail: vec![],
    })
}

/// The command: interpreter, module, working directory, environment, fd 3, piped output.
fn worker_command(spec: &WorkerSpec, worker_end: OwnedFd) -> std::io::Result<Command> {
    let mut command = Command::new(&spec.python);
    command
        .args(["-m", "spindle_worker"])
        .current_dir(&spec.project_dir)
        // Output goes to the logs as it is written, not when a buffer fills.
        .env("PYTHONUNBUFFERED", "1")
        .envs(&spec.env)
        .env("SPINDLE_WORKER_FD", WORKER_FD.to_string())
        .env("SPINDLE_WORKER_MAX_RUNS", spec.max_runs.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: a Ctrl-C at Spindle's terminal reaches Spindle only, which
        // decides when workers stop (their runs are Spindle's to hand back).
        .process_group(0)
        .kill_on_drop(true);
    let mapping = FdMapping {
        parent_fd: worker_end,
        child_fd: WORKER_FD,
    };
    command
        .fd_mappings(vec![mapping])
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(command)
}

/// Owns the child: reaps it when it exits, kills it when asked (or when the handle is
/// dropped), then publishes how it ended.
async fn monitor(
    name: String,
    mut child: Child,
    kill: oneshot::Receiver<()>,
    stderr: Option<JoinHandle<()>>,
    tail: Arc<Mutex<VecDeque<String>>>,
    exit: watch::Sender<Option<WorkerExit>>,
    closing: Arc<AtomicBool>,
) {
    let mut killed = false;
    let status = tokio::select! {
        status = child.wait() => status,
        _ = kill => {
            killed = true;
            let _ = child.start_kill();
            child.wait().await
        }
    };
    if let Some(stderr) = stderr {
        let _ = tokio::time::timeout(STDERR_DRAIN_WAIT, stderr).await;
    }
    let stderr_tail = tail
        .lock()
        .map(|t| t.iter().cloned().collect())
        .unwrap_or_default();
    let ended = WorkerExit {
        status: status
            .inspect_err(|e| tracing::warn!(worker = %name, error = %e, "cannot read the Python worker's exit status"))
            .ok(),
        killed,
        stderr_tail,
    };
    // Killed, or exited cleanly once asked to: planned. Anything else is a worker that died.
    let asked = closing.load(Ordering::Acquire);
    if killed || (asked && ended.status.is_some_and(|s| s.success())) {
        tracing::info!(worker = %name, "Python worker {ended}");
    } else {
        tracing::warn!(worker = %name, "Python worker {ended}");
    }
    exit.send_replace(Some(ended));
}

#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// Logs the worker's output line by line under its name; stderr's last lines are kept for
/// the exit report. Bytes that are not UTF-8 are replaced, never a reason to stop reading.
async fn log_lines(
    name: String,
    output: impl AsyncRead + Unpin,
    stream: Stream,
    tail: Arc<Mutex<VecDeque<String>>>,
) {
    let mut reader = BufReader::new(output);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let line = printable_line(&buf);
        match stream {
            Stream::Stdout => tracing::info!(worker = %name, stream = "stdout", "{line}"),
            Stream::Stderr => {
                tracing::warn!(worker = %name, stream = "stderr", "{line}");
                let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        }
    }
}

fn printable_line(raw: &[u8]) -> String {
    let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
    let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
    let mut line = String::from_utf8_lossy(raw).into_owned();
    if line.len() > MAX_LOG_LINE {
        let mut cut = MAX_LOG_LINE;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push_str(" [cut]");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_lines_are_trimmed_cut_and_lossy() {
        assert_eq!(printable_line(b"hello\r\n"), "hello");
        assert_eq!(printable_line(b"no newline"), "no newline");
        assert_eq!(printable_line(b"bad \xff byte\n"), "bad \u{fffd} byte");
        let long = "é".repeat(MAX_LOG_LINE);
        let cut = printable_line(long.as_bytes());
        assert!(cut.len() <= MAX_LOG_LINE + " [cut]".len() && cut.ends_with(" [cut]"));
    }

    #[test]
    fn an_exit_says_how_and_what_it_last_said() {
        use std::os::unix::process::ExitStatusExt;
        let exit = WorkerExit {
            status: Some(ExitStatus::from_raw(2 << 8)),
            killed: false,
            stderr_tail: vec!["spindle_worker: bad".into()],
        };
        let text = exit.to_string();
        assert!(
            text.contains("exit status: 2") && text.contains("spindle_worker: bad"),
            "{text}"
        );
    }
}
