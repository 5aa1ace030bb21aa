//! `spindle-loadgen hold`: opens many SSE streams and holds them, idle, for as little CPU as
//! possible, so that a benchmark of what open streams cost the server (bench/idle_streams.py)
//! measures the server and not the client holding them.
//!
//! Ten thousand streams get a keepalive comment every 5 s each, 2,000 frames a second: read by
//! Python, that took about 10 % of a core on the cores the server and the measured load share.
//! Here one runtime thread reads them: a hand-written HTTP/1.1 request per connection (the
//! server's answer is a chunked body; decoding it in place needs no copy), one read buffer for
//! all the streams, one read per frame (not a second one to learn the socket is empty), a nap
//! before each wait so that a wake-up finds the frames of many streams (`main`), and frames
//! counted byte by byte without allocating.
//!
//! The protocol with its caller, on stdout, one JSON object a line (flushed):
//! - once every stream was tried: `{"opened": N, "failed": [{"kind", "url", "error"}, ...]}`;
//! - for every line read on stdin: `{"snapshot": [per kind, as below]}`, counts so far;
//! - at the end (SIGTERM, SIGINT or stdin closed), one line per kind: `{"kind", "streams",
//!   "failed", "open", "heartbeats", "events", "closed_by_server", "errors", "first_error"}`.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;

#[derive(Debug, clap::Args)]
pub struct HoldArgs {
    /// The streams, one JSON object a line:
    /// {"kind": "...", "method": "GET"|"POST", "url": "http://host:port/path", "body": JSON or null}.
    #[arg(long)]
    streams: PathBuf,
    /// Streams being opened at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Seconds before opening one stream (connection, request, the answer's head) gives up.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Once the streams are open, milliseconds the thread sleeps before it waits for the
    /// sockets again, so that one wake-up reads the frames of many streams (0: wake at each).
    #[arg(long, default_value_t = 50)]
    batch_ms: u64,
}

/// One line of `--streams`.
#[derive(Debug, Deserialize)]
struct Spec {
    kind: String,
    #[serde(default = "get")]
    method: String,
    url: String,
    #[serde(default)]
    body: Value,
}

fn get() -> String {
    "GET".to_string()
}

/// What the streams of one kind saw, shared by their tasks. Atomics only because
/// `tokio::spawn` wants `Send`: on one thread they cost what plain adds do.
#[derive(Default)]
struct Counts {
    streams: AtomicU64,
    failed: AtomicU64,
    heartbeats: AtomicU64,
    events: AtomicU64,
    closed_by_server: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Counts {
    /// Adds a read's frames and empties the tally.
    fn add(&self, tally: &mut Tally) {
        if tally.heartbeats > 0 {
            self.heartbeats.fetch_add(tally.heartbeats, Relaxed);
        }
        if tally.events > 0 {
            self.events.fetch_add(tally.events, Relaxed);
        }
        *tally = Tally::default();
    }

    fn report(&self, kind: &str) -> Value {
        let get = |n: &AtomicU64| n.load(Relaxed);
        let ended = get(&self.closed_by_server) + get(&self.errors);
        json!({
            "kind": kind,
            "streams": get(&self.streams),
            "failed": get(&self.failed),
            "open": get(&self.streams).saturating_sub(ended),
            "heartbeats": get(&self.heartbeats),
            "events": get(&self.events),
            "closed_by_server": get(&self.closed_by_server),
            "errors": get(&self.errors),
            "first_error": self.first_error.lock().unwrap().clone(),
        })
    }
}

/// The kinds in the order the file names them first.
struct Kinds(Vec<(String, Arc<Counts>)>);

impl Kinds {
    fn of(specs: &[Spec]) -> Self {
        let mut kinds: Vec<(String, Arc<Counts>)> = Vec::new();
        for spec in specs {
            if !kinds.iter().any(|(k, _)| *k == spec.kind) {
                kinds.push((spec.kind.clone(), Arc::default()));
            }
        }
        Kinds(kinds)
    }

    fn counts(&self, kind: &str) -> Arc<Counts> {
        let (_, counts) = self
            .0
            .iter()
            .find(|(k, _)| k == kind)
            .expect("a kind of the file");
        Arc::clone(counts)
    }

