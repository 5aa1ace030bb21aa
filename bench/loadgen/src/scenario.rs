//! One operation of each scenario, as a client of the agent-server API would do it.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use crate::sse::FrameReader;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// POST /threads, then POST /threads/{id}/runs/wait.
    Wait,
    /// POST /threads, then POST /threads/{id}/runs/stream, read to the end.
    Stream,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Wait => "wait",
            Scenario::Stream => "stream",
        }
    }
}

/// The timings of one successful operation.
pub struct Sample {
    /// When the operation began (its POST /threads was sent).
    pub started: Instant,
    /// From sending POST /threads to having the run's whole answer.
    pub latency: Duration,
    /// From sending the stream request to receiving its first complete event frame.
    pub first_event: Option<Duration>,
}

/// The server under load and what every run asks of it.
pub struct Target {
    pub http: reqwest::Client,
    /// The server's base URLs: one per process when several serve the same database.
    pub base_urls: Vec<String>,
    /// The run request body, serialised once: the load generator should cost little.
    pub run_body: Vec<u8>,
    /// Keys the waited-on run's output must hold (top level), so a fast wrong answer is an error.
    pub expect: Option<serde_json::Map<String, Value>>,
}

impl Target {
    /// One operation, all of whose requests go to `base_url` (one of `base_urls`).
    pub async fn run_once(&self, base_url: &str, scenario: Scenario) -> Result<Sample> {
        let started = Instant::now();
        let thread_id = self.create_thread(base_url).await?;
        let first_event = match scenario {
            Scenario::Wait => {
                self.wait_run(base_url, &thread_id).await?;
                None
            }
            Scenario::Stream => Some(self.stream_run(base_url, &thread_id).await?),
        };
        Ok(Sample {
            started,
            latency: started.elapsed(),
            first_event,
        })
    }

    async fn create_thread(&self, base_url: &str) -> Result<String> {
        let resp = self
            .http
            .post(format!("{base_url}/threads"))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .context("POST /threads")?;
        let body: Value = ok_json(resp, "POST /threads").await?;
        body["thread_id"]
            .as_str()
            .map(str::to_owned)
            .context("POST /threads answered without a thread_id")
    }

    async fn wait_run(&self, base_url: &str, thread_id: &str) -> Result<()> {
        let resp = self
            .run_request(base_url, thread_id, "wait")
            .send()
            .await
            .context("POST runs/wait")?;
        let output: Value = ok_json(resp, "POST runs/wait").await?;
        self.check_output(&output)
    }

    /// Reads the stream to its end; returns the time to its first event frame.
    async fn stream_run(&self, base_url: &str, thread_id: &str) -> Result<Duration> {
        let started = Instant::now();
        let mut resp = self
            .run_request(base_url, thread_id, "stream")
            .send()
            .await
            .context("POST runs/stream")?;
        ensure!(
            resp.status().is_success(),
            "POST runs/stream answered {}",
            resp.status()
        );
        let mut frames = FrameReader::default();
        let mut first_event = None;
        while let Some(chunk) = resp.chunk().await.context("reading the run stream")? {
            for name in frames.push(&chunk) {
                first_event.get_or_insert_with(|| started.elapsed());
                if name == "error" {
                    bail!("the run stream sent an error event");
                }
            }
        }
        first_event.context("the run stream ended without an event")
    }

    fn run_request(&self, base_url: &str, thread_id: &str, kind: &str) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{base_url}/threads/{thread_id}/runs/{kind}"))
            .header("content-type", "application/json")
            .body(self.run_body.clone())
    }

    fn check_output(&self, output: &Value) -> Result<()> {
        let Some(expect) = &self.expect else {
            return Ok(());
        };
        for (key, want) in expect {
            ensure!(
                output.get(key) == Some(want),
                "runs/wait answered {output}, expected {key} = {want}"
            );
        }
        Ok(())
    }
}

/// The body of a 2xx answer as JSON; any other status is an error that quotes the body.
async fn ok_json(resp: reqwest::Response, what: &str) -> Result<Value> {
    let status = resp.status();
    let bytes = resp
        .bytes()
        .await
        .with_context(|| format!("{what}: body"))?;
    ensure!(
        status.is_success(),
        "{what} answered {status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    serde_json::from_slice(&bytes).with_context(|| format!("{what}: answer is not JSON"))
}
