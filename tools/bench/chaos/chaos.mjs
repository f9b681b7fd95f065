// A seeded chaos soak: real llama-servers and fake vLLM servers behind fault-injecting proxies,
// `pulse serve` in front of them, conversations of Codex-shaped traffic through the openai SDK,
// a storm of faults drawn from the seed, and every turn's invariants checked (tools/bench/chaos/
// README.md says what runs and what is checked; `run` is the entry point).
//
// usage: node chaos.mjs --pulse EXE --plugins DIR --fake EXE --make-synthetic EXE
//          --llama-server EXE --template FILE --node-modules DIR --out DIR
//          [--seed N] [--duration S] [--conversations C] [--fault-every S] [--max-hold S]
//          [--small-disk DIR]
// Exit 0: every invariant held and no turn was lost; 1: not (the report says which); 2: usage
// or set-up failure.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { FakeServer, Gateway, LlamaServer, freePort, processAlive, sleep, started } from './cluster.mjs';
import { FaultProxy } from './proxy.mjs';
import { KINDS, mulberry32, storm } from './faults.mjs';
import { Conversation, answerOf, loadSdk } from './traffic.mjs';
import { report } from './report.mjs';

const { values: a } = parseArgs({
  options: {
    pulse: { type: 'string' }, plugins: { type: 'string' }, fake: { type: 'string' }, 'make-synthetic': { type: 'string' },
    'llama-server': { type: 'string' }, template: { type: 'string' }, 'node-modules': { type: 'string' }, out: { type: 'string' },
    seed: { type: 'string', default: '1' }, duration: { type: 'string', default: '180' }, conversations: { type: 'string', default: '8' },
    'fault-every': { type: 'string', default: '6' }, 'max-hold': { type: 'string', default: '15' }, 'small-disk': { type: 'string' },
  },
});
for (const k of ['pulse', 'plugins', 'fake', 'make-synthetic', 'llama-server', 'template', 'node-modules', 'out']) {
  if (!a[k]) {
    console.error(`chaos: --${k} is required`);
    process.exit(2);
  }
}
const seed = Number(a.seed), duration = Number(a.duration), conversations = Number(a.conversations);
const out = path.resolve(a.out);
fs.mkdirSync(out, { recursive: true });
const rng = mulberry32(seed);
const log = (m) => console.log(`[${((Date.now() - t00) / 1000).toFixed(1).padStart(6)} s] ${m}`);
const t00 = Date.now();

// Limits the run states and checks.
const LIMITS = {
  idle_ms: 30000,            // a stream with no event this long is an idle timeout (Codex's default is 300 s)
  head_timeout_ms: 120000,   // the SDK's wait for a response head
  request_max_retries: 4,    // Codex's defaults
  stream_max_retries: 5,
  turn_bound_ms: 180000,     // a turn, retries included, ends within this
  footprint: { fds: 16, threads: 8, rss_factor: 1.5, rss_extra_kib: 32768 },
};

const run = {
  faults: [], notes: [], violations: [], backends: [], gatewayBusy: false, smallDisk: a['small-disk'] || null,
  note(m) { this.notes.push(m); log(`note: ${m}`); },
  violation(m) { this.violations.push(m); log(`VIOLATION: ${m}`); },
};

