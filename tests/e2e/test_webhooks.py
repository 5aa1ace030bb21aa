"""Webhooks: a run's end is POSTed to the URL it was created with (the payload of api-facts),
retried when the receiver fails; URLs that resolve to private, loopback or link-local addresses
are refused with 422 at creation, and nothing is stored.

Deliveries go to a receiver on 127.0.0.1, so they need a server started with
``--webhook-allow-private`` (the ``webhook_server`` fixture); the refusals are checked against
the default server, which refuses them as a deployment does. The reference server refuses
loopback receivers by default too, hence ``spindle_only``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from e2e_util import assert_status, assert_validation_error, default_assistant_id, describe
from langgraph_sdk.errors import UnprocessableEntityError

pytestmark = pytest.mark.spindle_only

# Long enough for a delivery with one retry (the first backoff is 1 s plus jitter).
DELIVERY_TIMEOUT = 15.0


class Receiver:
    """An HTTP server on a free 127.0.0.1 port that records every POST and answers the scripted
    statuses in turn, then 200."""

    def __init__(self, statuses: list[int] | None = None):
        self.statuses = list(statuses or [])
        self.requests: list[dict] = []
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                with receiver._cond:
                    receiver.requests.append({
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": json.loads(raw) if raw else None,
                        "at": time.monotonic(),
                    })
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver._cond.notify_all()
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):  # keep pytest's output clean
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook?token=secret"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(self, count: int, timeout: float = DELIVERY_TIMEOUT) -> list[dict]:
        """The first ``count`` requests, once they arrived; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"expected {count} webhook request(s) within {timeout}s, got "
                                f"{len(self.requests)}: {self.requests}")
                self._cond.wait(left)
            return list(self.requests[:count])

    def settle(self, quiet: float = 1.5) -> list[dict]:
        """Every request, after none arrived for ``quiet`` seconds (to catch duplicates)."""
        time.sleep(quiet)
        with self._cond:
            return list(self.requests)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def failing_receiver():
    """Answers 500 to the first request."""
    r = Receiver([500])
    yield r
    r.close()


def parse_time(value: str) -> datetime:
    assert isinstance(value, str), value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


RUN_FIELDS = {"run_id", "thread_id", "assistant_id", "created_at", "updated_at", "status",
              "metadata", "kwargs", "multitask_strategy"}
WEBHOOK_FIELDS = {"run_started_at", "run_ended_at", "webhook_sent_at", "values"}


def assert_payload(payload: dict, run: dict, status: str) -> None:
    """The payload of api-facts: the run's fields, then its status and times, the sending time
    and the thread's final values."""
    missing = (RUN_FIELDS | WEBHOOK_FIELDS) - payload.keys()
    assert not missing, f"missing {missing}: {payload}"
    for field in ("run_id", "thread_id", "assistant_id", "created_at", "multitask_strategy", "metadata"):
        assert payload[field] == run[field], (field, payload, run)
    assert payload["status"] == status, payload
    created = parse_time(payload["created_at"])
    started = parse_time(payload["run_started_at"])
    ended = parse_time(payload["run_ended_at"])
    sent = parse_time(payload["webhook_sent_at"])
    assert created <= started <= ended <= sent, payload


async def test_a_successful_run_posts_its_end_once(webhook_client, receiver, tag):
    """`runs.wait` with `webhook`: the receiver gets exactly one POST of JSON with the run, its
    status, times and final values, and no `error`."""
    thread = await webhook_client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    result = await webhook_client.runs.wait(
        tid, "chain", input={"n": 1}, metadata={"tag": tag}, webhook=receiver.url
    )
    assert result == {"n": 4}
    [request] = receiver.wait_for(1)
    assert request["path"] == "/hook?token=secret"
    assert request["headers"]["content-type"].startswith("application/json")
    runs = await webhook_client.runs.list(tid)
    assert len(runs) == 1
    payload = request["body"]
    assert_payload(payload, runs[0], "success")
    assert payload["values"] == {"n": 4}
    assert payload["kwargs"]["webhook"] == receiver.url
    assert payload["kwargs"]["input"] == {"n": 1}
    assert payload["assistant_id"] == default_assistant_id("chain")
    assert "error" not in payload, payload
    assert len(receiver.settle()) == 1, "one delivery per run"


