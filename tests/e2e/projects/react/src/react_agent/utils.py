"""Utility & helper functions."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Iterator, Sequence

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool


def get_message_text(msg: BaseMessage) -> str:
    """Get the text content of a message."""
    content = msg.content
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return content.get("text", "")
    txts = [c if isinstance(c, str) else (c.get("text") or "") for c in content]
    return "".join(txts).strip()


class ScriptedChatModel(GenericFakeChatModel):
    """LangChain's generic fake chat model, made to call tools.

    Stateless, so one instance serves every run: the answer depends only on the
    conversation. A human message is answered with one tool call (get_weather, or
    save_memory for "remember that ..."); a tool result with a final text that repeats
    it, plus the user's memories found in the system prompt. Text streams word by word
    (the parent's `_stream`); a tool call streams as two tool-call chunks.
    """

    messages: Iterator[AIMessage | str] = iter(())

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any):  # type: ignore[override]
        """Bind tools as OpenAI-style schemas; `_generate` only calls tools bound here."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        bound = {t["function"]["name"] for t in kwargs.get("tools") or []}
        last = messages[-1]
        if isinstance(last, ToolMessage):
            answer = get_message_text(last)
            facts = _memories(messages)
            if facts and last.name == "get_weather":
                answer += " You told me: " + "; ".join(facts) + "."
            message = AIMessage(content=answer)
        elif isinstance(last, HumanMessage):
            text = get_message_text(last).strip()
            m = re.match(r"(?i)remember that (.+)", text)
            if m:
                name, args = "save_memory", {"fact": m.group(1).strip().rstrip(".")}
            else:
                words = re.findall(r"[A-Za-z]+", text)
                name, args = "get_weather", {"city": words[-1] if words else "nowhere"}
            if name not in bound:
                raise ValueError(f"the model wants tool {name!r} but only {sorted(bound)} are bound")
            call = {"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "tool_call"}
            message = AIMessage(content="", tool_calls=[call])
        else:
            message = AIMessage(content="I have nothing to answer.")
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        message = self._generate(messages, stop=stop, **kwargs).generations[0].message
        if not getattr(message, "tool_calls", None):
            # Text: the parent splits it on whitespace (it calls _generate again, which
            # answers the same: the script is a function of the conversation).
            yield from super()._stream(messages, stop=stop, run_manager=run_manager, **kwargs)
            return
        for index, call in enumerate(message.tool_calls):
            args = json.dumps(call["args"])
            half = len(args) // 2
            parts = [
                {"name": call["name"], "args": args[:half], "id": call["id"], "index": index},
                {"name": None, "args": args[half:], "id": None, "index": index},
            ]
            for i, part in enumerate(parts):
                chunk = AIMessageChunk(content="", tool_call_chunks=[{**part, "type": "tool_call_chunk"}])
                if index == len(message.tool_calls) - 1 and i == len(parts) - 1:
                    chunk.chunk_position = "last"
                gen = ChatGenerationChunk(message=chunk)
                if run_manager:
                    run_manager.on_llm_new_token("", chunk=gen)
                yield gen

    @property
    def _llm_type(self) -> str:
        return "scripted-fake-chat-model"


def _memories(messages: list[BaseMessage]) -> list[str]:
    """The facts listed under "Memories about the user:" in the system prompt."""
    for m in messages:
        if isinstance(m, SystemMessage) or getattr(m, "type", "") == "system":
            text = get_message_text(m)
            block = text.split("Memories about the user:", 1)[-1].split("System time:", 1)[0]
            return [line[2:].strip() for line in block.splitlines() if line.startswith("- ")]
    return []


def load_chat_model(fully_specified_name: str) -> ScriptedChatModel:
    """Load a chat model from a fully specified name (provider/model); only fake/* here."""
    provider, _, model = fully_specified_name.partition("/")
    if provider != "fake":
        raise ValueError(f"this test project only has fake models, not {fully_specified_name!r}")
    return ScriptedChatModel()