    fn reports(&self) -> Vec<Value> {
        self.0.iter().map(|(k, c)| c.report(k)).collect()
    }
}

pub fn main(args: HoldArgs) -> Result<()> {
    // One thread: the streams are idle, and the cores belong to the server being measured.
    // Each keepalive arrives on its own (the streams' timers are spread), and waking the thread
    // costs more than reading a frame: once all are open, a nap before each wait lets the
    // frames of many streams gather for one wake-up (280 streams with a keepalive a second, on
    // this 2-core VM: 0.6-1 % of a core without, 0.4 % with 20 ms, 0.15-0.2 % with 50 or
    // 100 ms; Python's reader took 3 %). Not while opening: each open waits on round trips,
    // which the nap would slow.
    let batch = Duration::from_millis(args.batch_ms);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(move || {
            if HOLDING.with(Cell::get) && !batch.is_zero() {
                std::thread::sleep(batch);
            }
        })
        .build()
        .context("building the runtime")?;
    let result = runtime.block_on(run(args));
    // Not a plain drop: that waits for the blocking read of stdin, which a signal leaves
    // pending as long as the caller keeps stdin open.
    runtime.shutdown_background();
    result
}

enum Request {
    Snapshot,
    Stop,
}

/// SIGTERM, SIGINT and stdin: a line asks for a snapshot, the end of stdin (the caller gone)
/// or a signal for the end.
struct Requests {
    term: Signal,
    int: Signal,
    lines: mpsc::UnboundedReceiver<()>,
}

impl Requests {
    fn new() -> Result<Self> {
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            while let Ok(Some(_)) = stdin.next_line().await {
                if tx.send(()).is_err() {
                    break;
                }
            }
        });
        Ok(Requests {
            term: signal(SignalKind::terminate()).context("SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("SIGINT")?,
            lines,
        })
    }

    async fn next(&mut self) -> Request {
        tokio::select! {
            _ = self.term.recv() => Request::Stop,
            _ = self.int.recv() => Request::Stop,
            line = self.lines.recv() => match line {
                Some(()) => Request::Snapshot,
                None => Request::Stop,
            },
        }
    }
}

fn emit(line: &Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush().context("writing to stdout")
}

async fn run(args: HoldArgs) -> Result<()> {
    let specs = read_specs(&args.streams)?;
    let kinds = Kinds::of(&specs);
    let mut requests = Requests::new()?;
    let timeout = Duration::from_secs(args.timeout);
    let mut opening = std::pin::pin!(open_all(specs, &kinds, args.concurrency.max(1), timeout));
    let opened = loop {
        tokio::select! {
            failed = &mut opening => break Some(failed),
            request = requests.next() => match request {
                Request::Snapshot => emit(&json!({"snapshot": kinds.reports()}))?,
                Request::Stop => break None,
            },
        }
    };
    if let Some((opened, failed)) = opened {
        HOLDING.with(|holding| holding.set(true));
        emit(&json!({"opened": opened, "failed": failed}))?;
        while let Request::Snapshot = requests.next().await {
            emit(&json!({"snapshot": kinds.reports()}))?;
        }
    }
    for report in kinds.reports() {
        emit(&report)?;
    }
    Ok(())
}

fn read_specs(path: &std::path::Path) -> Result<Vec<Spec>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line)
                .with_context(|| format!("{} line {}: not a stream", path.display(), i + 1))
        })
        .collect()
}

/// Opens every stream, `concurrency` at a time; each one's holding task starts as soon as it is
/// open. Answers how many opened, and the failures.
async fn open_all(
    specs: Vec<Spec>,
    kinds: &Kinds,
    concurrency: usize,
    timeout: Duration,
) -> (u64, Vec<Value>) {
    let mut attempts = futures::stream::iter(specs.into_iter().map(|spec| async move {
        let result = tokio::time::timeout(timeout, open(&spec))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer in {timeout:?}")));
        (spec, result)
    }))
    .buffer_unordered(concurrency);
    let (mut opened, mut failed) = (0, Vec::new());
    while let Some((spec, result)) = attempts.next().await {
        let counts = kinds.counts(&spec.kind);
        match result {
            Ok((conn, body, mut tally)) => {
                opened += 1;
                counts.streams.fetch_add(1, Relaxed);
                counts.add(&mut tally);
                tokio::spawn(hold(conn, body, counts));
            }
            Err(err) => {
                counts.failed.fetch_add(1, Relaxed);
                failed
                    .push(json!({"kind": spec.kind, "url": spec.url, "error": format!("{err:#}")}));
            }
        }
    }
    (opened, failed)
}

