// The official JS client against a running Spindle (SPINDLE_URL): it streams one run, and
// interrupts and resumes another. Run by tests/e2e/test_js_client.py with node's test runner.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";

const client = new Client({ apiUrl: process.env.SPINDLE_URL });

test("streams a run: metadata first, then values ending with the echo", async () => {
  const thread = await client.threads.create();
  const events = [];
  for await (const part of client.runs.stream(thread.thread_id, "echo", {
    input: { messages: [{ role: "user", content: "hi from js" }] },
    streamMode: ["values"],
  })) {
    events.push(part);
  }
  assert.equal(events[0].event, "metadata");
  const values = events.filter((e) => e.event === "values").map((e) => e.data);
  const last = values[values.length - 1].messages;
  assert.equal(last[last.length - 1].content, "echo: hi from js");
});

test("interrupts a run and resumes it with a command", async () => {
  const thread = await client.threads.create();
  const first = await client.runs.wait(thread.thread_id, "approval", {
    input: { messages: [{ role: "user", content: "ship it?" }] },
  });
  assert.deepEqual(first.__interrupt__[0].value, { question: "approve?" });
  const state = await client.threads.get(thread.thread_id);
  assert.equal(state.status, "interrupted");
  const second = await client.runs.wait(thread.thread_id, "approval", { command: { resume: "yes" } });
  const messages = second.messages;
  assert.equal(messages[messages.length - 1].content, "decision: yes");
  assert.equal((await client.threads.get(thread.thread_id)).status, "idle");
});
