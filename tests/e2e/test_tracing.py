"""Tracing: a run's metadata keys become attributes `trace.metadata.<key>` of the span the run
executes in, exported to an OTLP collector when the standard OpenTelemetry variables name one.

The collector here is a local HTTP server taking OTLP/HTTP JSON (`OTEL_EXPORTER_OTLP_PROTOCOL=
http/json`), so the test reads what an operator's collector would receive.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import BACKENDS, _session_server
from e2e_util import default_assistant_id
from langgraph_sdk import get_client

pytestmark = pytest.mark.spindle_only

EXPORT_TIMEOUT = 20.0


class Collector:
    """Records the spans of every OTLP/HTTP JSON export POSTed to it."""

    def __init__(self):
        self.spans: list[dict] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw)
                with collector._lock:
                    for resource in body.get("resourceSpans", []):
                        for scope in resource.get("scopeSpans", []):
                            collector.spans.extend(scope.get("spans", []))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def run_span(self, run_id: str) -> dict | None:
        with self._lock:
            for span in self.spans:
                attributes = attributes_of(span)
                if span.get("name") == "run" and attributes.get("run_id") == run_id:
                    return span
        return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def attributes_of(span: dict) -> dict:
    """OTLP JSON attributes as a plain dict (int64 values arrive as strings, per the spec)."""
    out = {}
    for kv in span.get("attributes", []):
        (kind, value), = kv["value"].items()
        out[kv["key"]] = int(value) if kind == "intValue" else value
    return out


@pytest.fixture(scope="module")
def collector():
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module", params=BACKENDS)
def traced_server(request, collector):
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": "spindle-e2e",
    }
    yield from _session_server(request.param, env=env)


async def test_run_metadata_becomes_span_attributes(traced_server, collector, tag):
    client = get_client(url=traced_server.base_url, api_key=None, timeout=30)
    try:
        thread = await client.threads.create()
        metadata = {"customer": "acme", "priority": 2, "vip": True, "tag": tag}
        run = await client.runs.create(
            thread["thread_id"], default_assistant_id("echo"),
            input={"messages": [{"role": "user", "content": "hi"}]}, metadata=metadata,
        )
        await client.runs.join(thread["thread_id"], run["run_id"])
    finally:
        await client.aclose()

    deadline = time.monotonic() + EXPORT_TIMEOUT
    span = collector.run_span(run["run_id"])
    while span is None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        span = collector.run_span(run["run_id"])
    assert span is not None, f"no run span exported for {run['run_id']}; got {len(collector.spans)} spans"
    attributes = attributes_of(span)
    assert attributes["thread_id"] == thread["thread_id"]
    assert attributes["trace.metadata.customer"] == "acme"
    assert attributes["trace.metadata.priority"] == 2
    assert attributes["trace.metadata.vip"] is True
    assert attributes["trace.metadata.tag"] == tag
