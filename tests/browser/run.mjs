// Opens the page given as the only argument in headless Chromium (Debian's, at
// /usr/bin/chromium, or $CHROMIUM) and waits up to 30 s for it to show an answer (#answer) or
// an error (#error). Prints one JSON object to stdout:
//   {answer, error, consoleErrors, failedRequests}
// where failedRequests lists requests that got no answer (network or CORS failures) and
// answers with an HTTP status of 400 or more. Exits 0 only when the page shows an answer and
// nothing failed; 1 otherwise (the JSON is printed all the same, except when the browser could
// not be started).
import { chromium } from "playwright-core";

const TIMEOUT_MS = 30_000;

const url = process.argv[2];
if (!url) {
  console.error("usage: node run.mjs PAGE_URL");
  process.exit(2);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  // CI runs as root, where Chromium's sandbox cannot start; a container's small /dev/shm can
  // crash its renderers.
  args: ["--no-sandbox", "--disable-dev-shm-usage"],
});

const report = { answer: "", error: "", consoleErrors: [], failedRequests: [] };
let ok = false;
try {
  const page = await browser.newPage();
  page.on("console", (msg) => {
    if (msg.type() === "error") report.consoleErrors.push(msg.text());
  });
  page.on("pageerror", (err) => report.consoleErrors.push(`uncaught: ${err.message}`));
  // Chromium at times reports a fetch whose streamed body the page read to its end as aborted
  // (net::ERR_ABORTED), whatever the server: not a failure. A cut stream fails otherwise
  // (e.g. net::ERR_INCOMPLETE_CHUNKED_ENCODING), and the page would not show the answer.
  const answered = new WeakSet();
  page.on("requestfailed", (req) => {
    const failure = req.failure()?.errorText;
    if (failure === "net::ERR_ABORTED" && answered.has(req)) return;
    report.failedRequests.push(`${req.method()} ${req.url()}: ${failure}`);
  });
  page.on("response", (res) => {
    if (res.status() >= 400) {
      report.failedRequests.push(`${res.request().method()} ${res.url()}: HTTP ${res.status()}`);
    } else {
      answered.add(res.request());
    }
  });

  await page.goto(url);
  try {
    await page.waitForFunction(
      () => document.getElementById("answer").textContent || document.getElementById("error").textContent,
      null,
      { timeout: TIMEOUT_MS },
    );
  } catch {
    report.error = `the page showed neither an answer nor an error within ${TIMEOUT_MS / 1000} s`;
  }
  report.answer = await page.locator("#answer").textContent();
  report.error ||= await page.locator("#error").textContent();
  ok = Boolean(report.answer) && !report.error &&
    report.consoleErrors.length === 0 && report.failedRequests.length === 0;
} catch (e) {
  report.error ||= `driver: ${e.message}`;
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
process.exit(ok ? 0 : 1);
