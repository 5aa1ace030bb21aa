"""A web app in a real browser: headless Chromium loads a page from another origin whose script
(tests/browser/page/app.js, bundled with the official JS client @langchain/langgraph-sdk) calls
`spindle dev` directly with an API key, creates a thread, streams a run of the `agent` example
graph and shows the answer. tests/browser/run.mjs drives Chromium with playwright-core and
reports what the page showed, its console errors and its failed requests.

Needs node, `npm ci` in tests/browser and Debian's chromium (/usr/bin/chromium); without them
the tests are skipped, or fail with SPINDLE_TEST_REQUIRE_BROWSER=1 (CI sets it). They start
their own spindle process, so they never run against SPINDLE_E2E_URL.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import harness
import pytest

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
    reason="starts its own spindle process; not applicable with SPINDLE_E2E_URL",
)

BROWSER_DIR = harness.REPO / "tests" / "browser"
CHROMIUM = Path("/usr/bin/chromium")
KEY_ENV = "SPINDLE_BROWSER_TEST_KEY"
API_KEY = secrets.token_urlsafe(24)
# What the `agent` example graph's scripted model says after its tool call (examples/graphs).
AGENT_ANSWER = "The sum is 5."


def node_or_skip() -> str:
    node = shutil.which("node")
    missing = [
        what
        for what, present in (
            ("node", node is not None),
            ("tests/browser/node_modules (run `npm ci` there)", (BROWSER_DIR / "node_modules").is_dir()),
            (f"{CHROMIUM} (`apt-get install chromium`)", CHROMIUM.is_file()),
        )
        if not present
    ]
    if missing:
        reason = "the browser test needs " + ", ".join(missing)
        if os.environ.get("SPINDLE_TEST_REQUIRE_BROWSER") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return node


def build_bundle() -> None:
    """Bundle the page's script (`npm run build`) unless dist/app.js is newer than both it and
    the lockfile."""
    bundle = BROWSER_DIR / "page" / "dist" / "app.js"
    sources = [BROWSER_DIR / "page" / "app.js", BROWSER_DIR / "package-lock.json"]
    if bundle.is_file() and all(bundle.stat().st_mtime > src.stat().st_mtime for src in sources):
        return
    r = subprocess.run(["npm", "run", "build"], cwd=BROWSER_DIR, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"npm run build failed in tests/browser:\n{r.stdout}\n{r.stderr}"


@dataclass
class BrowserEnv:
    node: str
    api_url: str
    page_origin: str


class _QuietHandler(SimpleHTTPRequestHandler):
    """Serves the page's folder without logging each request to stderr."""

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser_env(tmp_path_factory) -> Iterator[BrowserEnv]:
    """`spindle dev` with an API key configured, and the page served on another port, which
    makes it another origin: every call the page makes to the API is a cross-origin one."""
    node = node_or_skip()
    build_bundle()

    tmp = tmp_path_factory.mktemp("browser")
    config = tmp / "spindle.json"
    config.write_text(json.dumps({
        "graphs": {"agent": str(harness.REPO / "examples" / "graphs" / "agent.yaml")},
        "auth": {"api_keys": [{"key_env": KEY_ENV, "identity": "browser-user", "display_name": "Browser"}]},
    }))
    srv = harness.start(
        "sqlite",
        lambda port: ["dev", "--data-dir", str(tmp / "d"), "--host", "127.0.0.1", "--port", str(port),
                      "--config", str(config)],
        tmp,
        env={KEY_ENV: API_KEY},
    )
    pages = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(BROWSER_DIR / "page"))
    )
    threading.Thread(target=pages.serve_forever, daemon=True).start()
    try:
        yield BrowserEnv(node=node, api_url=srv.base_url, page_origin=f"http://127.0.0.1:{pages.server_port}")
    finally:
        pages.shutdown()
        pages.server_close()
        harness.stop(srv)


def open_page(env: BrowserEnv, api_key: str) -> tuple[int, dict]:
    """Load the page in Chromium; return run.mjs's exit code and report."""
    query = urllib.parse.urlencode({"apiUrl": env.api_url, "apiKey": api_key})
    r = subprocess.run(
        [env.node, "run.mjs", f"{env.page_origin}/index.html?{query}"],
        cwd=BROWSER_DIR, capture_output=True, text=True, timeout=90,
    )
    try:
        return r.returncode, json.loads(r.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"run.mjs printed no report (exit {r.returncode}):\n{r.stdout}\n{r.stderr}", pytrace=False)


def test_a_page_on_another_origin_streams_a_run_with_the_js_client(browser_env):
    code, report = open_page(browser_env, API_KEY)
    assert report["answer"] == AGENT_ANSWER, report
    assert report["error"] == "", report
    assert report["consoleErrors"] == [], report
    assert report["failedRequests"] == [], report
    assert code == 0, report


def test_a_wrong_api_key_shows_the_servers_refusal(browser_env):
    code, report = open_page(browser_env, "not-" + API_KEY)
    # "HTTP 401" in the client's error means the browser let the page read the refusal: the 401
    # carries CORS headers too. Without them the page would see only "Failed to fetch".
    assert report["error"].startswith("HTTP 401"), report
    assert report["answer"] == "", report
    assert report["failedRequests"] == [f"POST {browser_env.api_url}/threads: HTTP 401"], report
    assert code == 1, report
