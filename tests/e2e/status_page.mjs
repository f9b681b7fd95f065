// The status page in a real browser: Debian's chromium, headless, driven over the DevTools
// protocol by puppeteer-core. Run by status_page.sh, which starts the gateway and two fake
// backends in a private network namespace and passes them in the environment:
//   GATEWAY (base URL), CHROMIUM (binary), FAKE, FAKE_SCRIPT, FAKE_A_PORT, FAKE_A_PID (endpoint
//   "a", which this script kills and restarts), SCREENSHOT (where the picture goes).
// Each check has a deadline of 2 s after the event it is about; every step is bounded.
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.PULSE_NODE_MODULES, "noop.js"));
const puppeteer = require("puppeteer-core");

const gateway = process.env.GATEWAY;
const origin = new URL(gateway).origin;
const deadline = 2000;
const secret = "SECRET-PROMPT-TEXT-7781";
let failures = 0;
const t0 = Date.now();
const log = (m) => console.log(`[${((Date.now() - t0) / 1000).toFixed(2)} s] ${m}`);
function check(ok, what) {
  log((ok ? "ok   " : "FAIL ") + what);
  if (!ok) failures++;
}

// Waits (polling the page's DOM every 50 ms) until `fn` holds, at most `ms`; returns the time
// it took, or null.
async function within(page, ms, fn, ...args) {
  const start = Date.now();
  try {
    await page.waitForFunction(fn, { timeout: ms, polling: 50 }, ...args);
    return Date.now() - start;
  } catch {
    return null;
  }
}

// Sends a streamed Responses request and reads it to the end; resolves with the events' text.
async function respond(input, model = "qwen3.8-flash-next", extra = {}) {
  const r = await fetch(gateway + "/v1/responses", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model, input, stream: true, ...extra }),
    signal: AbortSignal.timeout(30000),
  });
  return { status: r.status, body: await r.text() };
}

