"""A graph named by module path (`extra_pkg.graphs:graph`)."""

from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class S(TypedDict):
    n: int


graph = StateGraph(S).add_node("double", lambda s: {"n": s["n"] * 2}).add_edge(START, "double").add_edge("double", END).compile()
not_a_graph = 42
