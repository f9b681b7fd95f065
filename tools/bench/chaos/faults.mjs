// The fault schedule of a chaos run, drawn from its seed, and each fault's injection.
//
// Rules that keep every turn recoverable by some gateway (the ones a fault storm could break for
// any gateway are counted apart by the run, not hidden): at most one fault per backend at a
// time, and never every endpoint of a model at once, so each model keeps one endpoint that
// works; gateway-wide faults (a reload, a replaced plugin, the gateway killed, a full disk) come
// one at a time.
import fs from 'node:fs';
import { sleep } from './cluster.mjs';

export const KINDS = [
  'backend_kill', 'backend_freeze', 'backend_shrink',
  'net_latency', 'net_throttle', 'net_reset', 'net_halfopen',
  'reload_sighup', 'reload_admin', 'plugin_replace', 'gateway_kill', 'disk_full',
];

export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const pick = (rng, list) => list[Math.floor(rng() * list.length)];
const between = (rng, lo, hi) => lo + rng() * (hi - lo);

// Injects faults into `run` (its backends, proxies and gateway) until `until`, one every
// `everyS` seconds (± half), each kind once first (in an order drawn from the seed), then drawn
// at random. Every fault is logged in `run.faults` as { kind, target, t0, t1, detail }.
export async function storm(run, { rng, until, everyS, maxHoldS }) {
  const order = [...KINDS];
  for (let i = order.length - 1; i > 0; i--) {
    const j = Math.floor(rng() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  const pending = [];
  let n = 0;
  while (Date.now() < until) {
    const kind = n < order.length ? order[n] : pick(rng, KINDS);
    n += 1;
    const task = inject(run, kind, rng, maxHoldS).catch((e) => run.note(`fault ${kind} could not be injected: ${e.message}`));
    pending.push(task);
    await sleep(between(rng, 0.5, 1.5) * everyS * 1000);
  }
  await Promise.all(pending);
}

// A backend no fault holds now, of a model that keeps another working one; null if none. Most
// of the time the one its model's traffic goes to (the first in the endpoint order): a fault on
// an endpoint that serves nothing costs no turn anything, and proves nothing.
function freeBackend(run, rng, filter = () => true) {
  const candidates = run.backends.filter((b) => !b.busy && filter(b) &&
    run.backends.some((o) => o !== b && o.model === b.model && !o.busy));
  if (!candidates.length) return null;
  const serving = candidates.filter((b) => run.serving(b.model) === b.name);
  return serving.length && rng() < 0.7 ? serving[0] : pick(rng, candidates);
}

async function hold(run, fault, seconds) {
  run.faults.push(fault);
  await sleep(seconds * 1000);
  fault.t1 = Date.now();
}

async function inject(run, kind, rng, maxHoldS) {
  const t0 = Date.now();
  if (kind.startsWith('backend_') || kind.startsWith('net_')) {
    const b = freeBackend(run, rng, (x) => kind === 'backend_kill' || kind.startsWith('net_') || x.model === 'chaos-llama');
    if (!b) return run.note(`${kind}: skipped, no backend free of faults`);
    b.busy = true;
    const fault = { kind, target: b.name, model: b.model, t0, t1: t0, detail: '' };
    try {
      if (kind === 'backend_kill') {
        run.faults.push(fault);
        await b.server.proc.kill();
        const down = between(rng, 0.5, 3);
        fault.detail = `SIGKILL, restarted after ${down.toFixed(1)} s`;
        await sleep(down * 1000);
        b.proxy.retarget(await b.server.start());
        fault.t1 = Date.now();
      } else if (kind === 'backend_freeze') {
        const s = between(rng, 5, maxHoldS);
        fault.detail = `SIGSTOP for ${s.toFixed(1)} s`;
        b.server.proc.signal('SIGSTOP');
        await hold(run, fault, s);
        b.server.proc.signal('SIGCONT');
      } else if (kind === 'backend_shrink') {
        run.faults.push(fault);
        const small = rng() < 0.5 ? { slots: 1, context: b.server.opts.context } : { slots: b.server.opts.slots, context: b.server.opts.smallContext };
        fault.detail = `restarted with -np ${small.slots} -c ${small.context}`;
        await b.server.proc.stop();
        b.proxy.retarget(await b.server.start(small));
        fault.t1 = Date.now();
      } else {
        const s = kind === 'net_reset' ? 0 : between(rng, 3, Math.min(15, maxHoldS));
        const f = kind === 'net_latency' ? { kind: 'latency', ms: between(rng, 200, 2000), jitter: between(rng, 0, 500) }
          : kind === 'net_throttle' ? { kind: 'throttle', bytesPerSec: between(rng, 2000, 20000) }
          : kind === 'net_reset' ? { kind: 'reset', afterBytes: Math.floor(between(rng, 0, 40000)) }
          : { kind: 'halfopen' };
        fault.detail = JSON.stringify(f) + (s ? ` for ${s.toFixed(1)} s` : '');
        b.proxy.set(f);
        if (s) await hold(run, fault, s);
        else run.faults.push(fault);
        if (kind === 'net_reset') await sleep(2000);  // the cut streams end before the next fault
        b.proxy.clear();
        fault.t1 = Date.now();
      }
    } finally {
      b.busy = false;
    }
    return;
  }
  // Gateway-wide faults, one at a time.
  if (run.gatewayBusy) return run.note(`${kind}: skipped, another gateway fault is under way`);
  run.gatewayBusy = true;
  const fault = { kind, target: 'gateway', model: '*', t0, t1: t0, detail: '' };
  run.faults.push(fault);
  try {
    if (kind === 'reload_sighup' || kind === 'reload_admin') {
      run.rotateOrder();
      fault.detail = `endpoint order ${run.order().join(',')}`;
      if (kind === 'reload_sighup') {
        run.gateway.proc.signal('SIGHUP');
      } else {
        const r = await fetch(`${run.gateway.url}/admin/reload`, { method: 'POST', signal: AbortSignal.timeout(5000) });
        fault.detail += `, POST /admin/reload: ${r.status}`;
        if (r.status !== 202) run.violation(`POST /admin/reload answered ${r.status}`);
      }
      await sleep(1000);
    } else if (kind === 'plugin_replace') {
      // The same plugin's file replaced by a copy (a package upgrade's rename): a new inode,
      // which the directory watch reloads.
      const file = `${run.pluginDir}/llamacpp.so`;
      fs.copyFileSync(file, `${file}.new`);
      fs.renameSync(`${file}.new`, file);
      fault.detail = 'llamacpp.so replaced';
      await sleep(1500);
    } else if (kind === 'gateway_kill') {
      await run.keepCounters();  // what the dying process counted, for the run's totals
      await run.gateway.proc.kill();
      fault.detail = 'SIGKILL, restarted at once';
      await run.gateway.start();
      run.onGatewayRestart();
    } else if (kind === 'disk_full') {
      if (!run.smallDisk) {
        fault.detail = 'skipped: no small filesystem (mounting one needs root)';
        run.note(`disk_full: ${fault.detail}`);
      } else {
        const s = between(rng, 3, Math.min(15, maxHoldS));
        fault.detail = `trace and prefix files' filesystem full for ${s.toFixed(1)} s`;
        fillUp(`${run.smallDisk}/filler`);
        await sleep(s * 1000);
        fs.rmSync(`${run.smallDisk}/filler`, { force: true });
      }
    }
  } finally {
    fault.t1 = Date.now();
    run.gatewayBusy = false;
  }
}

// Writes `file` until its filesystem has no room left.
function fillUp(file) {
  const fd = fs.openSync(file, 'w');
  try {
    for (const size of [64 * 1024, 4096, 512, 1]) {
      const block = Buffer.alloc(size, 0x2e);
      try {
        for (;;) fs.writeSync(fd, block);
      } catch (e) {
        if (e.code !== 'ENOSPC') throw e;
      }
    }
  } finally {
    fs.closeSync(fd);
  }
}
