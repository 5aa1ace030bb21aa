"""A first session with `spindle dev` and its example graphs (README, "A first request").
`SPINDLE_URL` names another server."""

import asyncio
import os

from langgraph_sdk import get_client

async def main():
    client = get_client(url=os.environ.get("SPINDLE_URL", "http://127.0.0.1:2024"))
    thread = await client.threads.create(metadata={"user": "ada"})
    async for part in client.runs.stream(thread["thread_id"], "echo",
                                         input={"messages": [{"role": "user", "content": "hi"}]},
                                         stream_mode="updates"):
        print(part.event, part.data)
    print(await client.runs.wait(thread["thread_id"], "chain", input={"n": 1}))   # {'n': 4}

    # A graph that asks a human: the run stops at the interrupt; a Command resumes it.
    t = (await client.threads.create())["thread_id"]
    print(await client.runs.wait(t, "approval", input={"messages": [{"role": "user", "content": "deploy?"}]}))
    print(await client.runs.wait(t, "approval", command={"resume": "yes"}))

    # Assistants are versioned configurations of a graph.
    assistant = await client.assistants.create(graph_id="echo", name="my echo")
    assistant = await client.assistants.update(assistant["assistant_id"], metadata={"team": "a"})
    print(assistant["version"])                                                  # 2

asyncio.run(main())
