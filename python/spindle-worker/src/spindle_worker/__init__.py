"""Runs LangGraph Python graphs for Spindle."""
