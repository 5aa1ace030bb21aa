"""End-to-end harness: starts the real `spindle` binary and hands tests the official clients.

Each test runs once per storage backend:

- ``sqlite``:   ``spindle dev --host 127.0.0.1 --port P --data-dir <tmp>``
- ``postgres``: a fresh database ``spindle_e2e_<random>`` is created on the server named by
  ``SPINDLE_TEST_POSTGRES_URL``, then ``spindle serve --database-url <that db>``; the database is
  dropped afterwards. Without ``SPINDLE_TEST_POSTGRES_URL`` these tests are skipped, loudly.

Environment:

- ``SPINDLE_BIN``: the binary (default ``<repo>/target/release/spindle``).
- ``SPINDLE_TEST_POSTGRES_URL``: admin URL of a PostgreSQL server, e.g.
  ``postgres://postgres@127.0.0.1:5432/test``.
- ``SPINDLE_E2E_URL``: run against an already-running server instead (for example the reference
  server, ``langgraph dev``). Tests marked ``spindle_only`` check behaviour where the interface
  document deliberately differs from the reference; they are skipped in this mode unless
  ``SPINDLE_E2E_SPINDLE_ONLY=1`` (use that when the URL points at a Spindle).
- ``SPINDLE_E2E_START_TIMEOUT``: seconds to wait for ``GET /ok`` (default 10).

Async tests are plain ``async def`` functions; they run on one event loop owned by this file
(see ``pytest_pyfunc_call``), so no asyncio plugin is needed.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import harness
import httpx
import pytest
from harness import POSTGRES_SKIP_REASON, POSTGRES_URL
from langgraph_sdk import get_client, get_sync_client

EXTERNAL_URL = os.environ.get("SPINDLE_E2E_URL", "").strip().rstrip("/")
RUN_SPINDLE_ONLY = (not EXTERNAL_URL) or os.environ.get("SPINDLE_E2E_SPINDLE_ONLY") == "1"

BACKENDS = ["external"] if EXTERNAL_URL else ["sqlite", "postgres"]

_skipped_postgres = False

# --------------------------------------------------------------------------------------------
# pytest hooks
# --------------------------------------------------------------------------------------------

_LOOP: asyncio.AbstractEventLoop | None = None


def _loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    return _LOOP


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "spindle_only: behaviour where the interface document deliberately differs from the "
        "reference server; skipped when SPINDLE_E2E_URL points at another server",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if RUN_SPINDLE_ONLY:
        return
    skip = pytest.mark.skip(
        reason="spindle_only: the interface document differs from the reference here "
        "(set SPINDLE_E2E_SPINDLE_ONLY=1 when SPINDLE_E2E_URL is a Spindle)"
    )
    for item in items:
        if "spindle_only" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """Run ``async def`` tests to completion on the shared event loop."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in names}
        _loop().run_until_complete(pyfuncitem.obj(**kwargs))
        return True
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if _skipped_postgres or (not EXTERNAL_URL and not POSTGRES_URL):
        terminalreporter.section("PostgreSQL backend", sep="!", red=True, bold=True)
        terminalreporter.write_line(
            "WARNING: " + POSTGRES_SKIP_REASON, red=True, bold=True
        )
    if EXTERNAL_URL:
        terminalreporter.section("target", sep="-")
        terminalreporter.write_line(
            f"ran against the external server {EXTERNAL_URL}"
            + ("" if RUN_SPINDLE_ONLY else "; spindle_only tests were skipped")
        )


def pytest_sessionfinish(session, exitstatus) -> None:
    global _LOOP
    if _LOOP is not None and not _LOOP.is_closed():
        _LOOP.close()
    _LOOP = None


# --------------------------------------------------------------------------------------------
# the server under test
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session", params=BACKENDS)
def server(request: pytest.FixtureRequest):
    """The server under test, one per backend for the whole session."""
    yield from _session_server(request.param)


@pytest.fixture(scope="session", params=BACKENDS)
def webhook_server(request: pytest.FixtureRequest):
    """A server that may deliver webhooks to 127.0.0.1 (``--webhook-allow-private``), for tests
    with a local receiver; the default ``server`` refuses such webhooks, as a deployment does."""
    yield from _session_server(request.param, extra_args=["--webhook-allow-private"])


# A thread-TTL sweep every second, and a default TTL (keep_latest, 0.02 min = 1.2 s) for threads
# without one of their own, so TTL tests see threads expire within seconds.
TTL_SERVER_ARGS = [
    "--thread-sweep-interval-secs", "1",
    "--thread-ttl-minutes", "0.02",
    "--thread-ttl-strategy", "keep_latest",
]


