"""Define the configurable parameters for the agent."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from react_agent import prompts


@dataclass(kw_only=True)
class Context:
    """The context for the agent."""

    system_prompt: str = field(
        default=prompts.SYSTEM_PROMPT,
        metadata={"description": "The system prompt to use for the agent's interactions."},
    )

    model: str = field(
        default="fake/scripted",
        metadata={"description": "The name of the language model to use, provider/model-name."},
    )

    user_id: str = field(
        default="default-user",
        metadata={"description": "Whose long-term memories the agent reads and writes."},
    )

    def __post_init__(self) -> None:
        """Fetch env vars for attributes that were not passed as args."""
        for f in fields(self):
            if not f.init:
                continue
            if getattr(self, f.name) == f.default:
                setattr(self, f.name, os.environ.get(f.name.upper(), f.default))
