// The processes of a chaos run: real llama-servers, fake vLLM servers and `pulse serve`, each
// started, stopped, frozen and restarted on demand, every one of them tracked so that none
// outlives the run.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// Every process any Proc started, so the run can prove at its end that none is left.
export const started = new Set();

export class Proc {
  constructor(name, argv, { log, env } = {}) {
    this.name = name;
    this.argv = argv;
    this.log = log;
    this.env = env;
    this.child = null;
  }

  start() {
    const out = fs.openSync(this.log, 'a');
    this.child = spawn(this.argv[0], this.argv.slice(1), { stdio: ['ignore', out, out], env: this.env ?? process.env });
    fs.closeSync(out);
    started.add(this.child.pid);
    this.exited = new Promise((resolve) => this.child.once('exit', (code, signal) => resolve({ code, signal })));
    return this.child.pid;
  }

  get pid() { return this.child?.pid; }
  get alive() { return this.child !== null && this.child.exitCode === null && this.child.signalCode === null; }

  signal(sig) {
    if (this.alive) this.child.kill(sig);
  }

  // Stops it (SIGTERM, then SIGKILL after `graceMs`) and waits for the exit.
  async stop(graceMs = 5000) {
    if (!this.alive) return;
    this.child.kill('SIGCONT');  // a frozen process cannot act on SIGTERM
    this.child.kill('SIGTERM');
    const t = setTimeout(() => this.signal('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(t);
  }

  async kill() {
    if (!this.alive) return;
    this.child.kill('SIGKILL');
    await this.exited;
  }
}

// Waits (bounded) until GET url answers 200 (or any status in `accept`).
export async function waitHealthy(url, what, ms = 30000, accept = [200]) {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    try {
      const r = await fetch(url, { signal: AbortSignal.timeout(1000) });
      await r.arrayBuffer();
      if (accept.includes(r.status)) return;
    } catch { /* not up yet */ }
    await sleep(50);
  }
  throw new Error(`${what} did not answer ${url} with 200 within ${ms} ms`);
}

// A llama-server serving the run's synthetic model: greedy, its answers run to the token limit
// (--ignore-eos), byte tokens and the Qwen tags banned (random weights would write invalid UTF-8
// or a stray <tool_call>). `slots` and `context` vary when a fault restarts it smaller.
export class LlamaServer {
  constructor(name, opts) {
    this.name = name;
    this.opts = opts;  // { server, model, template, bias: [ids], slots, context, dir }
    this.slots = opts.slots;
    this.context = opts.context;
    this.proc = null;
    this.port = 0;
  }

  async start({ slots = this.opts.slots, context = this.opts.context } = {}) {
    this.slots = slots;
    this.context = context;
    this.port = await freePort();
    const bias = this.opts.bias.flatMap((t) => ['--logit-bias', `${t}-inf`]);
    this.proc = new Proc(this.name, [this.opts.server, '-m', this.opts.model, '--host', '127.0.0.1', '--port', String(this.port),
      '--jinja', '--chat-template-file', this.opts.template, '-c', String(context), '-np', String(slots), '-t', '1',
      '--ignore-eos', '--seed', '1', ...bias], { log: `${this.opts.dir}/${this.name}.log` });
    this.proc.start();
    await waitHealthy(`http://127.0.0.1:${this.port}/health`, `llama-server ${this.name}`);
    return this.port;
  }
}

// A fake vLLM server on a script (tests/support/fake_vllm.cpp).
export class FakeServer {
  constructor(name, opts) {
    this.name = name;
    this.opts = opts;  // { fake, script, dir }
    this.proc = null;
    this.port = 0;
  }

  async start() {
    this.port = await freePort();
    this.proc = new Proc(this.name, [this.opts.fake, '--script', this.opts.script, '--port', String(this.port), '--flavor', 'vllm',
      '--served-name', 'chaos-tools'], { log: `${this.opts.dir}/${this.name}.log` });
    this.proc.start();
    await waitHealthy(`http://127.0.0.1:${this.port}/v1/models`, `fake vLLM ${this.name}`);
    return this.port;
  }
}

// `pulse serve` on a config file, on a fixed port (a restart keeps it, as a service's does).
// `generation` counts its starts: its counters start from zero at each.
export class Gateway {
  constructor(name, opts) {
    this.name = name;
    this.opts = opts;  // { pulse, config, port, dir, env }
    this.proc = null;
    this.generation = -1;
    this.readyAt = 0;
  }

  get url() { return `http://127.0.0.1:${this.opts.port}`; }

  async start() {
    this.startingAt = Date.now();
    this.proc = new Proc(this.name, [this.opts.pulse, 'serve', '--config', this.opts.config],
      { log: `${this.opts.dir}/${this.name}.log`, env: { ...process.env, PULSE_LOG_TIMESTAMPS: '1', ...this.opts.env } });
    this.proc.start();
    // Up once it answers: 503 "degraded" is an answer too (a model whose endpoints are all
    // faulted or not yet probed), and requests are then served or retried as they come.
    await waitHealthy(`${this.url}/health`, `gateway ${this.name}`, 30000, [200, 503]);
    this.generation += 1;
    this.readyAt = Date.now();
  }

  // Its counters from /metrics: name{labels} -> value.
  async metrics() {
    const r = await fetch(`${this.url}/metrics`, { signal: AbortSignal.timeout(5000) });
    const out = new Map();
    for (const line of (await r.text()).split('\n')) {
      if (!line || line.startsWith('#')) continue;
      const at = line.lastIndexOf(' ');
      out.set(line.slice(0, at), Number(line.slice(at + 1)));
    }
    return out;
  }

  // What the process holds now: descriptors, threads, resident memory.
  footprint() {
    const pid = this.proc.pid;
    const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const field = (k) => Number((status.match(new RegExp(`^${k}:\\s+(\\d+)`, 'm')) || [])[1]);
    return { fds: fs.readdirSync(`/proc/${pid}/fd`).length, threads: field('Threads'), rss_kib: field('VmRSS') };
  }
}

// Whether a pid still names a live process (a zombie counts as gone).
export function processAlive(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}
