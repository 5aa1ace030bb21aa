"""Importing the project's graphs, and opening one for a run or a read.

An export is a compiled graph (Pregel), a StateGraph (compiled once here), or a factory
taking 0-2 parameters (a config and/or a server runtime, told apart by annotation),
sync or async, returning a graph, a coroutine, or a sync/async context manager that
stays open for the run or read.
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import importlib
import importlib.util
import inspect
import sys
import traceback
import typing
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.store.base import BaseStore

Kind = Literal["compiled", "state_graph", "factory"]
AccessContext = Literal["threads.create_run", "threads.update", "threads.read", "assistants.read"]

CONFIG_KEY_RUNTIME = "__pregel_runtime"
CONFIG_KEY_CHECKPOINTER = "__pregel_checkpointer"


class GraphLoadError(Exception):
    pass


@dataclass
class LoadedGraph:
    graph_id: str
    kind: Kind
    value: Any  # a Pregel, or the factory
    factory_args: Callable[[dict, Any], dict[str, Any]] | None = None


@dataclass
class Registry:
    graphs: dict[str, LoadedGraph] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # graph_id -> error

    def get(self, graph_id: str) -> LoadedGraph:
        from .errors import RequestError

        if graph_id in self.graphs:
            return self.graphs[graph_id]
        if graph_id in self.failed:
            raise RequestError("not_found", f"graph {graph_id!r} failed to load: {self.failed[graph_id]}")
        raise RequestError("not_found", f"graph {graph_id!r} is not loaded; known: {sorted(self.graphs)}")


# -- import -----------------------------------------------------------------------------


def _import_file(path: Path) -> Any:
    """Load a module from a file, as langgraph-api does, with its folder importable."""
    if not path.is_file():
        raise FileNotFoundError(f"file {str(path)!r} does not exist")
    folder = str(path.parent)
    if folder not in sys.path:
        # Sibling modules (`from utils import x`) import as they do under `langgraph dev`.
        sys.path.insert(0, folder)
    modname = str(path).replace("/", "__").replace(".py", "").replace(" ", "_").lstrip(".")
    spec = importlib.util.spec_from_file_location(modname, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load python file {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(modname, None)
        raise
    return module


def resolve(spec: str, project_dir: Path) -> Any:
    """The variable a spec names (a graph, or the custom auth's `Auth`), its module imported as
    langgraph-api imports it."""
    target, sep, variable = spec.rpartition(":")
    if not sep or not target or not variable:
        raise ValueError(f"invalid spec {spec!r}: expected './path/file.py:variable' or 'package.module:variable'")
    if "/" in target or target.endswith(".py"):
        module = _import_file((project_dir / target).resolve())
    else:
        module = importlib.import_module(target)
    try:
        return module.__dict__[variable]
    except KeyError:
        raise ValueError(_no_variable(target, variable, module)) from None


def _no_variable(target: str, variable: str, module: Any) -> str:
    """Why a spec's variable is missing, with the name it may be a misspelling of and the
    graphs and functions (factories, perhaps) the module defines."""
    public = {k: v for k, v in module.__dict__.items() if not k.startswith("_")}
    graphs = [k for k, v in public.items() if isinstance(v, (Pregel, StateGraph))]
    functions = [
        k for k, v in public.items() if inspect.isfunction(v) and v.__module__ == module.__name__
    ]
    close = difflib.get_close_matches(variable, [*graphs, *functions] or list(public), n=1)
    message = f"{target!r} has no variable {variable!r}"
    if close:
        message += f" (did you mean {close[0]!r}?)"
    message += f"; graphs it defines: {', '.join(graphs) or 'none'}"
    if functions:
        message += f"; functions it defines: {', '.join(functions)}"
    return message


def load_graph(graph_id: str, spec: str, project_dir: Path) -> LoadedGraph:
    value = resolve(spec, project_dir)
    if isinstance(value, Pregel):
        return LoadedGraph(graph_id, "compiled", value)
    if isinstance(value, StateGraph):
        return LoadedGraph(graph_id, "state_graph", value.compile())
    if callable(value):
        return LoadedGraph(graph_id, "factory", value, classify_factory(value))
    raise ValueError(f"{spec!r} is a {type(value).__name__}, not a graph, a StateGraph or a graph factory")


def load_all(specs: dict[str, str], project_dir: Path) -> tuple[Registry, dict[str, dict[str, Any]]]:
    """Load every graph; one that fails is reported and the others still load."""
    if str(project_dir) not in sys.path:
        sys.path.insert(0, str(project_dir))
    registry = Registry()
    report: dict[str, dict[str, Any]] = {}
    for graph_id, spec in specs.items():
        try:
            loaded = load_graph(graph_id, spec, project_dir)
        except BaseException as e:  # SystemExit from a module is a load failure too
            if isinstance(e, (KeyboardInterrupt, asyncio.CancelledError)):
                raise
            registry.failed[graph_id] = f"{type(e).__name__}: {e}"
            report[graph_id] = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(),
            }
            continue
        registry.graphs[graph_id] = loaded
        report[graph_id] = {"ok": True, "kind": loaded.kind}
        # The compiled graph's own name names its default assistant, as on LangGraph
        # Platform (a factory's graph is only made per run).
        name = getattr(loaded.value, "name", None) if loaded.kind != "factory" else None
        if isinstance(name, str) and name and name != "LangGraph":
            report[graph_id]["name"] = name
    return registry, report


# -- factories --------------------------------------------------------------------------


def _runtime_classes() -> tuple[Any, tuple[type, ...]]:
    from langgraph_sdk.runtime import ServerRuntime, _ExecutionRuntime, _ReadRuntime

    return ServerRuntime, (_ExecutionRuntime, _ReadRuntime)


def _is_runtime_annotation(annotation: Any) -> bool:
    server_runtime, classes = _runtime_classes()
    if annotation is inspect.Parameter.empty:
        return False
    if annotation is server_runtime:
        return True
    if isinstance(annotation, type):
        return issubclass(annotation, classes)
    if isinstance(annotation, str):
        return annotation.split("[")[0].strip() == "ServerRuntime"
    origin = typing.get_origin(annotation)
    if origin is server_runtime:
        return True
    args = typing.get_args(annotation)
    return bool(origin is not None and args and _is_runtime_annotation(args[0]))


def classify_factory(fn: Callable[..., Any]) -> Callable[[dict, Any], dict[str, Any]]:
    """How to call `fn`: a function from (config, runtime) to its keyword arguments."""
    params = list(inspect.signature(fn).parameters.values())
    server_runtime, _ = _runtime_classes()
    try:
        hints = typing.get_type_hints(fn, localns={"ServerRuntime": server_runtime})
    except Exception:
        hints = {}
    is_rt = [_is_runtime_annotation(hints.get(p.name, p.annotation)) for p in params]
    names = [p.name for p in params]
    if len(params) == 0:
        return lambda config, runtime: {}
    if len(params) == 1:
        return (lambda c, r: {names[0]: r}) if is_rt[0] else (lambda c, r: {names[0]: c})
    if len(params) == 2 and is_rt.count(True) == 1:
        rt, cfg = (names[0], names[1]) if is_rt[0] else (names[1], names[0])
        return lambda c, r: {rt: r, cfg: c}
    if len(params) == 2:
        raise ValueError(
            f"graph factory {fn.__name__} takes two parameters: one must be annotated "
            "ServerRuntime and the other is the config"
        )
    raise ValueError(f"graph factory {fn.__name__} must take 0, 1 or 2 parameters, not {len(params)}: {names}")


def _server_runtime(access_context: AccessContext, store: BaseStore | None, context: Any, user: Any) -> Any:
    from langgraph_sdk.runtime import _ExecutionRuntime, _ReadRuntime

    if access_context == "threads.create_run":
        return _ExecutionRuntime(
            access_context=access_context,
            user=user,
            store=store,
            context=copy.copy(context) if context is not None else None,
        )
    return _ReadRuntime(access_context=access_context, user=user, store=store)


@asynccontextmanager
async def _as_context(value: Any) -> AsyncIterator[Any]:
    """A factory's result as an async context: a CM stays open, a coroutine is awaited."""
    if hasattr(value, "__aenter__") and hasattr(value, "__aexit__"):
        async with value as inner:
            yield inner
    elif hasattr(value, "__enter__") and hasattr(value, "__exit__"):
        with value as inner:
            yield inner
    elif inspect.isawaitable(value):
        yield await value
    else:
        yield value


@asynccontextmanager
async def open_graph(
    loaded: LoadedGraph,
    config: dict[str, Any],
    *,
    checkpointer: BaseCheckpointSaver | None,
    store: BaseStore | None,
    access_context: AccessContext,
    context: Any = None,
) -> AsyncIterator[Pregel]:
    """The graph for one run or read, with Spindle's saver and store replacing its own."""
    value = loaded.value
    if loaded.kind == "factory":
        factory_config = copy.copy(config)
        configurable = dict(factory_config.get("configurable") or {})
        user = configurable.get("langgraph_auth_user")
        runtime = _server_runtime(access_context, store, context, user)
        configurable[CONFIG_KEY_RUNTIME] = runtime
        if checkpointer is not None:
            configurable.setdefault(CONFIG_KEY_CHECKPOINTER, checkpointer)
        configurable["__is_for_execution__"] = access_context == "threads.create_run"
        factory_config["configurable"] = configurable
        assert loaded.factory_args is not None
        value = value(**loaded.factory_args(factory_config, runtime))
    async with _as_context(value) as graph:
        if isinstance(graph, StateGraph):
            graph = graph.compile()
        if not isinstance(graph, Pregel):
            raise TypeError(f"graph {loaded.graph_id!r}: the factory gave a {type(graph).__name__}, not a graph")
        update: dict[str, Any] = {"checkpointer": checkpointer, "store": store}
        if graph.name == "LangGraph":
            update["name"] = loaded.graph_id
        yield graph.copy(update=update)