const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-default-apps", "--disable-sync"],
  protocolTimeout: 20000,
});
let restarted = null;
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1400, height: 1000 });
  const consoleErrors = [];
  const foreign = [];
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") consoleErrors.push(m.text()); });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  page.on("request", (r) => { if (!r.url().startsWith(origin + "/") && !r.url().startsWith("data:")) foreign.push(r.url()); });
  page.on("requestfailed", (r) => consoleErrors.push("request failed: " + r.url() + " " + (r.failure()?.errorText ?? "")));

  const nav = await page.goto(gateway + "/", { waitUntil: "load", timeout: 10000 });
  check(nav.status() === 200, `GET / answers 200 (${nav.status()})`);
  const csp = nav.headers()["content-security-policy"] || "";
  check(csp.includes("default-src 'none'") && csp.includes("connect-src 'self'"), "the page forbids every other origin (CSP)");
  let took = await within(page, deadline, () => document.querySelectorAll('tr[data-endpoint][data-state="healthy"]').length === 3);
  check(took !== null, `the three endpoints shown healthy within 2 s of load (${took} ms)`);

  // The in-process decoder's engine report, after it served a request.
  const demo = await respond(`hello ${secret}`, "demo", { max_output_tokens: 8 });
  check(demo.status === 200, "the decoder served a request");
  const demoEnded = Date.now();
  took = await within(page, deadline, () => {
    const dts = [...document.querySelectorAll('tr[data-endpoint="local"] dt')];
    const value = (k) => dts.find((d) => d.textContent === k)?.nextElementSibling?.textContent;
    return Number(value("peak_batch")) >= 1 && /^\d+(\.\d)? (B|KiB|MiB)$/.test(value("checkpoint") || "") && value("checkpoint") !== "0 B";
  });
  check(took !== null && Date.now() - demoEnded <= deadline, `the decoder's engine report (batch, state and checkpoint memory) shown within 2 s (${took} ms)`);

  // A stream's phase: the fake holds its first chunk 2.5 s (prefill), then sends a word per 250 ms.
  const slowSent = Date.now();
  const slow = respond(`SLOW-ONE ${secret}`);
  took = await within(page, deadline, () => [...document.querySelectorAll("#live tr[data-phase]")].some((r) => r.dataset.phase === "prefilling" || r.dataset.phase === "waiting_head"));
  check(took !== null, `the stream shows as prefilling within 2 s of its request (${took} ms)`);
  took = await within(page, 2500 + deadline, () => [...document.querySelectorAll("#live tr[data-phase]")].some((r) => r.dataset.phase === "generating"));
  const firstToken = slowSent + 2500;
  check(took !== null && Date.now() - firstToken <= deadline, `it shows as generating within 2 s of its first token (${took === null ? "never" : Date.now() - firstToken + " ms after it"})`);
  const tokensShown = await page.evaluate(() => Number(document.querySelector("#live tr[data-phase] td[data-tokens]")?.textContent || 0));
  check(tokensShown >= 1, `tokens so far shown while it generates (${tokensShown})`);
  const slowDone = await slow;
  const slowEnded = Date.now();
  check(slowDone.status === 200 && slowDone.body.includes("response.completed"), "the slow stream completed");
  took = await within(page, deadline, () => !document.querySelector("#live tr[data-phase]") && document.querySelector('#recent tr[data-outcome="completed"]'));
  check(took !== null && Date.now() - slowEnded <= deadline, `it moves to recent requests, completed, within 2 s of its end (${took} ms)`);

  // A resume: endpoint a drops the stream after 4 deltas; b continues it.
  const resumed = await respond(`RESUME-ME ${secret}`);
  const resumedEnded = Date.now();
  check(resumed.status === 200 && resumed.body.includes("response.completed"), "the interrupted stream completed on the other endpoint");
  took = await within(page, deadline, () => document.querySelector('#recent tr[data-resumes="1"][data-outcome="completed"]'));
  check(took !== null && Date.now() - resumedEnded <= deadline, `the resume shows in recent requests within 2 s (${took} ms)`);
  // a was marked down by the drop; wait for it to be healthy again before the outage below.
  await within(page, 5000, () => document.querySelector('tr[data-endpoint="a"][data-state="healthy"]'));

  // An endpoint going down and coming back.
  process.kill(Number(process.env.FAKE_A_PID), "SIGKILL");
  const killedAt = Date.now();
  took = await within(page, deadline, () => document.querySelector('tr[data-endpoint="a"][data-state="down"]'));
  check(took !== null, `endpoint a shows down within 2 s of its kill (${took} ms)`);
  restarted = spawn(process.env.FAKE, ["--script", process.env.FAKE_SCRIPT, "--port", process.env.FAKE_A_PORT], { stdio: "ignore" });
  const restartedAt = Date.now();
  took = await within(page, 3000, () => document.querySelector('tr[data-endpoint="a"][data-state="healthy"]'));
  check(took !== null && Date.now() - restartedAt <= deadline + 1000, `endpoint a shows healthy again within 2 s of being ready (${took} ms after its restart, which takes ~0.1-1 s)`);
  log(`(a was down ${((restartedAt - killedAt) / 1000).toFixed(1)} s)`);

  // A few more requests, so the rate charts have something to draw, then the picture.
  for (let i = 0; i < 4; i++) await respond(`hello ${i} ${secret}`);
  await within(page, deadline, () => document.querySelectorAll('#recent tr[data-outcome="completed"]').length >= 6);
  const sparks = await page.evaluate(() => document.querySelectorAll("svg.spark path").length);
  check(sparks >= 2, `rate charts drawn (${sparks} sparklines)`);
  // The picture shows a stream in flight too.
  const last = respond(`SLOW-ONE ${secret}`);
  await within(page, 2500 + deadline, () => [...document.querySelectorAll("#live tr[data-phase]")].some((r) => r.dataset.phase === "generating"));
  await page.screenshot({ path: process.env.SCREENSHOT, fullPage: true });
  log(`screenshot: ${process.env.SCREENSHOT}`);
  check((await last).status === 200, "the last stream completed");

  // Nothing of a prompt anywhere on the page or in what it reads.
  const text = await page.evaluate(() => document.documentElement.outerHTML);
  const json = await (await fetch(gateway + "/status.json")).text();
  check(!text.includes(secret) && !json.includes(secret) && !json.includes("SLOW-ONE"), "no prompt text on the page or in /status.json");
  check(foreign.length === 0, `no request to any other origin (${foreign.join(", ") || "none"})`);
  check(consoleErrors.length === 0, `no console errors or warnings (${consoleErrors.join(" | ") || "none"})`);
} finally {
  await browser.close();
  if (restarted) restarted.kill("SIGKILL");
}
log(failures ? `${failures} check(s) failed` : "all checks passed");
process.exit(failures ? 1 : 0);
