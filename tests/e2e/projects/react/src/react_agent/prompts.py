"""Default prompts used by the agent."""

SYSTEM_PROMPT = """You are a helpful AI assistant.

Memories about the user:
{memories}

System time: {system_time}"""
