"""LangGraph's custom auth (`auth.path` in langgraph.json), run as LangGraph Platform runs it.

Spindle asks a worker two things per request, as `auth.authenticate` and `auth.authorize`:

- who the caller is: the `@auth.authenticate` handler, called with the parameters it names
  (`headers`, `authorization`, `method`, `path`, `query_params`, `path_params`, `request`,
  `scopes`, `scope`), its answer normalized as LangGraph does (a string is the identity; a map
  or an object has `identity`, and may have `display_name`, `is_authenticated`,
  `permissions`; a `(permissions, user)` pair);
- whether the caller may do an action: the most specific `@auth.on` handler (resource and
  action, resource, action, any, then the global ones), called with `ctx` and `value`; None or
  True allow, False or an AssertionError refuse (403), a map is a filter on the resources'
  metadata, and what the handler wrote into `value` is sent back for Spindle to use.

An `Auth.exceptions.HTTPException` from either is answered with its status and detail. The
answers are plain maps: `{ok: true, ...}` or `{ok: false, status, detail}`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from langgraph_sdk import Auth

from .auth import AuthUser
from .errors import RequestError
from .loader import resolve

log = logging.getLogger("spindle_worker.auth")

# What an authenticate handler may ask for, as LangGraph Platform passes them.
SUPPORTED = {"request", "headers", "authorization", "method", "path", "query_params",
             "path_params", "scopes", "scope", "user", "body"}


def load_auth(spec: str, project_dir: Path) -> Auth:
    """The `Auth` object at `./file.py:name` or `package.module:name`."""
    auth = resolve(spec, project_dir)
    if not isinstance(auth, Auth):
        raise ValueError(f"{spec} is not a langgraph_sdk Auth object (got {type(auth).__name__})")
    if auth._authenticate_handler is None:
        raise ValueError(f"{spec} has no @auth.authenticate handler")
    return auth


class Request:
    """What a handler asking for `request` reads of it (Starlette's names)."""

    def __init__(self, method: str, path: str, headers: dict[str, str], query: dict[str, str],
                 path_params: dict[str, str]) -> None:
        self.method = method
        self.headers = headers
        self.query_params = query
        self.path_params = path_params
        self.url = _Url(path)


class _Url:
    def __init__(self, path: str) -> None:
        self.path = path

    def __str__(self) -> str:
        return self.path


def refused(status: int, detail: str) -> dict[str, Any]:
    return {"ok": False, "status": status, "detail": detail}


class CustomAuth:
    def __init__(self, auth: Auth) -> None:
        self.auth = auth
        handler = auth._authenticate_handler
        self.params = named_params(handler)
        self.authenticate_handler = handler

    async def authenticate(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise RequestError("bad_request", "auth.authenticate needs a map")
        headers = {str(k).lower(): str(v) for k, v in body.get("headers") or []}
        query = dict(parse_qsl(str(body.get("query") or ""), keep_blank_values=True))
        path_params = dict(body.get("path_params") or {})
        method, path = str(body.get("method", "GET")), str(body.get("path", "/"))
        available = {
            "request": lambda: Request(method, path, headers, query, path_params),
            "headers": lambda: {k.encode(): v.encode() for k, v in headers.items()},
            "authorization": lambda: headers.get("authorization"),
            "method": lambda: method,
            "path": lambda: path,
            "query_params": lambda: query,
            "path_params": lambda: path_params,
            "scopes": lambda: [],
            "scope": lambda: {"type": "http", "method": method, "path": path},
            "user": lambda: None,
            "body": lambda: None,
        }
        args = {name: available[name]() for name in self.params}
        try:
            answer = self.authenticate_handler(**args)
            if inspect.isawaitable(answer):
                answer = await answer
            return {"ok": True, "user": normalize_user(answer)}
        except Auth.exceptions.HTTPException as e:
            return refused(e.status_code, str(e.detail))
        except Exception as e:  # the handler's own fault (a 500, as on LangGraph Platform)
            log.exception("the @auth.authenticate handler raised")
            return refused(500, f"authentication failed: {type(e).__name__}: {e}")

    async def authorize(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise RequestError("bad_request", "auth.authorize needs a map")
        resource, action = str(body.get("resource")), str(body.get("action"))
        handler = self.handler_for(resource, action)
        value = body.get("value") if isinstance(body.get("value"), dict) else {}
        if handler is None:
            return {"ok": True, "filters": None, "value": value}
        user = AuthUser(body.get("user") or {})
        ctx = Auth.types.AuthContext(permissions=list(user.permissions), user=user,
                                     resource=resource, action=action)
        try:
            result = await handler(ctx=ctx, value=value)
        except Auth.exceptions.HTTPException as e:
            return refused(e.status_code, str(e.detail))
        except AssertionError as e:
            return refused(403, str(e) or "Forbidden")
        except Exception as e:
            log.exception("the @auth.on handler for %s.%s raised", resource, action)
            return refused(500, f"authorization failed: {type(e).__name__}: {e}")
        if result is None or result is True:
            return {"ok": True, "filters": None, "value": value}
        if result is False:
            return refused(403, "Forbidden")
        if not isinstance(result, dict):
            return refused(500, f"the @auth.on handler for {resource}.{action} answered "
                                f"{type(result).__name__}; expected a filter map, None or a bool")
        return {"ok": True, "filters": result, "value": value}

    def handler_for(self, resource: str, action: str) -> Callable[..., Any] | None:
        """LangGraph's precedence: the most specific handler, the last one registered."""
        handlers = self.auth._handlers
        for key in [(resource, action), (resource, "*"), ("*", action), ("*", "*")]:
            if key in handlers and handlers[key]:
                return handlers[key][-1]
        if self.auth._global_handlers:
            return self.auth._global_handlers[-1]
        return None


def named_params(fn: Callable[..., Any]) -> set[str]:
    """The parameters `fn` takes of those LangGraph passes; one it requires but LangGraph does
    not pass is an error at load time, as on LangGraph Platform."""
    sig = inspect.signature(fn)
    unsupported = [n for n, p in sig.parameters.items() if n not in SUPPORTED and p.default is p.empty]
    if unsupported:
        raise ValueError(f"@auth.authenticate handler has unsupported required parameters: "
                         f"{', '.join(unsupported)}; supported: {', '.join(sorted(SUPPORTED))}")
    return {n for n in sig.parameters if n in SUPPORTED}


def normalize_user(answer: Any) -> dict[str, Any]:
    """The handler's answer as the map Spindle keeps (`MinimalUserDict` and extra fields)."""
    permissions: Any = None
    if isinstance(answer, tuple):
        if len(answer) != 2:
            raise ValueError(f"expected (permissions, user), got a tuple of {len(answer)}")
        permissions, answer = answer
    if isinstance(answer, str):
        user: dict[str, Any] = {"identity": answer}
    elif isinstance(answer, dict):
        user = dict(answer)
    elif hasattr(answer, "identity"):
        dump = getattr(answer, "model_dump", None) or getattr(answer, "dict", None)
        user = dict(dump()) if callable(dump) else {}
        for key in ("identity", "display_name", "is_authenticated", "permissions"):
            if hasattr(answer, key):
                user[key] = getattr(answer, key)
    else:
        raise ValueError(f"the user must be a string, a map or an object with `identity`; got {type(answer).__name__}")
    if not user.get("identity"):
        raise ValueError("the user has no identity")
    user["identity"] = str(user["identity"])
    user.setdefault("display_name", user["identity"])
    user.setdefault("is_authenticated", True)
    if permissions is not None:
        user["permissions"] = list(permissions)
    user["permissions"] = [str(p) for p in user.get("permissions") or []]
    return user
