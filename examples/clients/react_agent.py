"""Ask the agent of a project made from LangGraph's `react-agent` template, served by
`spindle dev` in the project's folder, and print its answer as the model streams it, with the
tools it calls. `SPINDLE_URL` names another server."""

import asyncio
import os

from langgraph_sdk import get_client


def text_of(message: dict) -> str:
    """A message's text: a string, or content blocks (as Anthropic's models stream them)."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content if isinstance(block, dict))


async def main() -> None:
    client = get_client(url=os.environ.get("SPINDLE_URL", "http://127.0.0.1:2024"))
    thread = await client.threads.create()
    question = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    async for chunk in client.runs.stream(
        thread["thread_id"], "agent", input=question, stream_mode="messages-tuple"
    ):
        if chunk.event != "messages":
            continue
        message, _metadata = chunk.data
        if message["type"] == "tool":
            print(f"\n[{message['name']}: {text_of(message)}]")
            continue
        for call in message.get("tool_call_chunks") or []:
            if call.get("name"):
                print(f"[calls {call['name']}]")
        print(text_of(message), end="", flush=True)
    print()


asyncio.run(main())
