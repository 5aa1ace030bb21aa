"""Errors that cross the protocol boundary."""

from __future__ import annotations

import re
from typing import Any

# The note LangGraph adds to an exception for each task it passes through, innermost first.
_TASK_NOTE = re.compile(r"^During task with name '(.+)' and id '[^']*'$")


def failed_node(exc: BaseException | None) -> str | None:
    """The top-level node whose task raised `exc`, for the run-failed log line (as Spindle's
    engine names its failed task): the last of LangGraph's task notes."""
    notes = getattr(exc, "__notes__", None) or ()
    names = [m.group(1) for note in notes if (m := _TASK_NOTE.match(note))]
    return names[-1] if names else None


# A log line's summary of a failure is cut here: a message may be as long as a document.
_SUMMARY_LIMIT = 2000


def summarize(exc: BaseException) -> str:
    """What an operator reads first about a failed run: the exception's class and message,
    then what it came from (`raise ... from`, or an exception raised while handling another),
    each on the same line: `APIConnectionError: Connection error., caused by ConnectError:
    [Errno -2] Name or service not known`. A traceback's own order puts the first cause on
    top and the run's error at the bottom of many lines."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(_one_line(current))
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    summary = ", caused by ".join(parts)
    return summary if len(summary) <= _SUMMARY_LIMIT else summary[: _SUMMARY_LIMIT - 1] + "…"


def _one_line(exc: BaseException) -> str:
    # The class's own name, as the run's `error` names it (a project file's module is named
    # after its path, which says nothing).
    name = type(exc).__name__
    message = " ".join(str(exc).split())
    return f"{name}: {message}" if message else name


class RemoteError(Exception):
    """An `err` reply from the other side: `{code, message, retryable}`."""

    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable

    @classmethod
    def from_body(cls, body: Any) -> RemoteError:
        body = body if isinstance(body, dict) else {}
        code = str(body.get("code", "internal"))
        cls_ = FencedError if code == "fenced" else cls
        return cls_(code, str(body.get("message", "")), bool(body.get("retryable", False)))


class FencedError(RemoteError):
    """Spindle says the run attempt a call belongs to is no longer the live one.

    The worker stops that run without sending anything more for it.
    """


class RequestError(Exception):
    """Raised by a request handler to answer `err` with a chosen code."""

    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


class ConnectionClosed(Exception):
    """The socket to Spindle closed while a request was waiting for its reply."""


def find_fenced(exc: BaseException | None) -> FencedError | None:
    """The FencedError behind `exc`, through causes, contexts and exception groups.

    LangGraph may wrap a saver's exception (a background checkpoint put failing is
    re-raised later, sometimes chained), so a fence is looked for along the whole chain.
    """
    seen: set[int] = set()
    stack: list[BaseException] = [exc] if exc is not None else []
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, FencedError):
            return e
        # Exception groups (3.11+) carry their members in `.exceptions`.
        members = getattr(e, "exceptions", None)
        if isinstance(members, (list, tuple)):
            stack.extend(m for m in members if isinstance(m, BaseException))
        for nxt in (e.__cause__, e.__context__):
            if nxt is not None:
                stack.append(nxt)
    return None
