// Streams one run of the `slow` example graph with `streamResumable` through the official JS
// client and prints each event as a JSON line ({id, event, data}) as it arrives. Driven by
// tests/e2e/test_stream_reconnect.py, which cuts the stream mid-run (SIGTERM to the server)
// and checks that the client reconnected and got every event of the run exactly once.
//
//   SPINDLE_URL=http://127.0.0.1:2024 node stream_resumable.mjs <thread_id> <delay_ms>
import { Client } from "@langchain/langgraph-sdk";

const [threadId, delayMs] = process.argv.slice(2);
const client = new Client({ apiUrl: process.env.SPINDLE_URL });
for await (const part of client.runs.stream(threadId, "slow", {
  input: { delay_ms: Number(delayMs) },
  streamMode: ["values", "custom"],
  streamResumable: true,
})) {
  process.stdout.write(JSON.stringify(part) + "\n");
}
