"""The official JS client (@langchain/langgraph-sdk, pinned in tests/js/package.json) against
Spindle: node's test runner executes tests/js/client.test.mjs against each backend's server."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

JS_DIR = Path(__file__).resolve().parents[1] / "js"


def test_js_client_streams_and_resumes(base_url):
    """Clients written with the JS SDK stream a run and interrupt/resume another unchanged."""
    node = shutil.which("node")
    if node is None or not (JS_DIR / "node_modules" / "@langchain" / "langgraph-sdk").is_dir():
        if os.environ.get("SPINDLE_TEST_REQUIRE_JS") == "1":
            pytest.fail("node or tests/js/node_modules is missing (run `npm ci` in tests/js)")
        pytest.skip("node or tests/js/node_modules is missing (run `npm ci` in tests/js)")
    r = subprocess.run(
        [node, "--test", "client.test.mjs"],
        cwd=JS_DIR,
        env={**os.environ, "SPINDLE_URL": base_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"node --test failed:\n{r.stdout}\n{r.stderr}"
