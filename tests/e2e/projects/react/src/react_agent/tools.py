"""Tools the agent can call: plain Python functions, as in the react-agent template."""

from __future__ import annotations

import uuid
from typing import Any, Callable, List

from langgraph.config import get_store
from langgraph.runtime import get_runtime

from react_agent.context import Context


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny in {city}."


async def save_memory(fact: str) -> str:
    """Remember a fact about the user, in the long-term store."""
    user_id = get_runtime(Context).context.user_id
    key = uuid.uuid4().hex
    await get_store().aput(("memories", user_id), key, {"fact": fact})
    return f"Saved: {fact}"


TOOLS: List[Callable[..., Any]] = [get_weather, save_memory]
