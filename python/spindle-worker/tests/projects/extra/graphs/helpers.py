"""A sibling module: graphs next to it import it as `helpers`, as under `langgraph dev`."""

SUFFIX = "!"
