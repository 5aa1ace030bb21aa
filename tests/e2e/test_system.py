"""System routes: liveness, readiness, service information, the API description and its page."""

from __future__ import annotations

import contextlib
import re
import sqlite3

import harness
import httpx
import pytest
from e2e_util import assert_status, describe

# Every path this foundation serves for assistants, threads and the system, as the reference names
# them. Path parameter names are compared loosely ({x} == {y}).
EXPECTED_OPERATIONS = {
    "/assistants": {"post"},
    "/assistants/search": {"post"},
    "/assistants/count": {"post"},
    "/assistants/{assistant_id}": {"get", "patch", "delete"},
    "/assistants/{assistant_id}/graph": {"get"},
    "/assistants/{assistant_id}/schemas": {"get"},
    "/assistants/{assistant_id}/subgraphs": {"get"},
    "/assistants/{assistant_id}/subgraphs/{namespace}": {"get"},
    "/assistants/{assistant_id}/versions": {"post"},
    "/assistants/{assistant_id}/latest": {"post"},
    "/threads": {"post"},
    "/threads/search": {"post"},
    "/threads/count": {"post"},
    "/threads/{thread_id}": {"get", "patch", "delete"},
    "/threads/{thread_id}/copy": {"post"},
    "/ok": {"get"},
    "/info": {"get"},
}

# Aegra's health routes, which Spindle serves as well (the reference does not).
SPINDLE_HEALTH_OPERATIONS = {"/health": {"get"}, "/live": {"get"}, "/ready": {"get"}}

# Operations whose request carries a JSON body in the interface.
BODY_OPERATIONS = [
    ("/assistants", "post"),
    ("/assistants/search", "post"),
    ("/assistants/count", "post"),
    ("/assistants/{assistant_id}", "patch"),
    ("/assistants/{assistant_id}/versions", "post"),
    ("/assistants/{assistant_id}/latest", "post"),
    ("/threads", "post"),
    ("/threads/search", "post"),
    ("/threads/count", "post"),
    ("/threads/{thread_id}", "patch"),
]


