//! The metrics' names, types and labels as a scraper reads them, and that recording counts.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use spindle_storage::{
    ConnectionPool, IfExists, JsonObject, MultitaskStrategy, NewThread, PoolStats, QueuedRuns,
    ResourceId, Run, RunStatus, Scope, Storage,
};
use uuid::Uuid;

use super::*;
use crate::webhook::{WebhookConfig, Webhooks};

fn a_run(attempt: i32, created_ago: Duration) -> Run {
    let created_at = Utc::now() - chrono::Duration::from_std(created_ago).unwrap();
    Run {
        run_id: Uuid::now_v7(),
        thread_id: ResourceId::generate(),
        assistant_id: ResourceId::generate(),
        user_id: None,
        status: RunStatus::Running,
        kwargs: JsonObject::new(),
        metadata: JsonObject::new(),
        multitask_strategy: MultitaskStrategy::Reject,
        attempt,
        run_after: created_at,
        cancel: None,
        error: None,
        output: None,
        created_at,
        updated_at: created_at,
        started_at: None,
        ended_at: None,
    }
}

/// The sample lines of `text` (no comments), for lookups by series.
fn samples(text: &str) -> Vec<(&str, f64)> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample: series value");
            (series, value.parse().expect("a number"))
        })
        .collect()
}

fn value(text: &str, series: &str) -> Option<f64> {
    samples(text)
        .into_iter()
        .find(|(s, _)| *s == series)
        .map(|(_, v)| v)
}

#[test]
fn every_metric_is_described_with_its_type() {
    let metrics = Arc::new(Metrics::new());
    // A family of labelled series is described once it has one (an unlabelled metric, and
    // every stream kind and outcome, from the start).
    let meters = metrics.run_started("echo", &a_run(1, Duration::ZERO));
    meters
        .first_event(&a_run(1, Duration::ZERO))
        .unwrap()
        .observe();
    meters.ended(RunStatus::Success);
    metrics.storage_call("get_thread", Duration::from_millis(1), true);
    metrics.record(&Sample {
        pools: PoolStats {
            pools: vec![ConnectionPool {
                name: "main",
                open: 1,
                idle: 1,
                max: 16,
            }],
            writer_queue: Some(0),
        },
        queued: Some(QueuedRuns::default()),
        ..Sample::default()
    });
    let text = metrics.encode(Format::Prometheus);
    let types = [
        ("spindle_runs_ended_total", "counter"),
        ("spindle_runs_executing", "gauge"),
        ("spindle_run_duration_seconds", "histogram"),
        ("spindle_run_first_event_seconds", "histogram"),
        ("spindle_run_queue_wait_seconds", "histogram"),
        ("spindle_streams_open", "gauge"),
        ("spindle_webhook_deliveries_total", "counter"),
        ("spindle_cron_firings_total", "counter"),
        ("spindle_storage_call_duration_seconds", "histogram"),
        ("spindle_storage_call_errors_total", "counter"),
        ("spindle_worker_slots", "gauge"),
        ("spindle_worker_slots_in_use", "gauge"),
        ("spindle_python_workers", "gauge"),
        ("spindle_python_workers_taking_runs", "gauge"),
        ("spindle_python_runs", "gauge"),
        ("spindle_python_run_slots", "gauge"),
        ("spindle_db_connections", "gauge"),
        ("spindle_db_connections_max", "gauge"),
        ("spindle_db_writer_queue", "gauge"),
        ("spindle_queue_runs", "gauge"),
        ("spindle_queue_count_failures_total", "counter"),
    ];
    for (name, kind) in types {
        assert!(
            text.contains(&format!("\n# TYPE {name} {kind}\n"))
                || text.starts_with(&format!("# TYPE {name} {kind}\n")),
            "{name} {kind} in\n{text}"
        );
        assert!(text.contains(&format!("# HELP {name} ")), "{name}");
    }
    // Every kind of stream and every outcome is there from the start, at 0.
    for kind in StreamKind::ALL {
        let series = format!("spindle_streams_open{{kind=\"{}\"}}", kind.label());
        assert_eq!(value(&text, &series), Some(0.0), "{series}");
    }
    for outcome in ["success", "failed", "refused"] {
        let series = format!("spindle_webhook_deliveries_total{{outcome=\"{outcome}\"}}");
        assert_eq!(value(&text, &series), Some(0.0), "{series}");
    }
    for outcome in ["run_created", "no_run"] {
        let series = format!("spindle_cron_firings_total{{outcome=\"{outcome}\"}}");
        assert_eq!(value(&text, &series), Some(0.0), "{series}");
    }
}