@pytest.fixture(scope="session", params=BACKENDS)
def ttl_server(request: pytest.FixtureRequest):
    """A server that sweeps expired threads every second and trims threads idle for 1.2 s
    (``TTL_SERVER_ARGS``); only for TTL tests, since it trims every thread it holds."""
    yield from _session_server(request.param, extra_args=TTL_SERVER_ARGS)


# The Python twins of the example graphs (../shared/ref), served through Spindle's Python
# workers, with the interpreter that has `spindle_worker` and LangGraph installed.
REF_PROJECT = Path(__file__).resolve().parents[2].parent / "shared" / "ref"
WORKER_PYTHON = os.environ.get("SPINDLE_TEST_PYTHON", "").strip()


# Module-scoped, unlike `server`: each `spindle serve` holds up to 16 PostgreSQL connections,
# and the servers of every module alive at once would exhaust the database's 100.
@pytest.fixture(scope="module", params=BACKENDS)
def python_server(request: pytest.FixtureRequest):
    """A server whose graphs are LangGraph Python graphs: the reference's own project
    (``../shared/ref/langgraph.json``), run by Spindle's Python workers (one per module that
    uses it)."""
    if request.param != "external":
        if not WORKER_PYTHON:
            if os.environ.get("SPINDLE_TEST_REQUIRE_PYTHON") == "1":
                pytest.fail("SPINDLE_TEST_REQUIRE_PYTHON=1 but SPINDLE_TEST_PYTHON is not set")
            pytest.skip("SPINDLE_TEST_PYTHON (a Python with spindle_worker installed) is not set")
        if not (REF_PROJECT / "langgraph.json").is_file():
            pytest.fail(f"the reference project is not at {REF_PROJECT}")
    args = ["--config", str(REF_PROJECT / "langgraph.json"), "--python", WORKER_PYTHON]
    yield from _session_server(request.param, extra_args=args)


@pytest.fixture
def python_client(python_server: harness.Server):
    """The official async client, on ``python_server``."""
    c = get_client(url=python_server.base_url, api_key=None, timeout=30)
    yield c
    _loop().run_until_complete(c.aclose())


@pytest.fixture
def ttl_client(ttl_server: harness.Server):
    """The official async client, on ``ttl_server``."""
    c = get_client(url=ttl_server.base_url, api_key=None, timeout=30)
    yield c
    _loop().run_until_complete(c.aclose())


def _session_server(backend: str, extra_args: list[str] | None = None, env: dict[str, str] | None = None):
    """Start ``spindle`` on ``backend`` with ``extra_args`` and ``env`` added, yield it, then stop it
    and remove its database and working folder (kept, with the logs, when something failed)."""
    global _skipped_postgres
    extra_args = list(extra_args or [])

    if backend == "external":
        yield harness.Server(backend="external", base_url=EXTERNAL_URL)
        return

    if backend == "postgres" and not POSTGRES_URL:
        if os.environ.get("SPINDLE_TEST_REQUIRE_POSTGRES") == "1":
            pytest.fail("SPINDLE_TEST_REQUIRE_POSTGRES=1 but SPINDLE_TEST_POSTGRES_URL is not set")
        _skipped_postgres = True
        pytest.skip(POSTGRES_SKIP_REASON)

    workdir = Path(tempfile.mkdtemp(prefix=f"spindle-e2e-{backend}-"))
    dbname = None
    srv = None
    keep_workdir = False
    try:
        if backend == "sqlite":
            data_dir = workdir / "data"
            srv = harness.start(
                backend,
                lambda port: ["dev", "--host", "127.0.0.1", "--port", str(port),
                              "--data-dir", str(data_dir), *extra_args],
                workdir,
                env=env,
            )
        else:
            dbname = harness.create_database()
            db_url = harness.pg_url_with_db(POSTGRES_URL, dbname)
            srv = harness.start(
                backend,
                lambda port: ["serve", "--host", "127.0.0.1", "--port", str(port),
                              "--database-url", db_url, "--examples", *extra_args],
                workdir,
                env=env,
            )
            srv.database = dbname
        yield srv
    except BaseException:
        keep_workdir = True  # leave the logs for whoever debugs the failure
        raise
    finally:
        if srv is not None:
            harness.stop(srv)
        if dbname is not None:
            harness.drop_database(dbname)
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def backend(server: harness.Server) -> str:
    """``sqlite``, ``postgres`` or ``external``."""
    return server.backend


@pytest.fixture
def base_url(server: harness.Server) -> str:
    return server.base_url


@pytest.fixture
def client(base_url: str):
    """The official async client (langgraph_sdk.get_client)."""
    c = get_client(url=base_url, api_key=None, timeout=30)
    yield c
    _loop().run_until_complete(c.aclose())


@pytest.fixture
def sync_client(base_url: str):
    """The official sync client (langgraph_sdk.get_sync_client)."""
    c = get_sync_client(url=base_url, api_key=None, timeout=30)
    yield c
    c.close()


