"""`GET /metrics`: the process's metrics in Prometheus's text format, parsed with the official
Prometheus client's parser, moving as runs go through the official Python client: runs by
status and graph, their durations, queue wait and first-event latency, streams counted while
open, the queue's runs, the worker slots and database pools, storage calls, cron firings and
webhook deliveries. The endpoint answers without credentials unless `auth.public_metrics` is
off, and `http.disable_meta` takes it away (as LangGraph's does).

The module has a server of its own per backend, so no other test's runs move its counts, with
1 s heartbeats (a stream whose client left is noticed at the next write) and webhooks allowed
to 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import harness
import httpx
import pytest
import websockets
from conftest import BACKENDS, EXTERNAL_URL, _loop, _session_server
from e2e_util import describe
from langgraph_sdk import get_client
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from test_cors import spindle
from test_webhooks import Receiver

pytestmark = [
    pytest.mark.spindle_only,
    pytest.mark.skipif(bool(EXTERNAL_URL), reason="reads the metrics of a server of its own"),
]

PROMETHEUS_TEXT = "text/plain; version=0.0.4"
OPENMETRICS_TEXT = "application/openmetrics-text"


@pytest.fixture(scope="module", params=BACKENDS)
def metrics_server(request):
    args = ["--keepalive-interval-secs", "1", "--webhook-allow-private"]
    yield from _session_server(request.param, extra_args=args)


@pytest.fixture
def client(metrics_server: harness.Server):
    c = get_client(url=metrics_server.base_url, api_key=None, timeout=30)
    yield c
    _loop().run_until_complete(c.aclose())


@pytest.fixture
def http(metrics_server: harness.Server):
    with httpx.Client(base_url=metrics_server.base_url, timeout=30) as c:
        yield c


class Scrape:
    """One scrape of `/metrics`: each family's type, and each sample's value by its name and
    labels."""

    def __init__(self, text: str):
        self.text = text
        self.types: dict[str, str] = {}
        self.samples: dict[tuple[str, frozenset], float] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; 0 when the series is not there (yet)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def has(self, name: str, **labels: str) -> bool:
        return (name, frozenset(labels.items())) in self.samples

    def labels_of(self, name: str) -> list[dict[str, str]]:
        return [dict(labels) for (sample, labels) in self.samples if sample == name]


def scrape(http: httpx.Client) -> Scrape:
    r = http.get("/metrics")
    assert r.status_code == 200, describe(r)
    assert r.headers["content-type"].startswith(PROMETHEUS_TEXT), r.headers
    return Scrape(r.text)


def eventually(http: httpx.Client, check: Callable[[Scrape], None], timeout: float = 10.0) -> Scrape:
    """Scrapes until `check` passes (what is recorded after a response, such as a run leaving
    the executing ones, lands a moment later), failing with its last assertion."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = scrape(http)
        try:
            check(metrics)
            return metrics
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def test_every_metric_is_served_with_its_type(client, http, metrics_server):
    """Every metric is described with its type; one with labels once it has a series (a run,
    and a storage call that failed: reading a thread that does not exist)."""
    await client.runs.wait(None, "chain", input={"n": 1})
    assert http.get(f"/threads/{uuid.uuid4()}").status_code == 404
    metrics = scrape(http)
    expected = {
        "spindle_runs_ended": "counter",
        "spindle_runs_executing": "gauge",
        "spindle_run_duration_seconds": "histogram",
        "spindle_run_first_event_seconds": "histogram",
        "spindle_run_queue_wait_seconds": "histogram",
        "spindle_queue_runs": "gauge",
        "spindle_queue_count_failures": "counter",
        "spindle_streams_open": "gauge",
        "spindle_worker_slots": "gauge",
        "spindle_worker_slots_in_use": "gauge",
        "spindle_python_workers": "gauge",
        "spindle_python_runs": "gauge",
        "spindle_db_connections": "gauge",
        "spindle_db_connections_max": "gauge",
        "spindle_storage_call_duration_seconds": "histogram",
        "spindle_storage_call_errors": "counter",
        "spindle_webhook_deliveries": "counter",
        "spindle_cron_firings": "counter",
    }
    for name, kind in expected.items():
        assert metrics.types.get(name) == kind, (name, metrics.types.get(name), metrics.text)
    for kind in ["run", "run_join", "thread", "protocol", "websocket"]:
        assert metrics.has("spindle_streams_open", kind=kind), kind
    for outcome in ["success", "failed", "refused"]:
        assert metrics.has("spindle_webhook_deliveries_total", outcome=outcome), outcome
    # The process's own settings and pools, read at each scrape.
    assert metrics.value("spindle_worker_slots") == 64  # the default --workers
    pools = {labels["pool"] for labels in metrics.labels_of("spindle_db_connections_max")}
    if metrics_server.backend == "sqlite":
        assert pools == {"read", "write"}, pools
        assert metrics.types.get("spindle_db_writer_queue") == "gauge"
        assert metrics.has("spindle_db_writer_queue")
    else:
        assert pools == {"main", "creation"}, pools
        assert metrics.value("spindle_db_connections_max", pool="main") == 16
        # The creating task's own connection (`pg_creator`).
        assert metrics.value("spindle_db_connections_max", pool="creation") == 1
        # PostgreSQL has no writer thread; its pool is where writes wait.
        assert not metrics.has("spindle_db_writer_queue")
    for pool in pools:
        for state in ["idle", "in_use"]:
            assert metrics.has("spindle_db_connections", pool=pool, state=state), (pool, state)
    assert metrics.has("spindle_queue_runs", status="pending")
    assert metrics.value("spindle_queue_count_failures_total") == 0