def test_a_failed_run_posts_its_error(webhook_http, receiver, tag):
    """A run of `fail`, created over raw HTTP: the payload has status `error` and the error."""
    r = webhook_http.post("/threads", json={"metadata": {"tag": tag}})
    assert_status(r, 200)
    tid = r.json()["thread_id"]
    r = webhook_http.post(f"/threads/{tid}/runs",
                       json={"assistant_id": "fail", "input": {"n": 0}, "webhook": receiver.url})
    assert_status(r, 200)
    run = r.json()
    assert run["kwargs"]["webhook"] == receiver.url, describe(r)
    [request] = receiver.wait_for(1)
    payload = request["body"]
    ended = webhook_http.get(f"/threads/{tid}/runs/{run['run_id']}").json()
    assert ended["status"] == "error"
    assert_payload(payload, ended, "error")
    assert payload["error"]["error"] == "ValueError", payload
    assert payload["error"]["message"].endswith("boom"), payload
    assert payload["updated_at"] == ended["updated_at"]
    assert len(receiver.settle()) == 1


async def test_a_rolled_back_run_posts_status_rollback(webhook_client, receiver, tag):
    """A run cancelled with `action=rollback` is deleted, and its receiver still learns that it
    is over: one POST with status `rollback` and no values, as the reference server sends."""
    thread = await webhook_client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    run = await webhook_client.runs.create(
        tid, "slow", input={"delay_ms": 5000, "ticks": 0}, metadata={"tag": tag}, webhook=receiver.url
    )
    deadline = time.monotonic() + 10
    while (await webhook_client.runs.get(tid, run["run_id"]))["status"] != "running":
        assert time.monotonic() < deadline, "the run never started"
        await asyncio.sleep(0.05)
    await webhook_client.runs.cancel(tid, run["run_id"], wait=True, action="rollback")
    [request] = receiver.wait_for(1)
    payload = request["body"]
    assert_payload(payload, run, "rollback")
    assert payload["values"] is None
    assert len(receiver.settle()) == 1, "one delivery per run"


async def test_a_stateless_run_posts_its_values(webhook_client, receiver):
    """A stateless run's thread is deleted once it answered; its webhook still carries the
    values it ended with."""
    result = await webhook_client.runs.wait(None, "chain", input={"n": 10}, webhook=receiver.url)
    assert result == {"n": 13}
    [request] = receiver.wait_for(1)
    assert request["body"]["status"] == "success"
    assert request["body"]["values"] == {"n": 13}


async def test_a_crons_webhook_may_reach_a_local_receiver_when_allowed(webhook_client, receiver, tag):
    """The option for local development holds for crons as for runs: on a server started with
    ``--webhook-allow-private`` a cron's webhook may be a loopback receiver, and its first run
    posts its end there (the default server refuses it: test_crons)."""
    thread = await webhook_client.threads.create(metadata={"tag": tag})
    first = await webhook_client.crons.create_for_thread(
        thread["thread_id"], "chain", schedule="0 0 1 1 *", input={"n": 1}, webhook=receiver.url
    )
    try:
        [request] = receiver.wait_for(1)
        assert request["body"]["run_id"] == first["run_id"], request
        assert request["body"]["status"] == "success", request
    finally:
        await webhook_client.crons.delete(first["cron_id"])


