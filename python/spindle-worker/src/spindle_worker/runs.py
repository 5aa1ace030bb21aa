"""Executing runs: `run.start` / `run.cancel`, events out as `run.events`, end as `run.done`.

A run is executed as langgraph-api executes it: the graph is copied with Spindle's saver
and store in place of its own, then streamed with `astream` (or `astream_events` for the
`events` mode), each chunk named and JSON-encoded as the reference does.

The ordering rule. Before any checkpoint save of the run, the events LangGraph produced
before that save must be on the wire. LangGraph puts stream chunks in a queue that the
`astream` generator drains only when it next runs, while checkpoint saves run in their
own tasks (or, with `durability="sync"`, while the generator waits for them). So before
a save the run takes the chunks still waiting in that queue itself (`_catch_up`), in
order, turns them into events and flushes them; `astream` then simply finds them gone.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import langgraph.version
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt, Send

from .auth import wrap_auth_user
from .batching import EventBatcher
from .bridge import Callbacks
from .connection import Connection
from .errors import FencedError, RequestError, failed_node, find_fenced, summarize
from .jsonenc import dumpb, public_error
from .loader import Registry, open_graph
from .saver import SpindleSaver
from .store import SpindleStore
from .streaming import StreamTranslator, graph_stream_modes

log = logging.getLogger("spindle_worker")


def map_command(cmd: dict[str, Any]) -> Command:
    """The API's `{update?, goto?, resume?}` as a LangGraph Command."""
    goto = cmd.get("goto")
    if goto is not None and not isinstance(goto, list):
        goto = [goto]
    update = cmd.get("update")
    if isinstance(update, (list, tuple)) and all(
        isinstance(t, (list, tuple)) and len(t) == 2 and isinstance(t[0], str) for t in update
    ):
        update = [tuple(t) for t in update]
    return Command(
        update=update,
        goto=[g if isinstance(g, str) else Send(g["node"], g["input"]) for g in goto] if goto else None,
        resume=cmd.get("resume"),
    )


def patch_interrupt(i: Any) -> dict[str, Any]:
    """An interrupt as the API shows it: `{id, value}`."""
    if isinstance(i, dict):
        i = Interrupt(value=i.get("value"), id=i.get("id") or i.get("interrupt_id") or "")
    out = {"id": i.id, "value": i.value}
    if (schema := getattr(i, "response_schema", None)) is not None:
        out["response_schema"] = schema
    return out


def final_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """`{values, next, interrupts}` from a `checkpoints` payload (interrupts by task id)."""
    return {
        "values": checkpoint.get("values"),
        "next": list(checkpoint.get("next") or []),
        "interrupts": {
            t["id"]: [patch_interrupt(i) for i in t["interrupts"]]
            for t in checkpoint.get("tasks", [])
            if t.get("interrupts")
        },
    }


def filter_context(graph: Pregel, context: Any) -> Any:
    """Keep only the context keys the graph's context schema declares, as the reference."""
    if not context or not isinstance(context, dict):
        return context
    try:
        schema = graph.get_context_jsonschema()
    except Exception:
        return context
    props = (schema or {}).get("properties") or {}
    return {k: v for k, v in context.items() if k in props} if props else context


