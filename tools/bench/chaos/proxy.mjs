// A fault-injecting TCP proxy in front of one backend: what a flaky network or a sick host does
// to a connection, on demand. Loopback only.
//
//   pass       bytes relayed as they come
//   latency    each piece from the backend held `ms` ± `jitter` ms (the first one too: a slow head)
//   throttle   the backend's bytes released at `bytesPerSec`
//   reset      every connection open now is cut with an RST after `afterBytes` more bytes of its
//              answer (a host that dies mid-stream, a middlebox that drops it); later ones pass
//   halfopen   new connections are accepted and read, never answered and never closed (a host
//              whose socket is up and whose server is gone); when the fault ends they are cut
//
// One fault at a time; set() replaces the current one, clear() goes back to pass.
import net from 'node:net';

export class FaultProxy {
  constructor(name, targetPort, rng) {
    this.name = name;
    this.targetPort = targetPort;
    this.rng = rng;
    this.fault = { kind: 'pass' };
    this.conns = new Set();
    this.server = net.createServer((client) => this.#accept(client));
  }

  listen(port = 0) {
    return new Promise((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(port, '127.0.0.1', () => {
        this.port = this.server.address().port;
        resolve(this.port);
      });
    });
  }

  retarget(port) { this.targetPort = port; }

  set(fault) {
    this.clear();
    this.fault = fault;
    if (fault.kind === 'reset') {
      for (const c of this.conns) c.resetAt = c.answered + fault.afterBytes;  // the ones open now only
    }
  }

  clear() {
    if (this.fault.kind === 'halfopen') {
      for (const c of this.conns) if (c.halfopen) c.cut();
    }
    this.fault = { kind: 'pass' };
  }

  close() {
    for (const c of this.conns) c.cut();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }

  #accept(client) {
    const conn = { client, upstream: null, answered: 0, resetAt: Infinity, halfopen: false, queue: [], busy: false };
    conn.cut = () => {
      client.resetAndDestroy();
      if (conn.upstream) conn.upstream.resetAndDestroy();
      this.conns.delete(conn);
    };
    this.conns.add(conn);
    client.on('error', () => conn.cut());
    client.on('close', () => { if (conn.upstream) conn.upstream.destroy(); this.conns.delete(conn); });
    if (this.fault.kind === 'halfopen') {
      conn.halfopen = true;
      client.on('data', () => {});  // read and dropped: the request "was sent"
      return;
    }
    const up = net.connect(this.targetPort, '127.0.0.1');
    conn.upstream = up;
    up.on('error', () => conn.cut());
    up.on('close', () => {
      conn.endAfter = true;
      this.#pump(conn);
    });
    client.pipe(up);
    up.on('data', (buf) => {
      conn.queue.push(buf);
      this.#pump(conn);
    });
  }

  // Sends the backend's queued bytes under the current fault.
  #pump(conn) {
    if (conn.busy) return;
    const buf = conn.queue.shift();
    if (!buf) {
      if (conn.endAfter) conn.client.end();
      return;
    }
    const f = this.fault;
    let delay = 0;
    if (f.kind === 'latency') delay = Math.max(0, f.ms + (this.rng() * 2 - 1) * f.jitter);
    else if (f.kind === 'throttle') delay = (buf.length / f.bytesPerSec) * 1000;
    const send = () => {
      conn.busy = false;
      if (conn.client.destroyed) return;
      if (conn.answered + buf.length >= conn.resetAt) {
        const keep = Math.max(0, conn.resetAt - conn.answered);
        conn.client.write(buf.subarray(0, keep), () => conn.cut());
        conn.answered += keep;
        return;
      }
      conn.answered += buf.length;
      conn.client.write(buf);
      this.#pump(conn);
    };
    if (delay > 0) {
      conn.busy = true;
      setTimeout(send, delay);
    } else {
      send();
    }
  }
}