async function main() {
  // The model: the tiny synthetic qwen35 (random weights: noise, but real tokens through a real
  // server, fast enough that many turns run and most faults land mid-answer).
  const model = `${out}/tiny.gguf`;
  execFileSync(a['make-synthetic'], ['--tiny', model]);
  const bias = [];
  for (let t = 128; t < 256; t++) bias.push(t);
  const llamaOpts = (name) => ({ server: a['llama-server'], model, template: a.template, bias, slots: 2, context: 8192, smallContext: 6144, dir: out, name });
  // The Qwen tags' ids, from the server itself, banned too.
  const probe = new LlamaServer('llama-probe', llamaOpts('probe'));
  const probePort = await probe.start();
  const tok = await (await fetch(`http://127.0.0.1:${probePort}/tokenize`, { method: 'POST',
    body: JSON.stringify({ content: '<think></think><tool_call></tool_call><tool_response></tool_response>', parse_special: true }) })).json();
  if (tok.tokens.length !== 6) throw new Error(`the tags are not 6 tokens: ${JSON.stringify(tok)}`);
  bias.push(...tok.tokens);
  await probe.proc.stop();

  // The fake vLLM's script: a tool-calling turn (reasoning, then two parallel calls: a function
  // and the custom apply_patch), then, once the results are in, an answer; a long prompt's
  // prefill costs time (its cache is cold after a restart).
  const script = `${out}/fake-script.json`;
  fs.writeFileSync(script, JSON.stringify({
    split: 6, prefix_cache: true, prefill_us_per_token: 200,
    turns: [
      { reasoning: 'I should look at the files, then patch the first one.', delay_ms: 40,
        tool_calls: [{ name: 'exec_command', arguments: { cmd: 'ls -la src' } },
          { name: 'apply_patch', arguments: { input: '*** Begin Patch\n*** Update File: src/a.txt\n@@\n-old\n+new\n*** End Patch\n' } }] },
      { reasoning: 'The listing and the patch worked.', content: 'I listed src and patched a.txt: it now says new instead of old. Anything else?', delay_ms: 40 },
    ],
  }));

  for (const [i, name] of ['llama-a', 'llama-b', 'llama-c'].entries()) {
    const server = new LlamaServer(name, llamaOpts(name));
    const proxy = new FaultProxy(name, await server.start(), rng);
    await proxy.listen();
    run.backends.push({ name, model: 'chaos-llama', server, proxy, busy: false, index: i });
  }
  for (const [i, name] of ['fake-a', 'fake-b'].entries()) {
    const server = new FakeServer(name, { fake: a.fake, script, dir: out });
    const proxy = new FaultProxy(name, await server.start(), rng);
    await proxy.listen();
    run.backends.push({ name, model: 'chaos-tools', server, proxy, busy: false, index: i });
  }
  // The reference: the same servers, no fault ever, behind a gateway of their own.
  const refLlama = new LlamaServer('ref-llama', llamaOpts('ref-llama'));
  const refFake = new FakeServer('ref-fake', { fake: a.fake, script, dir: out });
  await refLlama.start();
  await refFake.start();

  // The gateways' plugins: a private copy (a fault replaces a file in it).
  run.pluginDir = `${out}/plugins`;
  fs.mkdirSync(run.pluginDir, { recursive: true });
  for (const f of fs.readdirSync(a.plugins).filter((f) => f.endsWith('.so'))) fs.copyFileSync(`${a.plugins}/${f}`, `${run.pluginDir}/${f}`);
  const files = run.smallDisk ? { trace: `${run.smallDisk}/trace.jsonl`, prefixes: `${run.smallDisk}/prefixes.json` }
    : { trace: `${out}/trace.jsonl`, prefixes: `${out}/prefixes.json` };
  let rotation = 0;
  run.order = () => {
    const names = run.backends.filter((b) => b.model === 'chaos-llama').map((b) => b.name);
    return names.slice(rotation % names.length).concat(names.slice(0, rotation % names.length));
  };
  // The endpoint a model's requests go to first.
  run.serving = (model) => (model === 'chaos-llama' ? run.order()[0] : 'fake-a');
  run.rotateOrder = () => {
    rotation += 1;
    writeConfig();
  };
  const gport = await freePort();
  const writeConfig = () => {
    const byName = new Map(run.backends.map((b) => [b.name, b]));
    const endpoints = (model, names) => names.map((n) => `[[models.${model}.endpoints]]\nname = "${n}"\nurl = "http://127.0.0.1:${byName.get(n).proxy.port}/v1"\n`).join('');
    fs.writeFileSync(`${out}/pulse.toml`, `${common(gport, files)}
[models.chaos-llama]
profile = "llamacpp"
profile_options = { resume = "tokens" }
${endpoints('chaos-llama', run.order())}
[models.chaos-tools]
profile = "qwen38"
upstream_model = "chaos-tools"
${endpoints('chaos-tools', ['fake-a', 'fake-b'])}`);
  };
  writeConfig();
  const refPort = await freePort();
  fs.writeFileSync(`${out}/reference.toml`, `${common(refPort, { trace: '', prefixes: '' }).replace(`dirs = ["${run.pluginDir}"]`, `dirs = ["${a.plugins}"]`)}
[models.chaos-llama]
profile = "llamacpp"
profile_options = { resume = "tokens" }
[[models.chaos-llama.endpoints]]
name = "ref"
url = "http://127.0.0.1:${refLlama.port}/v1"
[models.chaos-tools]
profile = "qwen38"
upstream_model = "chaos-tools"
[[models.chaos-tools.endpoints]]
name = "ref"
url = "http://127.0.0.1:${refFake.port}/v1"
`);
  run.gateway = new Gateway('pulse', { pulse: a.pulse, config: `${out}/pulse.toml`, port: gport, dir: out });
  const reference = new Gateway('pulse-reference', { pulse: a.pulse, config: `${out}/reference.toml`, port: refPort, dir: out });
  await run.gateway.start();
  await reference.start();
  // Failovers and resumes over the whole run: each killed process's, scraped just before.
  run.earlier = { failovers: 0, resumes: 0 };
  run.keepCounters = async () => {
    try {
      const m = await run.gateway.metrics();
      const sum = (prefix) => [...m].filter(([k]) => k.startsWith(prefix)).reduce((s, [, v]) => s + v, 0);
      run.earlier.failovers += sum('pulse_failovers_total');
      run.earlier.resumes += sum('pulse_resumed_streams_total');
    } catch { /* not answering: its counts are lost with it */ }
  };
  run.onGatewayRestart = () => log(`gateway restarted (generation ${run.gateway.generation})`);
  log(`set up: 3 llama-servers, 2 fake vLLM, their proxies, the gateway on ${gport}, the reference on ${refPort}`);

  // Clients.
  const sdks = [loadSdk(a['node-modules'], 'openai7'), loadSdk(a['node-modules'], 'openai')];
  const tally = [];
  const convs = [];
  for (let i = 0; i < conversations; i++) {
    const kind = i % 2 === 0 ? 'llama' : 'tools';
    const sdk = sdks[Math.floor(i / 2) % 2];
    convs.push(new Conversation(i, {
      OpenAI: sdk.default ?? sdk.OpenAI ?? sdk, sdk: Math.floor(i / 2) % 2 ? 'openai 6' : 'openai 7', kind,
      model: kind === 'llama' ? 'chaos-llama' : 'chaos-tools', rng: mulberry32(seed * 1000 + i),
      baseURL: `${run.gateway.url}/v1`, generation: () => run.gateway.generation, idleMs: LIMITS.idle_ms,
      headTimeoutMs: LIMITS.head_timeout_ms, requestMaxRetries: LIMITS.request_max_retries, streamMaxRetries: LIMITS.stream_max_retries,
      maxOutputTokens: kind === 'llama' ? 1500 : 400, promptChars: kind === 'llama' ? 1200 : 16000,
      turnsPerConversation: kind === 'llama' ? 1 : 4,
    }));
  }

  // Warm-up (no faults): one turn each, then the footprint the storm's end is compared with.
  const warm = await Promise.all(convs.map((c) => c.turn([])));
  for (const r of warm) if (r.outcome !== 'completed' || r.violations.length) throw new Error(`warm-up turn failed: ${JSON.stringify(r.errors.concat(r.violations))}`);
  await sleep(1000);
  const baseline = run.gateway.footprint();
  log(`warm-up done; gateway footprint ${JSON.stringify(baseline)}`);

  // The storm.
  const stormStart = Date.now();
  const until = stormStart + duration * 1000;
  const turns = [];
  const clients = convs.map(async (c) => {
    while (Date.now() < until) {
      const r = await c.turn(tally);
      r.sdk = c.opts.sdk;
      turns.push(r);
      if (r.t1 - r.t0 > LIMITS.turn_bound_ms) r.violations.push(`turn took ${r.t1 - r.t0} ms, over the bound ${LIMITS.turn_bound_ms} ms`);
      if (r.outcome !== 'completed') log(`LOST turn of conversation ${c.id}: ${r.errors.join(' | ')}`);
    }
  });
  const faults = storm(run, { rng, until, everyS: Number(a['fault-every']), maxHoldS: Number(a['max-hold']) });
  await Promise.all([faults, ...clients]);
  const stormEnd = Date.now();
  log(`storm over: ${turns.length} turns, ${run.faults.length} faults`);

  // Each turn that met a fault is compared with the fault-free answer to the same request; so is
  // every fifth of the others (a control: a difference there is the comparison's, not a fault's).
  const met = (t) => run.faults.some((f) => f.t0 <= t.t1 && (f.t1 || f.t0) >= t.t0 && (f.model === '*' || f.model === (t.kind === 'llama' ? 'chaos-llama' : 'chaos-tools')));
  for (const t of turns) t.metFault = met(t);
  const completed = turns.filter((t) => t.outcome === 'completed');
  const toCompare = completed.filter((t) => t.metFault);
  const controls = completed.filter((t) => !t.metFault).filter((_, i) => i % 5 === 0);
  const RefSdk = sdks[0].default ?? sdks[0];
  const refClient = new RefSdk({ baseURL: `${reference.url}/v1`, apiKey: 'chaos', maxRetries: 2, timeout: 120000 });
  const queue = [...toCompare, ...controls];
  await Promise.all([0, 1].map(async () => {
    for (let t = queue.shift(); t; t = queue.shift()) {
      const ref = await refClient.responses.create({ ...t.body, stream: false });
      const want = answerOf(ref), got = answerOf(t.answer);
      t.compared = true;
      t.equal = JSON.stringify(want) === JSON.stringify(got);
      if (!t.equal) t.violations.push(`differs from the fault-free answer: ${JSON.stringify(got).slice(0, 300)} vs ${JSON.stringify(want).slice(0, 300)}`);
    }
  }));

  // The gateway's counters against the clients' tally, for the gateway process alive now (a
  // killed one's counters die with it): every request it was sent. A request sent while it was
  // starting may have reached it or its predecessor: those bound the difference.
  const m = await run.gateway.metrics();
  const gen = run.gateway.generation;
  const reached = tally.filter((f) => f.outcome !== 'unreached');
  const mine = reached.filter((f) => f.t >= run.gateway.readyAt);
  const unsure = reached.filter((f) => f.t >= run.gateway.startingAt && f.t < run.gateway.readyAt);
  const count = (outcome) => [...m].filter(([k]) => k.startsWith('pulse_requests_total{') && k.includes(`outcome="${outcome}"`)).reduce((s, [, v]) => s + v, 0);
  const counters = {
    generation: gen,
    gateway: { completed: count('completed'), incomplete: count('incomplete'), failed: count('failed'), unavailable: count('unavailable'),
      total: [...m].filter(([k]) => k.startsWith('pulse_requests_total{')).reduce((s, [, v]) => s + v, 0),
      failovers: [...m].filter(([k]) => k.startsWith('pulse_failovers_total')).reduce((s, [, v]) => s + v, 0),
      resumes: [...m].filter(([k]) => k.startsWith('pulse_resumed_streams_total')).reduce((s, [, v]) => s + v, 0) },
    clients: tallyOf(mine),
    sent_while_it_started: tallyOf(unsure),
    run_totals: { failovers: run.earlier.failovers, resumes: run.earlier.resumes },
  };
  counters.run_totals.failovers += counters.gateway.failovers;
  counters.run_totals.resumes += counters.gateway.resumes;
  // Generation 0 also served the warm-up turns, which the tally does not hold.
  if (gen > 0) {
    for (const k of ['completed', 'incomplete', 'failed', 'total']) {
      const lo = counters.clients[k], hi = lo + counters.sent_while_it_started[k];
      if (counters.gateway[k] < lo || counters.gateway[k] > hi)
        run.violation(`the gateway counts ${counters.gateway[k]} ${k} requests, its clients ${lo}` + (hi > lo ? ` (to ${hi} with those sent while it started)` : ''));
    }
  } else {
    run.note('the gateway was not restarted during the storm: its counters include the warm-up, compared as at least the clients\' tally');
    for (const k of ['completed', 'incomplete', 'total'])
      if (counters.gateway[k] < counters.clients[k]) run.violation(`the gateway counts ${counters.gateway[k]} ${k} requests, its clients ${counters.clients[k]}`);
  }

  // After the storm, load stopped: the gateway's footprint back near the baseline.
  await sleep(5000);
  const after = { ...run.gateway.footprint(), generation: run.gateway.generation,
    age_s: Math.round((Date.now() - run.gateway.readyAt) / 1000) };
  const L = LIMITS.footprint;
  if (after.fds > baseline.fds + L.fds) run.violation(`descriptors ${after.fds} after the storm, ${baseline.fds} before`);
  if (after.threads > baseline.threads + L.threads) run.violation(`threads ${after.threads} after the storm, ${baseline.threads} before`);
  if (after.rss_kib > baseline.rss_kib * L.rss_factor + L.rss_extra_kib) run.violation(`RSS ${after.rss_kib} KiB after the storm, ${baseline.rss_kib} KiB before`);

  // Everything stopped; nothing left behind.
  await Promise.all([run.gateway.proc.stop(), reference.proc.stop(), refLlama.proc.stop(), refFake.proc.stop(),
    ...run.backends.map((b) => b.server.proc.stop()), ...run.backends.map((b) => b.proxy.close())]);
  await sleep(200);
  const left = [...started].filter(processAlive);
  if (left.length) run.violation(`processes left running: ${left.join(' ')}`);

  const summary = report({ out, seed, duration, conversations, turns, faults: run.faults, kinds: KINDS, violations: run.violations, notes: run.notes,
    counters, footprint: { baseline, after, limits: L }, limits: LIMITS, stormStart, stormEnd });
  return summary.ok ? 0 : 1;
}

function tallyOf(fetches) {
  const n = (o) => fetches.filter((f) => f.outcome === o).length;
  return { completed: n('completed'), incomplete: n('incomplete'), failed: n('failed'), total: fetches.length };
}

function common(port, files) {
  return `[server]
listen = "127.0.0.1:${port}"
trace_file = "${files.trace}"
[plugins]
dirs = ["${run.pluginDir}"]
dropin_dirs = []
runtime_dir = "${out}/run-${port}"
[upstream]
retry_window_s = 60
keepalive_s = 2
head_timeout_s = 30
idle_timeout_s = 15
liveness_after_s = 3
liveness_timeout_s = 2
stall_after_s = 10
health_interval_s = 0.5
endpoint_fragments = ""
[warmup]
state_file = "${files.prefixes}"
quiet_s = 1
`;
}

let code = 2;
try {
  code = await main();
} catch (e) {
  console.error(`chaos: ${e.stack || e.message}`);
} finally {
  for (const pid of started) {
    try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
  }
}
process.exit(code);