@pytest.fixture
def http(base_url: str):
    """A raw HTTP client for wire-level checks."""
    with httpx.Client(base_url=base_url, timeout=30) as c:
        yield c


@pytest.fixture
def webhook_client(webhook_server: harness.Server):
    """The official async client, on the server that may deliver webhooks to 127.0.0.1."""
    c = get_client(url=webhook_server.base_url, api_key=None, timeout=30)
    yield c
    _loop().run_until_complete(c.aclose())


@pytest.fixture
def webhook_http(webhook_server: harness.Server):
    """A raw HTTP client, on the server that may deliver webhooks to 127.0.0.1."""
    with httpx.Client(base_url=webhook_server.base_url, timeout=30) as c:
        yield c


@pytest.fixture
def tag() -> str:
    """A unique marker for metadata, so searches only see this test's records."""
    return "e2e-" + secrets.token_hex(6)


# --------------------------------------------------------------------------------------------
# LangGraph projects as users write them (tests/e2e/projects), served by Spindle unchanged
# --------------------------------------------------------------------------------------------

# `template`: LangGraph's new-langgraph-project template; `react`: the react-agent template with
# a scripted fake chat model and long-term memory. Both declare a graph "agent", so each gets its
# own server; one backend parameter drives both, so a test may use the two servers together.
PROJECTS = Path(__file__).resolve().parent / "projects"


@pytest.fixture(scope="module", params=BACKENDS)
def project_backend(request: pytest.FixtureRequest) -> str:
    """The backend the project servers run on (one parameter for both of them)."""
    return request.param


def _project_server(
    backend: str, project: str, env: dict[str, str] | None = None, extra_args: list[str] | None = None
):
    """Spindle serving ``projects/<project>/langgraph.json`` with the worker interpreter.

    With ``SPINDLE_E2E_URL`` (an already-running server), the project's own server is named by
    ``SPINDLE_E2E_<PROJECT>_URL`` instead (e.g. ``langgraph dev`` run in the project folder)."""
    if backend == "external":
        url = os.environ.get(f"SPINDLE_E2E_{project.upper()}_URL", "").strip().rstrip("/")
        if not url:
            pytest.skip(f"SPINDLE_E2E_{project.upper()}_URL (a server for projects/{project}) is not set")
        yield harness.Server(backend="external", base_url=url)
        return
    if not WORKER_PYTHON:
        if os.environ.get("SPINDLE_TEST_REQUIRE_PYTHON") == "1":
            pytest.fail("SPINDLE_TEST_REQUIRE_PYTHON=1 but SPINDLE_TEST_PYTHON is not set")
        pytest.skip("SPINDLE_TEST_PYTHON (a Python with spindle_worker installed) is not set")
    args = ["--config", str(PROJECTS / project / "langgraph.json"), "--python", WORKER_PYTHON]
    yield from _session_server(backend, extra_args=args + list(extra_args or []), env=env)


@pytest.fixture(scope="module")
def template_server(project_backend: str):
    """Spindle serving the new-langgraph-project template (``projects/template``)."""
    yield from _project_server(project_backend, "template")


@pytest.fixture(scope="module")
def react_server(project_backend: str):
    """Spindle serving the react-agent project (``projects/react``). Its graph imports its own
    package (``from react_agent.context import Context``), as the react-agent template does, so
    the project is installed for the workers the way `pip install -e .` would: its ``src`` on
    the workers' PYTHONPATH (Spindle's environment reaches its workers)."""
    src = str(PROJECTS / "react" / "src")
    pythonpath = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    yield from _project_server(project_backend, "react", env={"PYTHONPATH": pythonpath})


@pytest.fixture(scope="module")
def extras_server(project_backend: str):
    """Spindle serving ``projects/extras``: factories, a node searching the store by meaning,
    and one that blocks its worker's loop (two workers, so the other one still answers)."""
    yield from _project_server(project_backend, "extras", extra_args=["--python-workers", "2"])


@pytest.fixture
def extras_client(extras_server: harness.Server):
    """The official async client, on ``extras_server``."""
    c = get_client(url=extras_server.base_url, api_key=None, timeout=30)
    yield c
    _loop().run_until_complete(c.aclose())


@pytest.fixture
def template_client(template_server: harness.Server):
    """The official async client, on ``template_server``."""
    c = get_client(url=template_server.base_url, api_key=None, timeout=30)
    yield c
    _loop().run_until_complete(c.aclose())


@pytest.fixture
def react_client(react_server: harness.Server):
    """The official async client, on ``react_server``."""
    c = get_client(url=react_server.base_url, api_key=None, timeout=30)
    yield c
    _loop().run_until_complete(c.aclose())
