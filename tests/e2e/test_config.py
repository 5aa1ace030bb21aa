"""The rest of `langgraph.json` as LangGraph Platform reads it: `env` as the whole server's
environment (graph files' model settings and `auth` read it; the real environment wins),
`http.configurable_headers` (request headers copied into runs' `configurable`), the
`http.disable_*` route groups, `http.disable_webhooks`, mistakes in `http` named, and a
PostgreSQL that cannot be reached told at once in one line.

These tests start their own spindle processes, so they never run against SPINDLE_E2E_URL.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import harness
import httpx
import pytest
from e2e_util import LocalServer, QuietHandler
from langgraph_sdk import get_client
from test_cors import spindle
from test_runs import WHOAMI_GRAPH

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
    reason="starts its own spindle processes; not applicable with SPINDLE_E2E_URL",
)

CHAIN = str(Path(__file__).parents[2] / "examples" / "graphs" / "chain.yaml")


def whoami_config(folder: Path, **sections) -> dict:
    (folder / "whoami.yaml").write_text(WHOAMI_GRAPH)
    return {"graphs": {"whoami": "./whoami.yaml", "chain": CHAIN}, **sections}


@asynccontextmanager
async def sdk(base_url: str, **kwargs) -> AsyncIterator:
    client = get_client(url=base_url, timeout=30, **{"api_key": None, **kwargs})
    try:
        yield client
    finally:
        await client.aclose()


# ------------------------------------------------------------------------------------------
# http.configurable_headers (and env read by auth)
# ------------------------------------------------------------------------------------------

API_KEY = "e2e-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def headers_server(tmp_path_factory):
    """Headers matching `x-*` but not `x-secret-*` are copied; the API key comes from `env`."""
    folder = tmp_path_factory.mktemp("headers")
    config = whoami_config(
        folder,
        env={"E2E_API_KEY": API_KEY},
        auth={"api_keys": [{"key_env": "E2E_API_KEY", "identity": "alice"}]},
        http={"configurable_headers": {
            "include": ["x-*", "authorization", "cookie"], "exclude": ["x-secret-*"]}},
    )
    with spindle(folder, "serve", config) as srv:
        yield srv


SENT = {"x-user-id": "u-1", "X-Org": "acme", "x-secret-token": "s", "cookie": "session=1"}


def copied(seen: dict) -> dict:
    """The configurable keys a request's headers could have put there."""
    return {k: v for k, v in seen.items() if k.startswith("x-") or k in ("authorization", "cookie")}


async def test_matching_headers_reach_every_run_created_over_http(headers_server):
    """Through the official client: thread and stateless runs, waited on, streamed, created in
    the background and in a batch, all get the included headers (lowercase names, string
    values) and nothing excluded; credentials never, though `x-*`, `authorization` and
    `cookie` are included."""
    expected = {"x-user-id": "u-1", "x-org": "acme"}
    async with sdk(headers_server.base_url, api_key=API_KEY, headers=SENT) as client:
        thread = (await client.threads.create())["thread_id"]
        waited = await client.runs.wait(thread, "whoami", input={})
        assert copied(waited["seen"]) == expected, waited
        assert waited["seen"]["langgraph_auth_user_id"] == "alice"

        stateless = await client.runs.wait(None, "whoami", input={})
        assert copied(stateless["seen"]) == expected

        streamed = [p async for p in client.runs.stream(None, "whoami", input={}, stream_mode="values")]
        assert copied(streamed[-1].data["seen"]) == expected, streamed

        run = await client.runs.create(thread, "whoami", input={})
        joined = await client.runs.join(thread, run["run_id"])
        assert copied(joined["seen"]) == expected, joined

        batch = await client.runs.create_batch([{"assistant_id": "whoami", "input": {}, "on_completion": "keep"}])
        done = await client.runs.join(batch[0]["thread_id"], batch[0]["run_id"])
        assert copied(done["seen"]) == expected, done

        # A request's own header wins over the body's value of the same name, as in the
        # reference; other configurable values stay.
        mine = await client.runs.wait(None, "whoami", input={},
                                      config={"configurable": {"x-user-id": "body", "k": 1}})
        assert mine["seen"]["x-user-id"] == "u-1" and mine["seen"]["k"] == 1, mine


async def test_auth_reads_its_key_from_env(headers_server):
    """`auth.api_keys[].key_env` names a variable only the config's `env` sets."""
    r = httpx.post(headers_server.base_url + "/threads/search", json={})
    assert r.status_code == 401, r.text
    r = httpx.post(headers_server.base_url + "/threads/search", json={},
                   headers={"x-api-key": API_KEY})
    assert r.status_code == 200, r.text


