"""Assertions shared by the end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

# The namespace of api-facts: default assistant id = uuid5(NAMESPACE, graph_id).
ASSISTANT_NAMESPACE = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")

# Graph ids of the example graphs Spindle ships (the same ids as shared/ref/langgraph.json).
EXAMPLE_GRAPHS = ["echo", "chain", "approval", "agent", "fanout", "nested", "slow", "fail"]


def default_assistant_id(graph_id: str) -> str:
    return str(uuid.uuid5(ASSISTANT_NAMESPACE, graph_id))


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing: the test's output stays Spindle's."""

    def log_message(self, *args):
        pass


class LocalServer:
    """A stand-in for another service (a model, a job runner, an identity provider): a stdlib
    HTTP server on a free 127.0.0.1 port, serving `handler` on a thread of its own."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def wait_until(predicate, timeout: float = 10.0, what: str = "the condition") -> None:
    """Polls `predicate` every 20 ms until it holds; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


def describe(r: httpx.Response) -> str:
    return f"{r.request.method} {r.request.url} -> {r.status_code} {r.text[:500]}"


def assert_status(r: httpx.Response, status: int) -> None:
    assert r.status_code == status, f"expected {status}: {describe(r)}"


def assert_validation_error(r: httpx.Response, where: str, field: str | None = None) -> list:
    """A 422 in the interface document's shape, naming the offending field.

    Body: {"detail": [{"loc": [...], "msg": str, "type": str, "input"?: any, "ctx"?: object}]}.
    ``where`` is the first element of ``loc`` ("body", "path" or "query"); ``field``, when given,
    must appear in the ``loc`` of at least one item.
    """
    assert_status(r, 422)
    assert r.headers.get("content-type", "").startswith("application/json"), describe(r)
    body = r.json()
    assert isinstance(body, dict) and "detail" in body, describe(r)
    detail = body["detail"]
    assert isinstance(detail, list) and detail, f"detail must be a non-empty list: {describe(r)}"
    for item in detail:
        assert isinstance(item, dict), describe(r)
        loc = item.get("loc")
        assert isinstance(loc, list) and loc, f"loc must be a non-empty list: {describe(r)}"
        assert all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in loc), describe(r)
        assert isinstance(item.get("msg"), str) and item["msg"], f"msg missing: {describe(r)}"
        assert isinstance(item.get("type"), str) and item["type"], f"type missing: {describe(r)}"
        if "ctx" in item and item["ctx"] is not None:
            assert isinstance(item["ctx"], dict), describe(r)
    matching = [
        item for item in detail
        if item["loc"][0] == where and (field is None or field in item["loc"])
    ]
    assert matching, f"no detail item with loc starting {where!r} naming {field!r}: {describe(r)}"
    return detail


def assert_error_body(r: httpx.Response, status: int) -> dict:
    """A non-validation error in the interface document's shape: {error, message, details}."""
    assert_status(r, status)
    assert r.headers.get("content-type", "").startswith("application/json"), describe(r)
    body = r.json()
    assert isinstance(body, dict), describe(r)
    assert isinstance(body.get("error"), str) and body["error"], f"error missing: {describe(r)}"
    assert isinstance(body.get("message"), str) and body["message"], f"message missing: {describe(r)}"
    assert "details" in body, f"details missing: {describe(r)}"
    assert isinstance(body["details"], dict), f"details must be an object: {describe(r)}"
    return body


def execute_sql(server, statement: str, params: tuple = ()) -> list:
    """Runs one statement on the server's own database (``?`` placeholders, turned into
    ``%s`` on PostgreSQL) and returns its rows: for tests that set up what only a crash
    leaves behind."""
    import os
    import sqlite3

    import harness

    if server.backend == "postgres":
        import psycopg

        url = harness.pg_url_with_db(harness.POSTGRES_URL, server.database)
        with psycopg.connect(url, autocommit=True) as conn:
            cur = conn.execute(statement.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []
    data_dir = server.argv[server.argv.index("--data-dir") + 1]
    with sqlite3.connect(os.path.join(data_dir, "spindle.db"), timeout=10) as conn:
        return conn.execute(statement, params).fetchall()


@contextlib.contextmanager
def spindle_serving(name: str, graph: str):
    """A `spindle dev` of its own, serving `graph` (YAML) as `name`, stopped afterwards."""
    import harness

    if os.environ.get("SPINDLE_E2E_URL"):
        pytest.skip("needs a Spindle started with its own graph file")
    workdir = Path(tempfile.mkdtemp(prefix=f"spindle-e2e-{name}-"))
    (workdir / f"{name}.yaml").write_text(graph)
    (workdir / "spindle.json").write_text(json.dumps({"graphs": {name: f"./{name}.yaml"}}))
    srv = harness.start(
        "sqlite",
        lambda port: ["dev", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(workdir / "data"),
                      "--config", str(workdir / "spindle.json")],
        workdir,
    )
    try:
        yield srv
    finally:
        harness.stop(srv)
        shutil.rmtree(workdir, ignore_errors=True)
