"""Browsers on another origin: `http.cors` with LangGraph's keys. What a web app relies on: in
`spindle dev` any page may call the API, as with `langgraph dev` (preflights answered, the
pagination headers readable); `spindle serve` allows no other origin until configured, then
exactly the configured ones; a `cors` section with a mistake stops the server, naming it.

These tests start their own spindle processes, so they never run against SPINDLE_E2E_URL.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import harness
import httpx
import pytest

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
    reason="starts its own spindle processes; not applicable with SPINDLE_E2E_URL",
)

PAGE = "http://app.example.test:5173"


def preflight(base_url: str, path: str, origin: str = PAGE) -> httpx.Response:
    return httpx.options(base_url + path, headers={
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-api-key",
    })


@contextmanager
def spindle(tmp_path: Path, mode: str, config: dict | None = None) -> Iterator[harness.Server]:
    extra: list[str] = []
    if config is not None:
        path = tmp_path / "spindle.json"
        path.write_text(json.dumps(config))
        extra = ["--config", str(path)]

    def args(port: int) -> list[str]:
        common = ["--host", "127.0.0.1", "--port", str(port), *extra]
        if mode == "dev":
            return ["dev", "--data-dir", str(tmp_path / "d"), *common]
        # `serve` serves the example graphs only when asked to.
        examples = [] if config and config.get("graphs") else ["--examples"]
        return ["serve", "--database-url", f"sqlite://{tmp_path / 'spindle.db'}", *examples, *common]

    srv = harness.start("sqlite", args, tmp_path)
    try:
        yield srv
    finally:
        harness.stop(srv)


EXAMPLE_GRAPH = {"chain": str(Path(__file__).parents[2] / "examples" / "graphs" / "chain.yaml")}


def test_dev_lets_any_page_call_it(tmp_path):
    with spindle(tmp_path, "dev") as srv:
        r = preflight(srv.base_url, "/threads")
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == "*"
        allowed = r.headers["access-control-allow-headers"].lower()
        assert "x-api-key" in allowed or allowed == "*", r.headers
        assert "post" in r.headers["access-control-allow-methods"].lower() or \
            r.headers["access-control-allow-methods"] == "*", r.headers
        # The request itself: the answer is readable, and so are the pagination headers.
        r = httpx.post(srv.base_url + "/threads/search", json={"limit": 1}, headers={"Origin": PAGE})
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == "*"
        # A wildcard origin never comes with credentials.
        assert "access-control-allow-credentials" not in r.headers, r.headers
        exposed = r.headers["access-control-expose-headers"].lower()
        assert "x-pagination-total" in exposed and "content-location" in exposed, exposed


def test_serve_allows_no_other_origin_unless_configured(tmp_path):
    with spindle(tmp_path, "serve", {"graphs": EXAMPLE_GRAPH}) as srv:
        r = preflight(srv.base_url, "/threads")
        assert "access-control-allow-origin" not in r.headers, r.headers
        r = httpx.get(srv.base_url + "/ok", headers={"Origin": PAGE})
        assert r.status_code == 200
        assert "access-control-allow-origin" not in r.headers, r.headers


def test_serve_allows_exactly_the_configured_origins(tmp_path):
    cors = {
        "allow_origins": [PAGE],
        "allow_origin_regex": r"https://[a-z0-9]+\.preview\.example\.test",
        "allow_methods": ["GET", "POST"],
        "allow_headers": ["content-type", "x-api-key"],
        "allow_credentials": True,
        "expose_headers": ["x-pagination-total"],
        "max_age": 60,
    }
    with spindle(tmp_path, "serve", {"graphs": EXAMPLE_GRAPH, "http": {"cors": cors}}) as srv:
        r = preflight(srv.base_url, "/threads")
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == PAGE
        assert r.headers["access-control-allow-credentials"] == "true"
        assert r.headers["access-control-max-age"] == "60"
        preview = "https://pr42.preview.example.test"
        assert preflight(srv.base_url, "/threads", preview).headers["access-control-allow-origin"] == preview
        for other in ("http://evil.example.test", "https://pr42.preview.example.test.evil.test"):
            assert "access-control-allow-origin" not in preflight(srv.base_url, "/threads", other).headers
        r = httpx.post(srv.base_url + "/threads", json={}, headers={"Origin": PAGE})
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == PAGE


def test_a_cors_section_with_a_mistake_stops_the_server_naming_it(tmp_path):
    for cors, named in [
        ({"allow_origin": [PAGE]}, "allow_origin"),
        ({"allow_origins": [PAGE], "allow_headers": ["not a header"]}, "allow_headers"),
        # A wildcard origin never comes with credentials (a page of any origin could act with them).
        ({"allow_origins": ["*"], "allow_credentials": True}, "allow_credentials"),
    ]:
        config = tmp_path / "spindle.json"
        config.write_text(json.dumps({"graphs": EXAMPLE_GRAPH, "http": {"cors": cors}}))
        r = harness.run(["serve", "--port", "0", "--database-url", f"sqlite://{tmp_path / 'x.db'}",
                         "--config", str(config)], tmp_path, timeout=30)
        assert r.returncode != 0, r.stdout
        assert named in r.stderr, r.stderr