/// Connects, sends the request and reads the answer's head: 200 and `text/event-stream`, or an
/// error. Answers the connection, the body's reader, and the frames that came with the head.
async fn open(spec: &Spec) -> Result<(TcpStream, Body, Tally)> {
    let url = reqwest::Url::parse(&spec.url).context("not a URL")?;
    ensure!(url.scheme() == "http", "only http:// URLs");
    let host = url.host_str().context("no host")?;
    let port = url.port_or_known_default().context("no port")?;
    let mut conn = TcpStream::connect((host, port)).await?;
    conn.set_nodelay(true)?;
    let body = match &spec.body {
        Value::Null => None,
        body => Some(serde_json::to_vec(body)?),
    };
    let target = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_string(),
    };
    let mut request = format!(
        "{} {target} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\
         User-Agent: spindle-loadgen-hold\r\n",
        spec.method,
    )
    .into_bytes();
    if let Some(body) = &body {
        request.extend_from_slice(
            format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            )
            .as_bytes(),
        );
    } else if spec.method != "GET" {
        request.extend_from_slice(b"Content-Length: 0\r\n");
    }
    request.extend_from_slice(b"\r\n");
    request.extend(body.unwrap_or_default());
    conn.write_all(&request).await?;

    let mut head = Vec::with_capacity(1024);
    let end = loop {
        if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        ensure!(head.len() < 64 * 1024, "an answer's head over 64 KiB");
        if conn.read_buf(&mut head).await? == 0 {
            bail!("the connection closed before the answer's head");
        }
    };
    let text = String::from_utf8_lossy(&head[..end]);
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default().to_string();
    let header = |name: &str| {
        text.split("\r\n").skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_ascii_lowercase())
        })
    };
    if status_line.split(' ').nth(1) != Some("200") {
        let rest = String::from_utf8_lossy(&head[end + 4..]);
        bail!(
            "{} {}: {status_line} {:?}",
            spec.method,
            url.path(),
            rest.chars().take(300).collect::<String>()
        );
    }
    let content_type = header("content-type").unwrap_or_default();
    ensure!(
        content_type.starts_with("text/event-stream"),
        "content-type {content_type:?}, not text/event-stream"
    );
    let chunked = header("transfer-encoding").is_some_and(|te| te.contains("chunked"));
    let mut body = Body::new(chunked);
    let mut tally = Tally::default();
    let ended = body
        .push(&head[end + 4..], &mut tally)
        .map_err(anyhow::Error::msg)?;
    ensure!(!ended, "the stream ended with its answer's head");
    Ok((conn, body, tally))
}

thread_local! {
    /// Whether every stream was tried, and the thread may nap before waiting (`main`).
    static HOLDING: Cell<bool> = const { Cell::new(false) };
    /// The one read buffer: a read copies in and is counted at once, no await in between, so
    /// every stream of the (single) thread can share it.
    static BUF: RefCell<Box<[u8]>> = RefCell::new(vec![0; 64 * 1024].into_boxed_slice());
}

/// Reads the stream until the server ends it, counting its frames.
async fn hold(conn: TcpStream, mut body: Body, counts: Arc<Counts>) {
    let mut tally = Tally::default();
    let end: Result<(), String> = loop {
        if let Err(err) = conn.readable().await {
            break Err(err.to_string());
        }
        let step = BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            match conn.try_read(&mut buf) {
                Ok(0) => Some(Ok(())),
                Ok(n) => {
                    if n < buf.len() {
                        // A short read emptied the socket: mark it not ready without the read
                        // that would answer WouldBlock (half the system calls per frame). What
                        // arrives after it is a new edge of the (edge-triggered) epoll, which
                        // marks it ready again: no driver poll runs in between to lose it.
                        let _ = conn.try_io(Interest::READABLE, || {
                            Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
                        });
                    }
                    match body.push(&buf[..n], &mut tally) {
                        Ok(true) => Some(Ok(())),
                        Ok(false) => None,
                        Err(err) => Some(Err(err)),
                    }
                }
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => None,
                Err(err) => Some(Err(err.to_string())),
            }
        });
        counts.add(&mut tally);
        if let Some(end) = step {
            break end;
        }
    };
    match end {
        Ok(()) => {
            counts.closed_by_server.fetch_add(1, Relaxed);
        }
        Err(err) => {
            counts.errors.fetch_add(1, Relaxed);
            counts.first_error.lock().unwrap().get_or_insert(err);
        }
    }
}

/// Frames completed by a read: comment-only frames (keepalives) and the others (events).
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    heartbeats: u64,
    events: u64,
}

/// A response body as it arrives: chunked (decoded in place) or not, its SSE frames counted.
struct Body {
    chunks: Option<Chunk>,
    frames: Frames,
}

/// Where the chunked decoding is.
#[derive(Debug)]
enum Chunk {
    /// In a chunk's size line: the size so far, whether a digit came, whether in an extension.
    Size { size: u64, digits: bool, ext: bool },
    /// In a chunk's data, with this many bytes left.
    Data(u64),
    /// After a chunk's data, before its line end.
    DataEnd,
    /// The last (empty) chunk came: the body is over.
    Done,
}

const SIZE: Chunk = Chunk::Size {
    size: 0,
    digits: false,
    ext: false,
};

impl Body {
    fn new(chunked: bool) -> Self {
        Body {
            chunks: chunked.then_some(SIZE),
            frames: Frames::default(),
        }
    }