def test_without_the_setting_no_header_is_copied_and_unused_keys_are_named(tmp_path):
    """As LangGraph Platform: no `configurable_headers`, no header in `configurable`. `http`
    keys LangGraph has and Spindle does not use are warned about, once each; turning off a UI
    Spindle does not serve is not. An env file that does not exist loads nothing, as
    python-dotenv reads it, and is warned about."""
    config = whoami_config(tmp_path, env="absent.env",
                           http={"app": "./app.py:app", "disable_ui": True})
    with spindle(tmp_path, "serve", config) as srv:
        r = httpx.post(srv.base_url + "/runs/wait", headers={"x-user-id": "u-1"},
                       json={"assistant_id": "whoami", "input": {}})
        assert r.status_code == 200, r.text
        assert "x-user-id" not in r.json()["seen"], r.json()
        output = srv.output()
    assert output.count("http.app") == 1, output
    assert "http.disable_ui" not in output, output
    assert "absent.env" in output and "does not exist" in output, output


# ------------------------------------------------------------------------------------------
# env: loaded before the graphs; the real environment wins
# ------------------------------------------------------------------------------------------


class EchoModel(LocalServer):
    """An OpenAI-compatible `/chat/completions` that answers `<model> <Authorization>`."""

    def __init__(self):
        class Handler(QuietHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                text = f"{body['model']} {self.headers.get('Authorization')}"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunk = {"id": "c1", "choices": [{"index": 0, "delta": {"content": text},
                                                  "finish_reason": "stop"}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())

        super().__init__(Handler)
        self.url = f"{self.origin}/v1"


MODEL_GRAPH = """
state: {messages: messages}
models:
  m: {provider: openai, base_url_env: E2E_MODEL_URL, model_env: E2E_MODEL_NAME, api_key_env: E2E_MODEL_KEY}
nodes:
  model: {kind: model, model: m}
edges:
  - {from: __start__, to: model}
  - {from: model, to: __end__}
"""


def test_env_file_reaches_graph_files_and_the_real_environment_wins(tmp_path):
    """The graph file's model takes its URL (needed to load the graph at all), name and key
    from variables the config's dotenv file sets; one also set in the real environment keeps
    the real value."""
    model = EchoModel()
    try:
        (tmp_path / "model.yaml").write_text(MODEL_GRAPH)
        (tmp_path / ".env").write_text(
            f"E2E_MODEL_URL={model.url}\nE2E_MODEL_NAME=name-from-file\nE2E_MODEL_KEY=key-from-file\n")
        config = {"graphs": {"model": "./model.yaml"}, "env": ".env"}
        (tmp_path / "langgraph.json").write_text(json.dumps(config))
        srv = harness.start(
            "sqlite",
            lambda port: ["serve", "--config", str(tmp_path / "langgraph.json"), "--host", "127.0.0.1",
                          "--port", str(port), "--database-url", f"sqlite://{tmp_path / 'spindle.db'}"],
            tmp_path,
            env={"E2E_MODEL_NAME": "name-from-real"},
        )
        try:
            r = httpx.post(srv.base_url + "/runs/wait", timeout=30, json={
                "assistant_id": "model", "input": {"messages": [{"role": "user", "content": "hi"}]}})
            assert r.status_code == 200, r.text
            assert r.json()["messages"][-1]["content"] == "name-from-real Bearer key-from-file", r.json()
        finally:
            harness.stop(srv)
    finally:
        model.close()


def test_spindle_settings_in_env_count_as_the_environments(tmp_path):
    """`SPINDLE_*` variables set by `env` are read as if the environment had them: here the
    port and host the server listens on, given by no flag."""
    config = tmp_path / "spindle.json"

    def args(port: int) -> list[str]:
        config.write_text(json.dumps({"graphs": {"chain": CHAIN}, "env": {
            "SPINDLE_PORT": str(port), "SPINDLE_HOST": "127.0.0.1"}}))
        return ["serve", "--config", str(config), "--database-url", f"sqlite://{tmp_path / 's.db'}"]

    srv = harness.start("sqlite", args, tmp_path)
    try:
        assert httpx.get(srv.base_url + "/ok").json() == {"ok": True}
    finally:
        harness.stop(srv)


# ------------------------------------------------------------------------------------------
# http.disable_*
# ------------------------------------------------------------------------------------------


def not_served(base_url: str, method: str, path: str, body: dict | None = None) -> None:
    r = httpx.request(method, base_url + path, json=body)
    assert r.status_code == 404, (method, path, r.status_code, r.text)
    assert r.json()["message"] == f"No route for {path}", r.json()


def test_disabled_groups_are_not_served_and_health_checks_stay(tmp_path):
    """`disable_assistants`, `disable_runs` (crons and the agent protocol with it, as in the
    reference), `disable_store` and `disable_meta` (`/info`, `/docs`, `/openapi.json`): 404s
    as for an unknown path. Threads are still served, and so are the health checks."""
    config = whoami_config(tmp_path, http={
        "disable_assistants": True, "disable_runs": True, "disable_store": True,
        "disable_meta": True, "disable_mcp": True})
    with spindle(tmp_path, "serve", config) as srv:
        base = srv.base_url
        thread = httpx.post(base + "/threads", json={}).json()["thread_id"]
        for method, path, body in [
            ("POST", "/assistants/search", {}),
            ("GET", "/assistants/whoami", None),
            ("POST", "/runs/wait", {"assistant_id": "whoami"}),
            ("POST", f"/threads/{thread}/runs", {"assistant_id": "whoami"}),
            ("GET", f"/threads/{thread}/runs", None),
            ("POST", "/runs/crons/search", {}),
            ("POST", f"/threads/{thread}/commands", {}),
            ("POST", f"/threads/{thread}/stream/events", {}),
            ("POST", "/store/items/search", {}),
            ("GET", "/info", None),
            ("GET", "/docs", None),
            ("GET", "/openapi.json", None),
        ]:
            not_served(base, method, path, body)
        for path in ["/ok", "/health", "/live", "/ready", f"/threads/{thread}", f"/threads/{thread}/state"]:
            assert httpx.get(base + path).status_code == 200, path
        assert "off (http.disable_meta)" in srv.output()


def test_disable_threads_and_webhooks(tmp_path):
    """`disable_threads` takes a thread's state, history and stream with it; runs stay. The
    document lists only what is served. `disable_webhooks`: a run or a cron asking for a
    webhook is refused with a 422 naming `webhook`, and run bodies document none."""
    config = whoami_config(tmp_path, http={"disable_threads": True, "disable_webhooks": True})
    with spindle(tmp_path, "serve", config) as srv:
        base = srv.base_url
        for method, path in [("POST", "/threads"), ("POST", "/threads/search"),
                             ("GET", "/threads/t-1"), ("GET", "/threads/t-1/state"),
                             ("GET", "/threads/t-1/history"), ("GET", "/threads/t-1/stream")]:
            not_served(base, method, path, {} if method == "POST" else None)
        r = httpx.post(base + "/runs/wait", json={"assistant_id": "chain", "input": {"n": 1}})
        assert r.status_code == 200 and r.json() == {"n": 4}, r.text

        doc = httpx.get(base + "/openapi.json").json()
        thread_paths = [p for p in doc["paths"] if p.startswith("/threads")]
        assert "/threads" not in thread_paths and "/threads/{thread_id}/state" not in thread_paths
        assert all("/runs" in p or "/stream/events" in p or "/commands" in p for p in thread_paths), thread_paths
        assert "/runs/wait" in doc["paths"] and "/assistants/search" in doc["paths"]
        assert "webhook" not in doc["components"]["schemas"]["RunCreate"]["properties"]

        hook = "https://hooks.example.com/x"
        for path, body in [
            ("/runs", {"assistant_id": "chain", "input": {"n": 1}, "webhook": hook}),
            ("/runs/wait", {"assistant_id": "chain", "input": {"n": 1}, "webhook": hook}),
            ("/runs/batch", [{"assistant_id": "chain", "webhook": hook}]),
            ("/runs/crons", {"assistant_id": "chain", "schedule": "0 0 * * *", "webhook": hook}),
        ]:
            r = httpx.post(base + path, json=body)
            assert r.status_code == 422, (path, r.text)
            detail = r.json()["detail"]
            assert detail[0]["loc"][-1] == "webhook", detail
            assert "disable_webhooks" in detail[0]["msg"], detail
        crons = httpx.post(base + "/runs/crons/search", json={}).json()
        assert crons == [], crons


def test_a_mistake_in_http_is_named(tmp_path):
    """An `http` key LangGraph does not have stops the server, naming it with the closest one;
    so does a value of the wrong type."""
    for http, expected in [
        ({"disable_run": True}, "did you mean `http.disable_runs`"),
        ({"configurable_headers": {"inclde": ["x-*"]}}, "inclde"),
        ({"disable_threads": "yes"}, "`http.disable_threads` must be true or false"),
    ]:
        path = tmp_path / "spindle.json"
        path.write_text(json.dumps({"graphs": {"chain": CHAIN}, "http": http}))
        done = harness.run(["serve", "--config", str(path), "--port", str(harness.free_port()),
                            "--database-url", f"sqlite://{tmp_path / 'x.db'}"], tmp_path, timeout=30)
        assert done.returncode != 0, done.stdout
        assert expected in done.stderr and "spindle.json" in done.stderr, done.stderr


# ------------------------------------------------------------------------------------------
# an unreachable PostgreSQL
# ------------------------------------------------------------------------------------------


def test_an_unreachable_postgres_fails_at_once_in_one_line(tmp_path):
    started = time.monotonic()
    done = harness.run(["serve", "--database-url", "postgres://postgres:pw@127.0.0.1:1/test",
                        "--port", str(harness.free_port()), "--examples"], tmp_path, timeout=30)
    elapsed = time.monotonic() - started
    assert done.returncode != 0
    assert elapsed < 3, elapsed
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "127.0.0.1:1" in lines[0] and "connection refused" in lines[0], lines
    assert "pw" not in lines[0].replace("postgres://postgres:***", ""), lines


@pytest.mark.skipif(not harness.POSTGRES_URL, reason=harness.POSTGRES_SKIP_REASON)
def test_a_missing_postgres_database_is_named_with_a_hint(tmp_path):
    url = harness.pg_url_with_db(harness.POSTGRES_URL, "spindle_e2e_missing_" + secrets.token_hex(4))
    done = harness.run(["migrate", "--database-url", url], tmp_path, timeout=30)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "does not exist" in lines[0] and "createdb" in lines[0], lines