async def test_runs_count_by_status_and_graph(client, http):
    """Two `chain` runs succeed and a `fail` run fails: each is counted once under its graph
    and status, with its duration, its wait in the queue and its first event's latency."""
    before = scrape(http)
    thread = await client.threads.create()
    for n in [1, 2]:
        assert await client.runs.wait(thread["thread_id"], "chain", input={"n": n}) == {"n": n + 3}
    await client.runs.wait(None, "fail", input={"n": 1}, raise_error=False)
    after = scrape(http)

    def moved(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert moved("spindle_runs_ended_total", graph="chain", status="success") == 2
    assert moved("spindle_runs_ended_total", graph="fail", status="error") == 1
    assert moved("spindle_runs_ended_total", graph="chain", status="error") == 0
    assert moved("spindle_run_duration_seconds_count", graph="chain") == 2
    assert moved("spindle_run_duration_seconds_count", graph="fail") == 1
    assert moved("spindle_run_duration_seconds_sum", graph="chain") > 0
    assert moved("spindle_run_queue_wait_seconds_count") == 3
    assert moved("spindle_run_first_event_seconds_count", graph="chain") == 2
    # Every storage call is timed under its operation; the runs were created, claimed at
    # once or from the queue, and ended.
    assert moved("spindle_storage_call_duration_seconds_count", op="create_run") == 3
    assert moved("spindle_storage_call_duration_seconds_count", op="finish_run") == 3
    assert moved("spindle_storage_call_duration_seconds_count", op="create_thread") >= 1
    # Once ended, no run executes here.
    eventually(http, lambda m: _assert_equal(m.value("spindle_runs_executing", graph="chain"), 0))
    eventually(http, lambda m: _assert_equal(m.value("spindle_worker_slots_in_use"), 0))


def test_histograms_are_consistent(http):
    """Every histogram's buckets grow with `le`, and its count is its `+Inf` bucket."""
    metrics = scrape(http)
    histograms = [name for name, kind in metrics.types.items() if kind == "histogram"]
    assert len(histograms) >= 4, histograms
    for name in histograms:
        series: dict[frozenset, list[tuple[float, float]]] = {}
        for (sample, labels), value in metrics.samples.items():
            if sample == f"{name}_bucket":
                rest = frozenset((k, v) for k, v in labels if k != "le")
                series.setdefault(rest, []).append((float(dict(labels)["le"]), value))
        for labels, buckets in series.items():
            buckets.sort()
            counts = [count for _, count in buckets]
            assert counts == sorted(counts), (name, labels, buckets)
            assert buckets[-1][0] == float("inf"), (name, labels)
            assert metrics.samples[(f"{name}_count", labels)] == counts[-1], (name, labels)


async def test_a_run_stream_counts_as_open_while_it_streams(client, http):
    """`runs.stream` holds a `run` stream open until the run ends; `runs.join_stream` a
    `run_join` stream."""
    thread = await client.threads.create()
    open_before = scrape(http).value("spindle_streams_open", kind="run")
    seen = []
    async for part in client.runs.stream(
        thread["thread_id"], "slow", input={"delay_ms": 300}, stream_mode="custom"
    ):
        if part.event == "custom":
            seen.append(scrape(http).value("spindle_streams_open", kind="run"))
    assert seen and all(value == open_before + 1 for value in seen), (open_before, seen)
    eventually(http, lambda m: _assert_equal(m.value("spindle_streams_open", kind="run"), open_before))

    run = await client.runs.create(thread["thread_id"], "slow", input={"delay_ms": 500})
    joined = []
    async for part in client.runs.join_stream(thread["thread_id"], run["run_id"]):
        joined.append(scrape(http).value("spindle_streams_open", kind="run_join"))
    assert joined and joined[0] >= 1, joined
    eventually(http, lambda m: _assert_equal(m.value("spindle_streams_open", kind="run_join"), 0))


async def test_thread_and_protocol_streams_count_until_their_client_leaves(client, http, metrics_server):
    """A thread's SSE stream, the protocol v2 event stream and its WebSocket last as long as
    their client listens; each counts as open until then."""
    thread_id = (await client.threads.create())["thread_id"]
    base = metrics_server.base_url
    kinds = {
        "thread": ("GET", f"/threads/{thread_id}/stream", None),
        "protocol": ("POST", f"/threads/{thread_id}/stream/events", {"channels": ["values"]}),
    }
    for kind, (method, path, body) in kinds.items():
        before = scrape(http).value("spindle_streams_open", kind=kind)
        with httpx.Client(base_url=base, timeout=30) as listener:
            with listener.stream(method, path, json=body) as r:
                assert r.status_code == 200, (kind, r.status_code)
                chunks = r.iter_bytes()  # kept: the stream closes with its iterator
                next(chunks)  # the stream is open: a first frame or heartbeat came
                assert scrape(http).value("spindle_streams_open", kind=kind) == before + 1, kind
                del chunks
        # Noticed at the next heartbeat (1 s on this server) after the client left.
        eventually(http, lambda m: _assert_equal(m.value("spindle_streams_open", kind=kind), before))

    ws_url = base.replace("http://", "ws://") + f"/threads/{thread_id}/stream/events"
    before = scrape(http).value("spindle_streams_open", kind="websocket")
    async with websockets.connect(ws_url):
        eventually(http, lambda m: _assert_equal(m.value("spindle_streams_open", kind="websocket"), before + 1))
    eventually(http, lambda m: _assert_equal(m.value("spindle_streams_open", kind="websocket"), before))


async def test_the_queue_counts_pending_runs(client, http):
    """A run delayed by `after_seconds` waits in the queue: counted among the pending runs
    until it is cancelled."""
    thread = await client.threads.create()
    before = scrape(http).value("spindle_queue_runs", status="pending")
    run = await client.runs.create(thread["thread_id"], "chain", input={"n": 1}, after_seconds=600)
    assert scrape(http).value("spindle_queue_runs", status="pending") == before + 1
    await client.runs.cancel(thread["thread_id"], run["run_id"])
    eventually(http, lambda m: _assert_equal(m.value("spindle_queue_runs", status="pending"), before))


async def test_cron_firings_are_counted(client, http):
    """An every-second cron fires through the scheduler: each firing is counted by outcome."""
    before = scrape(http).value("spindle_cron_firings_total", outcome="run_created")
    thread = await client.threads.create()
    first = await client.crons.create_for_thread(
        thread["thread_id"], "chain", schedule="* * * * * *", input={"n": 1}
    )
    try:
        eventually(http, lambda m: _assert_greater(
            m.value("spindle_cron_firings_total", outcome="run_created"), before))
    finally:
        await client.crons.delete(first["cron_id"])


async def test_webhook_deliveries_are_counted_by_outcome(client, http):
    """A run's webhook delivered to a receiver that answers 200 counts as a success."""
    receiver = Receiver()
    before = scrape(http).value("spindle_webhook_deliveries_total", outcome="success")
    thread = await client.threads.create()
    await client.runs.wait(thread["thread_id"], "chain", input={"n": 1}, webhook=receiver.url)
    receiver.wait_for(1)
    eventually(http, lambda m: _assert_equal(
        m.value("spindle_webhook_deliveries_total", outcome="success"), before + 1))


def test_openmetrics_when_the_scraper_asks_for_it(http):
    r = http.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.status_code == 200, describe(r)
    assert r.headers["content-type"].startswith(OPENMETRICS_TEXT), r.headers
    assert r.text.endswith("# EOF\n")
    # The strict OpenMetrics parser reads all of it.
    families = {family.name: family.type for family in openmetrics_families(r.text)}
    assert families["spindle_runs_ended"] == "counter", families
    assert families["spindle_run_duration_seconds"] == "histogram", families


def test_the_document_describes_metrics_as_text(http):
    operation = http.get("/openapi.json").json()["paths"]["/metrics"]["get"]
    content = operation["responses"]["200"]["content"]
    assert any(media.startswith("text/plain") for media in content), content
    assert any(media.startswith(OPENMETRICS_TEXT) for media in content), content


def _graphs() -> dict:
    return {"chain": str(Path(__file__).resolve().parents[2] / "examples" / "graphs" / "chain.yaml")}


def test_metrics_answer_without_credentials_unless_public_metrics_is_off(tmp_path):
    """Prometheus scrapes without credentials, as load balancers probe the health checks;
    `auth.public_metrics: false` puts `/metrics` behind them like every API route."""
    key = {"identity": "ann", "key_sha256": hashlib.sha256(b"k").hexdigest()}
    open_config = {"graphs": _graphs(), "auth": {"api_keys": [key]}}
    (tmp_path / "open").mkdir()
    (tmp_path / "closed").mkdir()
    with spindle(tmp_path / "open", "serve", open_config) as srv:
        assert httpx.get(srv.base_url + "/metrics").status_code == 200
        assert httpx.post(srv.base_url + "/threads/search", json={}).status_code == 401

    closed = {"graphs": _graphs(), "auth": {"api_keys": [key], "public_metrics": False}}
    with spindle(tmp_path / "closed", "serve", closed) as srv:
        r = httpx.get(srv.base_url + "/metrics")
        assert r.status_code == 401, describe(r)
        r = httpx.get(srv.base_url + "/metrics", headers={"x-api-key": "k"})
        assert r.status_code == 200, describe(r)
        assert httpx.get(srv.base_url + "/ok").status_code == 200


def test_disable_meta_takes_metrics_away(tmp_path):
    config = {"graphs": _graphs(), "http": {"disable_meta": True}}
    with spindle(tmp_path, "serve", config) as srv:
        r = httpx.get(srv.base_url + "/metrics")
        assert r.status_code == 404, describe(r)
        assert httpx.get(srv.base_url + "/ok").status_code == 200


def _assert_equal(actual, expected):
    assert actual == expected, (actual, expected)


def _assert_greater(actual, than):
    assert actual > than, (actual, than)
