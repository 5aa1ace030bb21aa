"""LangGraph's custom auth in the worker (`auth.authenticate`, `auth.authorize`), in process:
the handler a request reaches, what its answers and exceptions become, and users normalized
as LangGraph Platform normalizes them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_async

from spindle_worker.custom_auth import CustomAuth, load_auth, normalize_user

AUTH_FILE = '''
from langgraph_sdk import Auth

auth = Auth()


@auth.authenticate
async def authenticate(authorization: str | None, path: str, method: str):
    if authorization == "Bearer boom":
        raise RuntimeError("the identity provider is down")
    if authorization != "Bearer good":
        raise Auth.exceptions.HTTPException(status_code=401, detail="bad token")
    return {"identity": "ann", "org": "acme", "seen": [method, path]}


@auth.on
async def anything(ctx, value):
    return {"org": ctx.user.org}


@auth.on.threads
async def threads(ctx, value):
    return {"owner": ctx.user.identity}


@auth.on.threads.create
async def create(ctx, value):
    value.setdefault("metadata", {})["owner"] = ctx.user.identity


@auth.on.threads.delete
async def delete(ctx, value):
    return False


@auth.on.store.put
async def put(ctx, value):
    assert value["namespace"][0] == ctx.user.identity, "your own namespace only"
'''


@pytest.fixture
def custom(tmp_path: Path) -> CustomAuth:
    (tmp_path / "auth.py").write_text(AUTH_FILE)
    return CustomAuth(load_auth("./auth.py:auth", tmp_path))


def request(token: str) -> dict:
    return {"method": "POST", "path": "/threads", "headers": [["authorization", f"Bearer {token}"]]}


@run_async
async def test_authenticate_answers_the_user_or_the_handlers_refusal(custom: CustomAuth) -> None:
    ok = await custom.authenticate(request("good"))
    assert ok == {"ok": True, "user": {"identity": "ann", "org": "acme", "seen": ["POST", "/threads"],
                                       "display_name": "ann", "is_authenticated": True, "permissions": []}}
    assert await custom.authenticate(request("bad")) == {"ok": False, "status": 401, "detail": "bad token"}
    boom = await custom.authenticate(request("boom"))
    assert boom["status"] == 500 and "identity provider is down" in boom["detail"]


@run_async
async def test_the_most_specific_handler_answers(custom: CustomAuth) -> None:
    user = {"identity": "ann", "org": "acme", "permissions": []}

    async def ask(resource: str, action: str, value: dict) -> dict:
        return await custom.authorize({"resource": resource, "action": action, "user": user, "value": value})

    assert (await ask("threads", "read", {}))["filters"] == {"owner": "ann"}
    assert (await ask("assistants", "read", {}))["filters"] == {"org": "acme"}
    created = await ask("threads", "create", {"metadata": {"a": 1}})
    assert created == {"ok": True, "filters": None, "value": {"metadata": {"a": 1, "owner": "ann"}}}
    assert await ask("threads", "delete", {}) == {"ok": False, "status": 403, "detail": "Forbidden"}
    assert await ask("store", "put", {"namespace": ["bob"]}) == {
        "ok": False, "status": 403, "detail": "your own namespace only"}
    assert (await ask("store", "put", {"namespace": ["ann"]}))["ok"] is True


def test_users_are_normalized_as_langgraph_does() -> None:
    class User:
        identity = "cal"
        display_name = "Cal"
        permissions = ["read"]

    assert normalize_user("ann") == {"identity": "ann", "display_name": "ann", "is_authenticated": True,
                                     "permissions": []}
    assert normalize_user(User())["display_name"] == "Cal"
    assert normalize_user((["write"], {"identity": "dee"}))["permissions"] == ["write"]
    with pytest.raises(ValueError):
        normalize_user({"name": "no identity"})


def test_an_auth_without_authenticate_or_of_another_type_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from langgraph_sdk import Auth\nauth = Auth()\nnot_auth = 1\n")
    with pytest.raises(ValueError, match="no @auth.authenticate"):
        load_auth("./a.py:auth", tmp_path)
    with pytest.raises(ValueError, match="not a langgraph_sdk Auth"):
        load_auth("./a.py:not_auth", tmp_path)