class Run:
    def __init__(
        self, conn: Connection, registry: Registry, body: dict[str, Any], release: Callable[[], None] = lambda: None
    ) -> None:
        self.conn = conn
        self.release = release  # gives the run's slot back (see send_done)
        self.registry = registry
        self.body = body
        self.ref: list[Any] = list(body["run"])
        self.run_id = str(self.ref[0])
        self.attempt = int(self.ref[1])
        self.fenced = False
        self.task: asyncio.Task[None] | None = None
        self.batcher = EventBatcher(self._send_events)
        stream_mode = body.get("stream_mode") or ["values"]
        self.stream_mode = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
        self.graph_modes, only_interrupts = graph_stream_modes(self.stream_mode)
        self.subgraphs = bool(body.get("subgraphs"))
        self.translator = StreamTranslator(self.stream_mode, self.subgraphs, only_interrupts)
        self._gen: Any = None  # the astream generator, whose queue _catch_up reads
        self.done_sent = False

    # -- callbacks wiring -------------------------------------------------------------------

    def _send_events(self, events: list[list[Any]]) -> None:
        if not self.fenced and not self.conn.closed:
            self.conn.send_event("run.events", {"run": self.ref, "events": events})

    def callbacks(self) -> Callbacks:
        return Callbacks(self.conn, self.ref, before_save=self.before_save, on_fenced=self.on_fenced)

    async def before_save(self) -> None:
        # One loop turn lands the chunks sent with call_soon_threadsafe (custom,
        # messages, subgraphs) that were scheduled before this save was.
        await asyncio.sleep(0)
        self._catch_up()
        self.batcher.flush()

    def _catch_up(self) -> None:
        frame = getattr(self._gen, "ag_frame", None)
        queue = frame.f_locals.get("stream") if frame is not None else None
        if not isinstance(queue, asyncio.Queue):
            if self._gen is not None and frame is not None:
                # A LangGraph whose astream keeps its chunks elsewhere: the tests
                # (test_ordering_rule_*) catch this; say it loudly in production too.
                log.warning("cannot reach LangGraph's stream queue: events may follow their save")
            return
        while True:
            try:
                ns, mode, chunk = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if mode in self.graph_modes:  # what astream's own output step keeps
                self._emit(ns, mode, chunk)

    def on_fenced(self, err: FencedError) -> None:
        if self.fenced:
            return
        log.info("run %s attempt %s fenced: %s", self.run_id, self.attempt, err.message)
        self.fenced = True
        self.batcher.close()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def _emit(self, ns: Any, mode: str, chunk: Any) -> None:
        for name, payload in self.translator.handle(tuple(ns) if ns else None, mode, chunk):
            self.batcher.add(name, dumpb(payload))

    # -- execution ----------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        config = dict(self.body.get("config") or {})
        config["configurable"] = dict(config.get("configurable") or {})
        wrap_auth_user(config["configurable"])
        metadata = dict(config.get("metadata") or {})
        metadata.setdefault("run_attempt", self.attempt)
        metadata.setdefault("langgraph_version", langgraph.version.__version__)
        config["metadata"] = metadata
        return config

    async def execute(self) -> None:
        status, error, tb, final = "success", None, None, None
        failure: BaseException | None = None
        try:
            final = await self._run_graph()
            if final is not None and final["next"]:
                status = "interrupted"
        except asyncio.CancelledError:
            if self.fenced:
                return
            status = "cancelled"
            final = self._final_from_stream()
        except BaseException as e:  # noqa: BLE001 - every failure of user code ends the run
            if self.fenced or find_fenced(e):
                self.on_fenced(find_fenced(e) or FencedError("fenced", "fenced"))
                return
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            status, error, failure = "error", public_error(e), e
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
            final = self._final_from_stream()
        if self.fenced or self.conn.closed:
            return
        self.batcher.flush()
        done: dict[str, Any] = {"run": self.ref, "status": status}
        if error is not None:
            done["error"] = error
            done["traceback"] = tb
            done["summary"] = summarize(failure) if failure is not None else None
            node = failed_node(failure)
            if node is not None:
                done["node"] = node
        if final is not None:
            done["final"] = dumpb(final)
        self.send_done(done)
        await self.conn.drain()

    def send_done(self, done: dict[str, Any]) -> None:
        if not self.done_sent and not self.fenced and not self.conn.closed:
            self.done_sent = True
            # The slot first: once Spindle reads run.done it may send the next run.start,
            # which must find the slot free even if this task has not finished yet.
            self.release()
            self.conn.send_event("run.done", done)

    def _final_from_stream(self) -> dict[str, Any] | None:
        cp = self.translator.final_checkpoint
        return final_state(cp) if cp is not None and self.body.get("checkpointer", True) else None

    async def _run_graph(self) -> dict[str, Any] | None:
        loaded = self.registry.get(self.body["graph_id"])
        with_saver = self.body.get("checkpointer", True)
        saver = SpindleSaver(self.callbacks()) if with_saver else None
        store = SpindleStore(self.callbacks())
        try:
            return await self._run_graph_with(loaded, saver, store)
        finally:
            await store.aclose()

    async def _run_graph_with(
        self, loaded: Any, saver: SpindleSaver | None, store: SpindleStore
    ) -> dict[str, Any] | None:
        with_saver = saver is not None
        config = self._config()
        context = self.body.get("context")
        async with open_graph(
            loaded, config, checkpointer=saver, store=store, access_context="threads.create_run", context=context
        ) as graph:
            context = filter_context(graph, context)
            command = self.body.get("command")
            graph_input = map_command(command) if command else self.body.get("input")
            kwargs: dict[str, Any] = {
                "subgraphs": self.subgraphs,
                "interrupt_before": self.body.get("interrupt_before"),
                "interrupt_after": self.body.get("interrupt_after"),
                "context": context,
            }
            if self.body.get("durability"):
                kwargs["durability"] = self.body["durability"]
            if "events" in self.stream_mode:
                await self._stream_events(graph, graph_input, config, kwargs)
            else:
                await self._stream(graph, graph_input, config, kwargs)
            if not with_saver:
                return None
            final = self._final_from_stream()
            if final is None or final["next"]:
                # Interrupted: a node's interrupt comes after the step's checkpoint, so it is
                # read back with the state. Or nothing new was saved (a resumed attempt).
                final = await self._final_from_state(graph, config) or final
            return final

    async def _stream(self, graph: Pregel, graph_input: Any, config: dict, kwargs: dict) -> None:
        self._gen = graph.astream(
            graph_input, config, stream_mode=self.graph_modes, output_keys=graph.output_channels, **kwargs
        )
        async with aclosing(self._gen) as stream:
            async for item in stream:
                ns, mode, chunk = item if self.subgraphs else (None, *item)
                self._emit(ns, mode, chunk)

    async def _stream_events(self, graph: Pregel, graph_input: Any, config: dict, kwargs: dict) -> None:
        # LangGraph's astream_events wraps astream in callbacks; its queue is not reachable,
        # so here the rule holds for events already received (see the protocol doc).
        events = graph.astream_events(graph_input, config, version="v2", stream_mode=self.graph_modes, **kwargs)
        async with aclosing(events) as stream:
            async for event in stream:
                if "langsmith:hidden" in (event.get("tags") or []):
                    continue
                if event["event"] == "on_chain_stream" and event.get("run_id") == self.run_id:
                    data = event["data"]["chunk"]
                    ns, mode, chunk = data if self.subgraphs else (None, *data)
                    self._emit(ns, mode, chunk)
                elif "events" in self.stream_mode:
                    self.batcher.add("events", dumpb(event))

    async def _final_from_state(self, graph: Pregel, config: dict) -> dict[str, Any] | None:
        """The thread's state as the run left it, read back through the run's saver."""
        conf = {k: v for k, v in config["configurable"].items() if k != "checkpoint_id"}
        state = await graph.aget_state({**config, "configurable": conf})
        if state.config is None:
            return None
        return {
            "values": state.values,
            "next": list(state.next),
            "interrupts": {t.id: [patch_interrupt(i) for i in t.interrupts] for t in state.tasks if t.interrupts},
        }


