"""The README's client examples are scripts (`examples/clients/`) that run as written: the
README shows each whole, and each runs here against what it names, on both backends. The
"existing project" ones run against projects in the shape of LangGraph's templates
(`projects/template`: new-langgraph-project; `projects/react`: react-agent, with a scripted
model), the first request against the example graphs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import harness

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "clients"


def run_script(name: str, server: harness.Server) -> str:
    """Runs `examples/clients/<name>` as a user would, on `server`; its output."""
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / name)],
        env={**harness.child_env(), "SPINDLE_URL": server.base_url},
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, f"{name} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_the_readme_shows_each_client_script_whole():
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    scripts = sorted(SCRIPTS.glob("*.py"))
    assert scripts
    for script in scripts:
        assert script.read_text() in blocks, f"README.md does not show {script.name} as it is"
        assert f"examples/clients/{script.name}" in readme, script.name


def test_the_first_request_runs_as_written(server):
    out = run_script("first_request.py", server)
    lines = out.splitlines()
    assert "{'n': 4}" in lines, out
    assert lines[-1] == "2", out  # the assistant's version after its update
    assert "echo: hi" in out, out


def test_the_new_langgraph_project_example_runs_as_written(template_server):
    out = run_script("new_langgraph_project.py", template_server)
    assert "updates {'call_model': {'changeme':" in out, out
    assert "Configured with from the client" in out.splitlines()[-1], out


def test_the_react_agent_example_runs_as_written(react_server):
    out = run_script("react_agent.py", react_server)
    assert "[calls get_weather]" in out, out
    assert "[get_weather: It is sunny in Paris.]" in out, out
    assert out.rstrip().endswith("It is sunny in Paris."), out