async def test_a_failing_receiver_is_retried(webhook_client, failing_receiver, tag):
    """The receiver answers 500 first: the same payload comes again, sent later."""
    thread = await webhook_client.threads.create(metadata={"tag": tag})
    run = await webhook_client.runs.create(
        thread["thread_id"], "chain", input={"n": 1}, webhook=failing_receiver.url
    )
    first, second = failing_receiver.wait_for(2)
    assert second["at"] - first["at"] >= 0.9, "retried after a backoff"
    for request in (first, second):
        assert request["body"]["run_id"] == run["run_id"]
        assert request["body"]["status"] == "success"
        assert request["body"]["values"] == {"n": 4}
    assert parse_time(second["body"]["webhook_sent_at"]) > parse_time(first["body"]["webhook_sent_at"])
    assert len(failing_receiver.settle()) == 2, "no retry after the 200"


REFUSED = [
    "http://127.0.0.1:1/x",  # loopback
    "http://169.254.169.254/latest/meta-data/",  # link-local: cloud metadata
    "http://[::1]/",  # IPv6 loopback
    "http://[::ffff:10.0.0.1]/",  # a private IPv4 address, mapped into IPv6
    "http://localhost:8000/",  # a name that resolves to loopback
]


@pytest.mark.parametrize("url", REFUSED)
def test_a_private_webhook_is_refused_and_nothing_is_stored(http, tag, url):
    """On a server that does not allow private receivers, such a webhook is a 422 naming
    `["body", "webhook"]`, and no run is created (the thread stays idle, with no runs)."""
    r = http.post("/threads", json={"metadata": {"tag": tag}})
    assert_status(r, 200)
    tid = r.json()["thread_id"]
    r = http.post(f"/threads/{tid}/runs",
                  json={"assistant_id": "chain", "input": {"n": 1}, "webhook": url})
    detail = assert_validation_error(r, "body", "webhook")
    assert detail[0]["loc"] == ["body", "webhook"], describe(r)
    assert detail[0]["input"] == url, describe(r)
    runs = http.get(f"/threads/{tid}/runs")
    assert_status(runs, 200)
    assert runs.json() == [], "a refused run is not stored"
    assert http.get(f"/threads/{tid}").json()["status"] == "idle"


def test_refused_on_every_route_that_creates_runs(http, tag):
    """`/runs/stream`, `/runs/wait`, stateless `/runs` and `/runs/batch` refuse it too; in a
    batch the item is named."""
    r = http.post("/threads", json={"metadata": {"tag": tag}})
    tid = r.json()["thread_id"]
    body = {"assistant_id": "chain", "input": {"n": 1}, "webhook": "http://127.0.0.1:1/x"}
    for path in (f"/threads/{tid}/runs/stream", f"/threads/{tid}/runs/wait", "/runs", "/runs/wait"):
        assert_validation_error(http.post(path, json=body), "body", "webhook")
    assert http.get(f"/threads/{tid}/runs").json() == []
    r = http.post("/runs/batch", json=[{"assistant_id": "chain", "input": {"n": 1}}, body])
    detail = assert_validation_error(r, "body", "webhook")
    assert detail[0]["loc"] == ["body", 1, "webhook"], describe(r)


@pytest.mark.parametrize("url, kind", [
    ("ftp://example.com/hook", "url_scheme"),
    ("not a url", "url_parsing"),
    ("/relative/hook", "url_parsing"),
])
def test_a_malformed_webhook_is_refused(http, tag, url, kind):
    r = http.post("/threads", json={"metadata": {"tag": tag}})
    tid = r.json()["thread_id"]
    r = http.post(f"/threads/{tid}/runs", json={"assistant_id": "chain", "webhook": url})
    detail = assert_validation_error(r, "body", "webhook")
    assert detail[0]["type"] == kind, describe(r)
    assert http.get(f"/threads/{tid}/runs").json() == []


async def test_the_official_client_sees_the_refusal(client, tag):
    thread = await client.threads.create(metadata={"tag": tag})
    with pytest.raises(UnprocessableEntityError) as raised:
        await client.runs.create(thread["thread_id"], "chain", input={"n": 1},
                                 webhook="http://169.254.169.254/")
    assert raised.value.status_code == 422
    assert "webhook" in raised.value.response.text
    assert await client.runs.list(thread["thread_id"]) == []
