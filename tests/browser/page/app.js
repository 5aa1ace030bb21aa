// A web app using the official JS client in the browser: it asks the `agent` example graph
// a question through the Spindle named by the page's query string
// (?apiUrl=http://127.0.0.1:2024&apiKey=...), and shows the answer in #answer, or what went
// wrong in #error. Bundled for the browser by `npm run build` (into dist/app.js).
import { Client } from "@langchain/langgraph-sdk";

const QUESTION = "What is 2 + 3?";

const params = new URLSearchParams(window.location.search);
const show = (id, text) => {
  document.getElementById(id).textContent = text;
};

async function ask() {
  const client = new Client({ apiUrl: params.get("apiUrl"), apiKey: params.get("apiKey") });
  const thread = await client.threads.create();
  show("status", `thread ${thread.thread_id}: running`);
  let messages = [];
  for await (const part of client.runs.stream(thread.thread_id, "agent", {
    input: { messages: [{ role: "user", content: QUESTION }] },
    streamMode: "values",
  })) {
    // A run that fails mid-stream ends with an `error` event instead of rejecting.
    if (part.event === "error") {
      throw new Error(`run failed: ${JSON.stringify(part.data)}`);
    }
    if (part.event === "values") {
      messages = part.data.messages;
    }
  }
  const last = messages[messages.length - 1];
  if (last?.type !== "ai") {
    throw new Error(`the run ended without an answer: ${JSON.stringify(last)}`);
  }
  return last.content;
}

ask().then(
  (answer) => {
    show("status", "done");
    show("answer", answer);
  },
  (error) => {
    show("status", "failed");
    show("error", String(error?.message ?? error));
  },
);