#[test]
fn a_run_counts_while_it_executes_and_once_when_it_ends() {
    let metrics = Arc::new(Metrics::new());
    let run = a_run(1, Duration::from_millis(30));
    let meters = metrics.run_started("echo", &run);
    let executing = "spindle_runs_executing{graph=\"echo\"}";
    assert_eq!(
        value(&metrics.encode(Format::Prometheus), executing),
        Some(1.0)
    );
    meters.first_event(&run).unwrap().observe();
    meters.ended(RunStatus::Success);
    drop(meters);

    let text = metrics.encode(Format::Prometheus);
    assert_eq!(value(&text, executing), Some(0.0));
    let ended = "spindle_runs_ended_total{graph=\"echo\",status=\"success\"}";
    assert_eq!(value(&text, ended), Some(1.0));
    assert_eq!(
        value(&text, "spindle_run_duration_seconds_count{graph=\"echo\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "spindle_run_first_event_seconds_count{graph=\"echo\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "spindle_run_queue_wait_seconds_count"),
        Some(1.0)
    );
    // Created 30 ms before it started: past the 25 ms bucket, within the 50 ms one... or
    // later on a slow machine, but never in a bucket below 25 ms.
    assert_eq!(
        value(&text, "spindle_run_queue_wait_seconds_bucket{le=\"0.025\"}"),
        Some(0.0)
    );
    assert_eq!(
        value(&text, "spindle_run_queue_wait_seconds_bucket{le=\"+Inf\"}"),
        Some(1.0)
    );
    assert!(value(&text, "spindle_run_queue_wait_seconds_sum").unwrap() >= 0.03);
}

#[test]
fn a_later_attempt_is_no_measure_of_queue_wait_or_first_event() {
    let metrics = Arc::new(Metrics::new());
    let run = a_run(2, Duration::from_secs(60));
    let meters = metrics.run_started("chain", &run);
    assert!(meters.first_event(&run).is_none());
    meters.ended(RunStatus::Error);
    let text = metrics.encode(Format::Prometheus);
    assert_eq!(
        value(&text, "spindle_run_queue_wait_seconds_count"),
        Some(0.0)
    );
    let ended = "spindle_runs_ended_total{graph=\"chain\",status=\"error\"}";
    assert_eq!(value(&text, ended), Some(1.0));
}

#[test]
fn a_stream_counts_as_open_until_dropped() {
    let metrics = Metrics::new();
    let series = "spindle_streams_open{kind=\"websocket\"}";
    let first = metrics.stream_opened(StreamKind::WebSocket);
    let second = metrics.stream_opened(StreamKind::WebSocket);
    let run = metrics.stream_opened(StreamKind::Run);
    assert_eq!(
        value(&metrics.encode(Format::Prometheus), series),
        Some(2.0)
    );
    drop(first);
    drop(run);
    let text = metrics.encode(Format::Prometheus);
    assert_eq!(value(&text, series), Some(1.0));
    assert_eq!(
        value(&text, "spindle_streams_open{kind=\"run\"}"),
        Some(0.0)
    );
    drop(second);
}

#[test]
fn crons_and_storage_calls_count_by_label() {
    let metrics = Metrics::new();
    metrics.cron_fired(true);
    metrics.cron_fired(true);
    metrics.cron_fired(false);
    metrics.storage_call("get_thread", Duration::from_micros(300), false);
    metrics.storage_call("get_thread", Duration::from_millis(2), true);
    let text = metrics.encode(Format::Prometheus);
    let fired = |outcome: &str| {
        value(
            &text,
            &format!("spindle_cron_firings_total{{outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(
        (fired("run_created"), fired("no_run")),
        (Some(2.0), Some(1.0))
    );
    let calls = "spindle_storage_call_duration_seconds";
    assert_eq!(
        value(&text, &format!("{calls}_count{{op=\"get_thread\"}}")),
        Some(2.0)
    );
    assert_eq!(
        value(
            &text,
            &format!("{calls}_bucket{{op=\"get_thread\",le=\"0.0005\"}}")
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "spindle_storage_call_errors_total{op=\"get_thread\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_webhook_refused_before_sending_counts_as_refused() {
    let metrics = Arc::new(Metrics::new());
    let webhooks = Webhooks::new(WebhookConfig::default(), metrics.clone());
    // Loopback, which webhooks may not reach by default: refused without a request.
    webhooks
        .deliver(&json!({}), "http://127.0.0.1:1/hook")
        .await;
    let text = metrics.encode(Format::Prometheus);
    let refused = "spindle_webhook_deliveries_total{outcome=\"refused\"}";
    assert_eq!(value(&text, refused), Some(1.0));
}

#[test]
fn a_sample_sets_the_sampled_gauges() {
    let metrics = Metrics::new();
    let sample = Sample {
        slots: 16,
        slots_in_use: 3,
        python: Some(PythonSample {
            workers: vec![
                WorkerState {
                    pid: Some(1),
                    active_runs: 2,
                    takes_runs: true,
                },
                WorkerState {
                    pid: Some(2),
                    active_runs: 1,
                    takes_runs: false,
                },
            ],
            runs_per_worker: 10,
        }),
        pools: PoolStats {
            pools: vec![ConnectionPool {
                name: "read",
                open: 5,
                idle: 2,
                max: 8,
            }],
            writer_queue: Some(7),
        },
        queued: Some(QueuedRuns {
            pending: 4,
            running: 3,
        }),
    };
    metrics.record(&sample);
    let text = metrics.encode(Format::Prometheus);
    let expected = [
        ("spindle_worker_slots", 16.0),
        ("spindle_worker_slots_in_use", 3.0),
        ("spindle_python_workers", 2.0),
        ("spindle_python_workers_taking_runs", 1.0),
        ("spindle_python_runs", 3.0),
        ("spindle_python_run_slots", 20.0),
        ("spindle_db_connections{pool=\"read\",state=\"idle\"}", 2.0),
        (
            "spindle_db_connections{pool=\"read\",state=\"in_use\"}",
            3.0,
        ),
        ("spindle_db_connections_max{pool=\"read\"}", 8.0),
        ("spindle_db_writer_queue", 7.0),
        ("spindle_queue_runs{status=\"pending\"}", 4.0),
        ("spindle_queue_runs{status=\"running\"}", 3.0),
        ("spindle_queue_count_failures_total", 0.0),
    ];
    for (series, expected) in expected {
        assert_eq!(value(&text, series), Some(expected), "{series} in\n{text}");
    }

    // A count that failed keeps the last values and is counted.
    metrics.record(&Sample {
        queued: None,
        ..sample
    });
    let text = metrics.encode(Format::Prometheus);
    assert_eq!(
        value(&text, "spindle_queue_runs{status=\"pending\"}"),
        Some(4.0)
    );
    assert_eq!(
        value(&text, "spindle_queue_count_failures_total"),
        Some(1.0)
    );
}

#[test]
fn openmetrics_is_served_when_asked_for() {
    assert_eq!(Format::accepted(None), Format::Prometheus);
    assert_eq!(Format::accepted(Some("text/plain")), Format::Prometheus);
    let prometheus_accept =
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    assert_eq!(
        Format::accepted(Some(prometheus_accept)),
        Format::OpenMetrics
    );
    let metrics = Metrics::new();
    metrics.cron_fired(true);
    let text = metrics.encode(Format::OpenMetrics);
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(
        text.contains("# TYPE spindle_cron_firings counter\n"),
        "{text}"
    );
    assert!(text.contains("spindle_cron_firings_total{outcome=\"run_created\"} 1\n"));
}

/// The storage wrapper times each call under the method's name.
#[tokio::test]
async fn the_metered_storage_times_each_call() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("metered.db").to_string_lossy().into_owned();
    let metrics = Arc::new(Metrics::new());
    let storage: Arc<dyn Storage> = MeteredStorage::wrap(
        spindle_storage::connect(&url).await.unwrap(),
        metrics.clone(),
    );
    let scope = Scope::new("");
    let id = ResourceId::generate();
    let thread = NewThread::new(id, JsonObject::new(), IfExists::Raise);
    storage.create_thread(&scope, thread).await.unwrap();
    storage.get_thread(&scope, id).await.unwrap();
    storage
        .get_thread(&scope, ResourceId::generate())
        .await
        .unwrap_err();
    assert_eq!(
        storage.count_queued_runs().await.unwrap(),
        QueuedRuns::default()
    );
    let stats = storage.pool_stats();
    let names: Vec<&str> = stats.pools.iter().map(|p| p.name).collect();
    assert_eq!(names, ["read", "write"]);
    assert_eq!(stats.writer_queue, Some(0));

    let text = metrics.encode(Format::Prometheus);
    let count = |op: &str| {
        value(
            &text,
            &format!("spindle_storage_call_duration_seconds_count{{op=\"{op}\"}}"),
        )
    };
    assert_eq!(count("create_thread"), Some(1.0));
    assert_eq!(count("get_thread"), Some(2.0));
    assert_eq!(count("count_queued_runs"), Some(1.0));
    assert_eq!(
        value(
            &text,
            "spindle_storage_call_errors_total{op=\"get_thread\"}"
        ),
        Some(1.0)
    );
}