    /// Feeds bytes as read from the connection; answers whether the body ended.
    fn push(&mut self, mut data: &[u8], tally: &mut Tally) -> Result<bool, String> {
        let Some(chunk) = &mut self.chunks else {
            self.frames.push(data, tally);
            return Ok(false);
        };
        while let Some((&b, rest)) = data.split_first() {
            match chunk {
                Chunk::Size { size, digits, ext } => {
                    data = rest;
                    match b {
                        b'\n' if !*digits => return Err("a chunk without a size".into()),
                        b'\n' if *size == 0 => *chunk = Chunk::Done,
                        b'\n' => *chunk = Chunk::Data(*size),
                        b'\r' => {}
                        _ if *ext => {}
                        b';' => *ext = true,
                        _ => {
                            let digit = (b as char)
                                .to_digit(16)
                                .ok_or_else(|| format!("a chunk size with {:?}", b as char))?;
                            *size = size.checked_mul(16).ok_or("a chunk size too large")?
                                + u64::from(digit);
                            *digits = true;
                        }
                    }
                }
                Chunk::Data(left) => {
                    let n = data.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    self.frames.push(&data[..n], tally);
                    data = &data[n..];
                    *left -= n as u64;
                    if *left == 0 {
                        *chunk = Chunk::DataEnd;
                    }
                }
                Chunk::DataEnd => {
                    data = rest;
                    match b {
                        b'\r' => {}
                        b'\n' => *chunk = SIZE,
                        _ => return Err("a chunk longer than its size".into()),
                    }
                }
                Chunk::Done => break,
            }
        }
        Ok(matches!(chunk, Chunk::Done))
    }
}

/// Where an SSE frame ends (a blank line) and whether it holds only comments (lines starting
/// with ':', the keepalives). "\r" is skipped: servers end lines with "\n" (Spindle) or "\r\n".
#[derive(Debug)]
struct Frames {
    line_start: bool,
    in_frame: bool,
    comment: bool,
}

impl Default for Frames {
    fn default() -> Self {
        Frames {
            line_start: true,
            in_frame: false,
            comment: false,
        }
    }
}

impl Frames {
    fn push(&mut self, data: &[u8], tally: &mut Tally) {
        for &b in data {
            match b {
                b'\r' => {}
                b'\n' if !self.line_start => self.line_start = true,
                // A blank line: the end of the frame, if one began.
                b'\n' if self.in_frame => {
                    if self.comment {
                        tally.heartbeats += 1;
                    } else {
                        tally.events += 1;
                    }
                    self.in_frame = false;
                }
                b'\n' => {}
                _ if self.line_start => {
                    if !self.in_frame {
                        self.in_frame = true;
                        self.comment = b == b':';
                    } else if b != b':' {
                        self.comment = false;
                    }
                    self.line_start = false;
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Body, Tally};

    fn tally(heartbeats: u64, events: u64) -> Tally {
        Tally { heartbeats, events }
    }

    /// Feeds each piece in turn; answers the tally and whether the body ended.
    fn feed(body: &mut Body, pieces: &[&[u8]]) -> (Tally, bool) {
        let mut t = Tally::default();
        let mut ended = false;
        for piece in pieces {
            ended = body.push(piece, &mut t).unwrap();
        }
        (t, ended)
    }

    #[test]
    fn frames_are_counted_across_chunks_and_reads() {
        let mut body = Body::new(true);
        // ": keepalive\n\n" (13 bytes) and an event split over two chunks and three reads.
        let (t, ended) = feed(
            &mut body,
            &[
                b"d\r\n: keepalive\n\n\r\n",
                b"10\r\nevent: metadata\n\r",
                b"\na;ext=1\r\ndata: {}\n\n\r\n",
            ],
        );
        assert_eq!((t, ended), (tally(1, 1), false));
        let (t, ended) = feed(&mut body, &[b"0\r\n\r\n"]);
        assert_eq!((t, ended), (tally(0, 0), true));
    }

    #[test]
    fn crlf_lines_and_mixed_frames() {
        let mut body = Body::new(false);
        let (t, _) = feed(
            &mut body,
            &[
                b": a\r\n: b\r\n\r\n",
                b": c\r\ndata: x\r\n\r\n\n\n",
                b"data: y\n",
            ],
        );
        // A frame with data after a comment is an event; extra blank lines are no frames;
        // "data: y" is not complete yet.
        assert_eq!(t, tally(1, 1));
        let (t, _) = feed(&mut body, &[b"\n"]);
        assert_eq!(t, tally(0, 1));
    }

    #[test]
    fn broken_chunking_is_an_error() {
        let mut t = Tally::default();
        assert!(Body::new(true).push(b"zz\r\n", &mut t).is_err());
        assert!(Body::new(true).push(b"1\r\nab\r\n", &mut t).is_err());
        assert!(Body::new(true).push(b"\r\n", &mut t).is_err());
    }
}