def _normalise(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def _openapi_operations(http: httpx.Client) -> dict[str, set[str]]:
    r = http.get("/openapi.json")
    assert_status(r, 200)
    doc = r.json()
    assert isinstance(doc.get("openapi"), str) and doc["openapi"].startswith("3"), doc.get("openapi")
    ops: dict[str, set[str]] = {}
    for path, item in doc["paths"].items():
        ops.setdefault(_normalise(path), set()).update(
            m for m in item if m in {"get", "put", "post", "patch", "delete", "head", "options"}
        )
    return ops


def test_ok(http):
    """Clients and load balancers probe GET /ok and expect {"ok": true}."""
    r = http.get("/ok")
    assert_status(r, 200)
    assert r.json().get("ok") is True, describe(r)


@pytest.mark.spindle_only
@pytest.mark.parametrize("path", ["/health", "/live", "/ready"])
def test_health_routes(http, path):
    """Orchestrators (Kubernetes probes) poll /health, /live and /ready and need a 200 JSON answer."""
    r = http.get(path)
    assert_status(r, 200)
    assert r.headers.get("content-type", "").startswith("application/json"), describe(r)
    assert isinstance(r.json(), dict), describe(r)


def test_info(http, sync_client):
    """Clients read /info for the server version and feature flags (flags.assistants gates UIs)."""
    r = http.get("/info")
    assert_status(r, 200)
    info = r.json()
    assert isinstance(info.get("version"), str) and info["version"], describe(r)
    assert isinstance(info.get("flags"), dict), describe(r)
    assert info["flags"].get("assistants") is True, describe(r)
    # The official client reads it too.
    server_info = sync_client.http.get("/info")
    assert server_info["version"] == info["version"]


def test_openapi_lists_every_route(http):
    """Client generators and humans rely on /openapi.json listing every route that is served."""
    ops = _openapi_operations(http)
    missing = []
    for path, methods in EXPECTED_OPERATIONS.items():
        have = ops.get(_normalise(path), set())
        for m in sorted(methods - have):
            missing.append(f"{m.upper()} {path}")
    assert not missing, f"/openapi.json lacks: {missing}"


@pytest.mark.spindle_only
def test_openapi_lists_health_routes(http):
    """The health routes Spindle serves are described too."""
    ops = _openapi_operations(http)
    missing = [
        f"{m.upper()} {p}"
        for p, methods in SPINDLE_HEALTH_OPERATIONS.items()
        for m in sorted(methods - ops.get(p, set()))
    ]
    assert not missing, f"/openapi.json lacks: {missing}"


@pytest.mark.spindle_only
def test_openapi_describes_bodies_and_responses(http):
    """Generated clients need a request schema for each body and a response for each operation."""
    doc = http.get("/openapi.json").json()
    by_norm = {_normalise(p): item for p, item in doc["paths"].items()}
    problems = []
    for path, methods in EXPECTED_OPERATIONS.items():
        item = by_norm.get(_normalise(path), {})
        for m in methods:
            op = item.get(m)
            if op is None:
                continue  # reported by test_openapi_lists_every_route
            responses = op.get("responses") or {}
            if not any(str(code).startswith("2") for code in responses):
                problems.append(f"{m.upper()} {path}: no 2xx response")
    for path, m in BODY_OPERATIONS:
        op = by_norm.get(_normalise(path), {}).get(m)
        if op is None:
            continue
        content = (op.get("requestBody") or {}).get("content") or {}
        if "application/json" not in content or "schema" not in content["application/json"]:
            problems.append(f"{m.upper()} {path}: no application/json request schema")
    assert not problems, problems


def test_docs_page(http):
    """GET /docs is a readable HTML page for humans."""
    r = http.get("/docs", follow_redirects=True)
    assert_status(r, 200)
    assert r.headers.get("content-type", "").startswith("text/html"), describe(r)
    assert "<html" in r.text.lower()


@pytest.mark.spindle_only
def test_docs_page_loads_no_cdn_script(http):
    """/docs must work offline: no <script src> (nor stylesheet) from an http(s) CDN."""
    r = http.get("/docs", follow_redirects=True)
    assert_status(r, 200)
    html = r.text
    assert "<html" in html.lower(), describe(r)
    tags = re.findall(r"<(?:script|link)\b[^>]*>", html, flags=re.IGNORECASE)
    external = [
        t for t in tags
        if re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", t, flags=re.IGNORECASE)
    ]
    assert not external, f"/docs loads external resources: {external}"
    # Imports from inside inline scripts count too.
    inline_imports = re.findall(r"""import\s*\(?\s*["'](?:https?:)?//[^"']+["']""", html)
    assert not inline_imports, f"/docs imports external modules: {inline_imports}"
    # The page's own scripts are served by the server itself.
    scripts = re.findall(r"""<script\b[^>]*\bsrc\s*=\s*["']([^"']+)["']""", html, flags=re.IGNORECASE)
    for src in scripts:
        asset = http.get(str(r.url.join(src)))
        assert_status(asset, 200)
        assert asset.content.strip(), f"/docs loads an empty {src}"


@pytest.mark.spindle_only
def test_docs_assets_are_whole_and_the_unused_ones_left_out(http):
    """Swagger UI's bundle (what /docs loads) is served whole; its source maps are not in the
    binary (stubs stand in for them, see .cargo/config.toml), which keeps it 9 MB smaller."""
    bundle = http.get("/docs/swagger-ui-bundle.js")
    assert_status(bundle, 200)
    assert len(bundle.content) > 1_000_000, describe(bundle)
    source_map = http.get("/docs/swagger-ui-bundle.js.map")
    assert len(source_map.content) < 1_000, f"{len(source_map.content)} bytes"


def test_unknown_route_is_404(http):
    """An unknown path is 404, not 500 or 200."""
    r = http.get("/definitely/not/a/route")
    assert_status(r, 404)


@pytest.mark.spindle_only
def test_unknown_route_error_body(http):
    """Non-validation errors carry the interface's {error, message, details} body."""
    from e2e_util import assert_error_body

    assert_error_body(http.get("/definitely/not/a/route"), 404)


@pytest.mark.spindle_only
def test_dev_prints_url_and_graphs(server):
    """`spindle dev` prints the URL it serves and the graphs it loaded, for the developer."""
    if server.backend != "sqlite":
        pytest.skip("only `spindle dev` (the sqlite backend) is checked")
    out = server.output()
    assert server.base_url in out or server.base_url.replace("http://", "") in out, out[-2000:]
    assert "echo" in out, out[-2000:]


@contextlib.contextmanager
def server_database(server):
    """A DB-API connection (autocommit) on the database the session's server runs on."""
    if server.backend == "sqlite":
        data_dir = server.argv[server.argv.index("--data-dir") + 1]
        conn = sqlite3.connect(f"{data_dir}/spindle.db", timeout=10, isolation_level=None)
    else:
        import psycopg

        url = harness.pg_url_with_db(harness.POSTGRES_URL, server.database)
        conn = psycopg.connect(url, autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


@pytest.mark.spindle_only
def test_ready_is_not_ready_while_the_schema_is_missing_or_behind(server, http):
    """`/ready` answered 200 on a database without Spindle's tables (an empty database URL
    made one per connection), while every API call failed. It checks the schema: without the
    migrations table, or with the newest migration not applied, it is 503 and says what to
    do; once the schema is back, 200 again."""
    if server.backend == "external":
        pytest.skip("edits the server's own database")
    assert http.get("/ready").status_code == 200
    with server_database(server) as db:
        db.execute("ALTER TABLE _sqlx_migrations RENAME TO _sqlx_migrations_away")
        try:
            r = http.get("/ready")
        finally:
            db.execute("ALTER TABLE _sqlx_migrations_away RENAME TO _sqlx_migrations")
        assert_status(r, 503)
        assert r.json()["error"] == "unavailable" and "spindle migrate" in r.json()["message"], r.text
        assert http.get("/ready").status_code == 200

        newest = db.execute("SELECT max(version) FROM _sqlx_migrations").fetchone()[0]
        db.execute("UPDATE _sqlx_migrations SET version = -version WHERE version = %d" % newest)
        try:
            r = http.get("/ready")
        finally:
            db.execute("UPDATE _sqlx_migrations SET version = -version WHERE version = %d" % -newest)
        assert_status(r, 503)
        assert f"migration {newest} is not applied" in r.json()["message"], r.text
        assert http.get("/ready").status_code == 200
