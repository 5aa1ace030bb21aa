"""A graph named by module path (`extra_pkg.graphs:graph`)."""

from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class S(TypedDict):
    n: int


graph = (
    StateGraph(S)
    .add_node("double", lambda s: {"n": s["n"] * 2})
    .add_edge(START, "double")
    .add_edge("double", END)
    .compile(name="Doubler")
)
not_a_graph = 42


# typing_extensions.TypedDict: pydantic builds JSON Schemas from it on every Python
# (typing.TypedDict only from 3.12), so the schema tests do not depend on the version.
from dataclasses import dataclass  # noqa: E402

from typing_extensions import TypedDict as TETypedDict  # noqa: E402


class Doc(TETypedDict):
    title: str
    words: int


@dataclass
class Ctx:
    user: str = "anon"


def _count(state: Doc) -> dict:
    return {"words": len(state["title"].split())}


schema_graph = (
    StateGraph(Doc, context_schema=Ctx).add_node("count", _count).add_edge(START, "count").add_edge("count", END).compile()
)
