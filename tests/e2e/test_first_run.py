"""A new user's first run: what a start leaves on disk, and what a start that fails says.

`spindle dev` in a project creates `.spindle/`, which git never shows; a start that fails (a
taken port, `serve` without graphs) leaves nothing behind and says how to fix it.

These tests start their own spindle processes in empty folders, so they only run when the
suite starts the binary itself, never against SPINDLE_E2E_URL.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
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

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "graphs"


@contextmanager
def taken_port() -> Iterator[int]:
    """A 127.0.0.1 port another program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def files_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("command", [["dev"], ["serve", "--examples"]])
def test_a_start_on_a_taken_port_leaves_nothing_and_suggests_another(tmp_path, command):
    """Nothing is created before the port is listened on; the error says the port is in use
    and names `--port` with a port that is free."""
    with taken_port() as port:
        r = harness.run([*command, "--host", "127.0.0.1", "--port", str(port)], tmp_path, timeout=30)
    assert r.returncode != 0, r.stdout
    assert f"port {port} is already in use" in r.stderr, r.stderr
    assert "--port " in r.stderr, r.stderr
    suggested = int(r.stderr.split("--port ")[1].split()[0])
    assert suggested != port, r.stderr
    assert files_in(tmp_path) == [], "a failed start left files behind"


def test_a_failed_start_removes_the_data_dir_it_created(tmp_path):
    """A start that fails after the database was opened (here: the Python interpreter of a
    Python graph's workers does not exist) removes the data folder it created."""
    (tmp_path / "spindle.json").write_text(json.dumps({"graphs": {"agent": "./agent.py:graph"}}))
    missing_python = tmp_path / "no-such-python"
    r = harness.run(["dev", "--port", str(harness.free_port()), "--python", str(missing_python)],
                    tmp_path, timeout=60)
    assert r.returncode != 0, r.stdout
    assert "error" in r.stderr, r.stderr
    assert files_in(tmp_path) == ["spindle.json"], r.stderr


def test_the_data_dir_is_ignored_by_git(tmp_path):
    """`spindle dev` in a git repository: `.spindle/` carries a `.gitignore` of `*`, so
    `git status` shows nothing of it; an existing data folder without one gets one."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run([git, "init", "-q", str(project)], check=True)
    # The test harness's logs are written into the working folder: not Spindle's doing.
    (project / ".git" / "info" / "exclude").write_text("*.log\n")

    def untracked() -> str:
        return subprocess.run([git, "status", "--porcelain", "--untracked-files=all"], cwd=project,
                              capture_output=True, text=True, check=True).stdout

    def dev() -> harness.Server:
        return harness.start("sqlite", lambda port: ["dev", "--host", "127.0.0.1", "--port", str(port)],
                             project)

    srv = dev()
    try:
        assert httpx.get(srv.base_url + "/ok").status_code == 200
    finally:
        harness.stop(srv)
    gitignore = project / ".spindle" / ".gitignore"
    assert "*" in gitignore.read_text().splitlines(), gitignore.read_text()
    assert (project / ".spindle" / "spindle.db").is_file()
    assert untracked() == ""

    gitignore.unlink()
    srv = dev()
    harness.stop(srv)
    assert "*" in gitignore.read_text().splitlines()
    assert untracked() == ""


@pytest.mark.parametrize("config", [None, {}, {"graphs": {}}])
def test_serve_without_graphs_refuses_and_creates_nothing(tmp_path, config):
    """`spindle serve` with no config file, or one naming no graphs, does not fall back on the
    example graphs: it stops, saying how to give graphs and how to serve the examples."""
    if config is not None:
        (tmp_path / "langgraph.json").write_text(json.dumps(config))
    r = harness.run(["serve", "--port", str(harness.free_port())], tmp_path, timeout=30)
    assert r.returncode != 0, r.stdout
    assert "no graphs to serve" in r.stderr, r.stderr
    assert "--config path/to/langgraph.json" in r.stderr, r.stderr
    assert "spindle serve --examples" in r.stderr, r.stderr
    if config is not None:
        assert "langgraph.json names no graphs" in r.stderr, r.stderr
    assert files_in(tmp_path) == ([] if config is None else ["langgraph.json"])


def test_serve_with_examples_serves_every_example_graph(tmp_path):
    """`--examples` serves the built-in examples on purpose: one per examples/graphs file."""
    srv = harness.start(
        "sqlite",
        lambda port: ["serve", "--examples", "--host", "127.0.0.1", "--port", str(port),
                      "--database-url", f"sqlite://{tmp_path / 'spindle.db'}"],
        tmp_path,
    )
    try:
        found = httpx.post(srv.base_url + "/assistants/search", json={"limit": 100}).json()
        graphs = sorted({a["graph_id"] for a in found})
    finally:
        harness.stop(srv)
    assert graphs == sorted(p.stem for p in EXAMPLES.glob("*.yaml"))
    assert "serving the example graphs" in srv.output()


@pytest.mark.parametrize("command", [["dev"], ["serve", "--examples"]])
@pytest.mark.parametrize("given", ["flag", "environment"])
def test_an_empty_database_url_is_refused_naming_the_option(tmp_path, command, given):
    """`--database-url ""` or `SPINDLE_DATABASE_URL=` set empty (a variable left blank in a
    `.env`) used to start a server on a temporary SQLite database per connection: ready, and
    every API call a 500. The start is refused, naming the option, and creates nothing."""
    args = [*command, "--host", "127.0.0.1", "--port", str(harness.free_port())]
    if given == "flag":
        r = harness.run([*args, "--database-url", ""], tmp_path, timeout=30)
    else:
        r = harness.run(args, tmp_path, env={"SPINDLE_DATABASE_URL": ""}, timeout=30)
    assert r.returncode != 0, r.stdout
    assert "ready" not in r.stdout, r.stdout
    assert "--database-url" in r.stderr and "SPINDLE_DATABASE_URL" in r.stderr, r.stderr
    assert "is empty" in r.stderr, r.stderr
    assert files_in(tmp_path) == [], "a refused start left files behind"


def test_an_empty_database_url_in_the_config_file_is_refused_naming_the_key(tmp_path):
    (tmp_path / "spindle.json").write_text(json.dumps({"server": {"database_url": ""}}))
    r = harness.run(["dev", "--port", str(harness.free_port())], tmp_path, timeout=30)
    assert r.returncode != 0, r.stdout
    assert "server.database_url" in r.stderr and "is empty" in r.stderr, r.stderr
    assert files_in(tmp_path) == ["spindle.json"]


@pytest.mark.parametrize(
    "url, suggested",
    [
        ("localhost:5432/db", "postgres://localhost:5432/db"),
        ("ada:secret@db.example:6543/app", "postgres://ada:***@db.example:6543/app"),
    ],
)
def test_a_database_url_without_a_scheme_naming_a_host_is_refused_with_the_fix(tmp_path, url, suggested):
    """`localhost:5432/db` would be a SQLite file of that name: refused, with the URL to write
    instead (its password hidden), and nothing created."""
    r = harness.run(["dev", "--port", str(harness.free_port()), "--database-url", url],
                    tmp_path, timeout=30)
    assert r.returncode != 0, r.stdout
    assert f"write {suggested}" in r.stderr, r.stderr
    assert "secret" not in r.stderr, r.stderr
    assert files_in(tmp_path) == []
