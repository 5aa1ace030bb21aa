// The official JS client against Spindle serving LangGraph Python projects unchanged: the
// react-agent project (SPINDLE_REACT_URL) streams its tokens, the new-langgraph-project
// template (SPINDLE_TEMPLATE_URL) answers a wait with its context. Run by
// tests/e2e/test_python_projects.py with node's test runner.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";

const react = new Client({ apiUrl: process.env.SPINDLE_REACT_URL });
const template = new Client({ apiUrl: process.env.SPINDLE_TEMPLATE_URL });

test("streams the ReAct agent: tool call, then the answer token by token", async () => {
  const thread = await react.threads.create();
  const parts = [];
  for await (const part of react.runs.stream(thread.thread_id, "agent", {
    input: { messages: [{ role: "user", content: "What is the weather in Paris?" }] },
    context: { user_id: `js-${Date.now()}` },
    streamMode: ["messages-tuple", "updates"],
  })) {
    parts.push(part);
  }
  assert.equal(parts[0].event, "metadata");
  const updates = parts.filter((p) => p.event === "updates").map((p) => Object.keys(p.data)[0]);
  assert.deepEqual(updates, ["call_model", "tools", "call_model"]);

  const tuples = parts.filter((p) => p.event === "messages").map((p) => p.data);
  const aiChunks = tuples.filter(([m]) => m.type === "AIMessageChunk");
  const ids = [...new Set(aiChunks.map(([m]) => m.id))];
  assert.equal(ids.length, 2);
  const answer = aiChunks.filter(([m]) => m.id === ids[1]);
  assert.ok(answer.length > 1, "the answer streams in several chunks");
  assert.equal(answer.map(([m]) => m.content).join(""), "It is sunny in Paris.");
  assert.ok(answer.every(([, meta]) => meta.langgraph_node === "call_model"));

  const state = await react.threads.getState(thread.thread_id);
  const messages = state.values.messages;
  assert.deepEqual(messages.map((m) => m.type), ["human", "ai", "tool", "ai"]);
  assert.equal(messages[1].tool_calls[0].name, "get_weather");
  assert.equal(messages[3].content, "It is sunny in Paris.");
});

test("waits for the template graph with a context", async () => {
  const thread = await template.threads.create();
  const out = await template.runs.wait(thread.thread_id, "agent", {
    input: { changeme: "from js" },
    context: { my_configurable_param: "js-context" },
  });
  assert.deepEqual(out, {
    changeme: "Hello from .env: output from call_model (input 'from js'). Configured with js-context",
  });
  const got = await template.threads.get(thread.thread_id);
  assert.equal(got.status, "idle");
  assert.deepEqual(got.values, out);
});
