from __future__ import annotations

import asyncio
import functools
import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from fake_spindle import FakeSpindle  # noqa: E402

# The Python twins of the example graphs, beside the checkout (`../shared/ref`), as CI has them.
REF_DIR = HERE.parents[3] / "shared" / "ref"
if not (REF_DIR / "langgraph.json").is_file():
    raise RuntimeError(f"the reference graphs are not at {REF_DIR} (../shared/ref beside the checkout)")
EXTRA_DIR = HERE / "projects" / "extra"
REF_GRAPHS: dict[str, str] = json.loads((REF_DIR / "langgraph.json").read_text())["graphs"]
EXTRA_GRAPHS = {
    "uncompiled": "./graphs/factories.py:uncompiled",
    "from_config": "./graphs/factories.py:from_config",
    "async_factory": "./graphs/factories.py:async_factory",
    "context_factory": "./graphs/factories.py:context_factory",
    "two_params": "./graphs/factories.py:two_params",
    "store_graph": "./graphs/factories.py:store_graph",
    "whoami": "./graphs/factories.py:whoami_factory",
    "by_module": "extra_pkg.graphs:graph",
    "schema_graph": "extra_pkg.graphs:schema_graph",
    "broken": "./graphs/broken.py:graph",
    "missing_var": "extra_pkg.graphs:nope",
    "misspelt": "extra_pkg.graphs:grpah",
    "not_a_graph": "extra_pkg.graphs:not_a_graph",
}


def new_run() -> tuple[str, int]:
    return (str(uuid.uuid4()), 1)


def new_thread() -> str:
    return str(uuid.uuid4())


def run_async(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """Run an async test in its own loop (no pytest plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 120))

    return wrapper


async def ref_worker(spindle: FakeSpindle | None = None, **env: str):
    spindle = spindle or FakeSpindle(str(REF_DIR))
    worker = await spindle.spawn(env)
    report = await worker.init(REF_GRAPHS)
    assert all(g["ok"] for g in report["graphs"].values()), report
    return spindle, worker


@pytest.fixture
def anyio_backend() -> str:  # pragma: no cover - only if anyio's plugin is around
    return "asyncio"
