"""Run the graph of a project made from LangGraph's `new-langgraph-project` template, served
by `spindle dev` in the project's folder: its state is one field, `changeme` (no `messages`),
and its context takes `my_configurable_param`. `SPINDLE_URL` names another server."""

import asyncio
import os

from langgraph_sdk import get_client


async def main() -> None:
    client = get_client(url=os.environ.get("SPINDLE_URL", "http://127.0.0.1:2024"))
    thread = await client.threads.create()
    async for chunk in client.runs.stream(
        thread["thread_id"],
        "agent",
        input={"changeme": "hello"},
        context={"my_configurable_param": "from the client"},
        stream_mode="updates",
    ):
        print(chunk.event, chunk.data)
    state = await client.threads.get_state(thread["thread_id"])
    print("state:", state["values"])


asyncio.run(main())