class RunManager:
    def __init__(self, conn: Connection, registry: Registry, max_runs: int) -> None:
        self.conn = conn
        self.registry = registry
        self.max_runs = max_runs
        self.runs: dict[tuple[str, int], Run] = {}

    async def start(self, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("run"), (list, tuple)) or len(body["run"]) != 2:
            raise RequestError("bad_request", "run.start needs `run: [run_id, attempt]`")
        if not body.get("graph_id"):
            raise RequestError("bad_request", "run.start needs `graph_id`")
        self.registry.get(body["graph_id"])  # not_found now rather than in run.done
        key = (str(body["run"][0]), int(body["run"][1]))
        if key in self.runs:
            raise RequestError("conflict", f"run {key[0]} attempt {key[1]} is already running here")
        if len(self.runs) >= self.max_runs:
            raise RequestError("conflict", f"worker is full ({self.max_runs} runs)", retryable=True)
        run = Run(self.conn, self.registry, body, release=lambda: self.runs.pop(key, None))
        self.runs[key] = run
        run.task = asyncio.create_task(run.execute(), name=f"run {key[0]}#{key[1]}")
        run.task.add_done_callback(lambda t: self._finished(key, t))

    def _finished(self, key: tuple[str, int], task: asyncio.Task[None]) -> None:
        run = self.runs.pop(key, None)  # still here unless its run.done was sent
        if task.cancelled() and run is not None:
            # Cancelled before its first step: execute() never ran to say so.
            run.batcher.flush()
            run.send_done({"run": run.ref, "status": "cancelled"})
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("run %s#%s crashed in the worker: %r", key[0], key[1], exc)

    async def cancel(self, body: Any) -> None:
        ref = (body or {}).get("run") or []
        if len(ref) != 2:
            raise RequestError("bad_request", "run.cancel needs `run: [run_id, attempt]`")
        run = self.runs.get((str(ref[0]), int(ref[1])))
        if run is None:
            raise RequestError("not_found", f"run {ref[0]} attempt {ref[1]} is not running here")
        if run.task is not None:
            run.task.cancel()

    @property
    def active(self) -> int:
        return len(self.runs)
