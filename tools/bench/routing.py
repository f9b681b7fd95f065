#!/usr/bin/env python3
"""Routing benchmark: what each models.X.routing policy does to prefix-cache hits and TTFT.

N Codex-shaped sessions (a long shared system prompt and tool list, then turns that grow the
history) run concurrently, T turns each, through one `pulse serve` with two fake backends. Each
backend keeps its own prefix cache and charges prefill time for the prompt tokens it has not
cached, one prefill at a time (as a real engine shares its compute). For each policy
(failover, round_robin, sticky) and each scenario (steady; backend 1, the one failover prefers,
restarted with an empty cache after half the turns) it reports the cached-token fraction and TTFT p50/p99, and the
ratios against failover measured in the same run.

    tools/bench/routing.py --pulse build/core/pulse --fake build/tests/fake_vllm --plugins build/plugins
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(path, pattern, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            m = re.search(pattern, open(path).read())
            if m:
                return m
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    tail = open(path).read()[-2000:] if os.path.exists(path) else ""
    raise SystemExit(f"routing: timed out waiting for {pattern!r} in {path}:\n{tail}")


class Fake:
    def __init__(self, exe, work, name, prefill_us):
        self.exe, self.port = exe, free_port()
        self.script = os.path.join(work, f"{name}.json")
        self.log = os.path.join(work, f"{name}.log")
        json.dump({"prefix_cache": True, "prefill_us_per_token": prefill_us,
                   "turns": [{"content": "done with this step"}]}, open(self.script, "w"))
        self.proc = None
        self.start()

    def start(self):
        open(self.log, "w").close()
        self.proc = subprocess.Popen([self.exe, "--script", self.script, "--port", str(self.port)],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        wait_for(self.log, r"listening on 127")

    def stop(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def url(self):
        return f"http://127.0.0.1:{self.port}/v1"


def pulse_config(path, port, routing, fakes, plugins):
    eps = "".join(f'[[models.m.endpoints]]\nname = "node{i + 1}"\nurl = "{f.url()}"\n' for i, f in enumerate(fakes))
    open(path, "w").write(f"""[server]
listen = "127.0.0.1:{port}"
[plugins]
dirs = ["{plugins}"]
dropin_dirs = []
[upstream]
health_interval_s = 0.2
connect_timeout_s = 1
retry_window_s = 30
[models.m]
profile = "qwen38"
routing = "{routing}"
{eps}""")


SYSTEM = "You are a coding agent working in a repository. " * 160  # ~8 KB: Codex's instructions are longer still
TOOLS = [{"type": "function", "name": n, "description": "tool " + n + " " + "details " * 40,
          "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}}}
         for n in ("shell", "apply_patch", "read_file", "list_dir", "search")]


def turn(port, session, history):
    body = {"model": "m", "stream": True, "store": False, "instructions": SYSTEM, "tools": TOOLS,
            "prompt_cache_key": f"session-{session}", "input": history}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/responses", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, usage, terminal = None, None, None
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:
                line = raw.decode()
                if not line.startswith("data: "):
                    continue
                ev = json.loads(line[6:])
                if ev["type"] == "response.output_text.delta" and ttft is None:
                    ttft = time.perf_counter() - t0
                if ev["type"] in ("response.completed", "response.failed", "response.incomplete"):
                    terminal, usage = ev["type"], ev["response"]["usage"]
    except Exception as e:  # no terminal event: the gateway lost the request
        return f"lost ({e})", None, 0, 0
    if terminal != "response.completed":
        return terminal or "lost (no terminal event)", None, 0, 0
    return "completed", ttft, usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]


def run_arm(args, work, routing, restart):
    fakes = [Fake(args.fake, work, f"{routing}-{restart}-node{i + 1}", args.prefill_us) for i in range(2)]
    port = free_port()
    cfg = os.path.join(work, f"{routing}-{restart}.toml")
    log = os.path.join(work, f"{routing}-{restart}.pulse.log")
    pulse_config(cfg, port, routing, fakes, args.plugins)
    pulse = subprocess.Popen([args.pulse, "serve", "--config", cfg], stdout=subprocess.DEVNULL, stderr=open(log, "w"),
                             env={k: v for k, v in os.environ.items() if not k.startswith("PULSE_")})
    try:
        wait_for(log, r"listening on http://127")
        samples = []  # (turn, ttft, input, cached), in completion order
        failures = []  # (session, turn, terminal status) of turns that did not complete
        histories = {s: [{"role": "user", "content": f"Task {s}: fix the failing test in module_{s}.py"}] for s in range(args.sessions)}
        lock = threading.Lock()

        def session(s, turns):
            for t in turns:
                # A turn that ends failed (a backend killed while it streamed: mid-stream resume
                # does not exist yet) is retried once, as Codex would; both outcomes are reported.
                for attempt in range(2):
                    status, ttft, inp, cached = turn(port, s, histories[s])
                    with lock:
                        if status == "completed":
                            samples.append((t, ttft, inp, cached))
                        else:
                            failures.append((s, t, status))
                    if status == "completed":
                        break
                histories[s] += [{"role": "assistant", "content": [{"type": "output_text", "text": "done with this step"}]},
                                 {"role": "user", "content": f"Next step {t + 1} of task {s}: " + "context " * 60}]

        def restarter():
            # In the middle of the traffic (sessions keep going): down for a moment, then back
            # with an empty cache.
            while True:
                with lock:
                    if len(samples) >= args.sessions * args.turns // 2:
                        break
                time.sleep(0.01)
            fakes[0].stop()
            time.sleep(args.down_s)
            fakes[0].start()

        threads = [threading.Thread(target=session, args=(s, range(args.turns))) for s in range(args.sessions)]
        if restart:
            threads.append(threading.Thread(target=restarter))
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        pulse.send_signal(signal.SIGTERM)
        pulse.wait(timeout=30)
        for f in fakes:
            f.stop()
    after = samples[len(samples) // 2:]  # in completion order: the second half holds the restart
    return samples, after, failures


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def summary(samples):
    ttfts = [s[1] for s in samples]
    return {"requests": len(samples), "cached_fraction": sum(s[3] for s in samples) / max(1, sum(s[2] for s in samples)),
            "ttft_p50_s": pct(ttfts, 50), "ttft_p99_s": pct(ttfts, 99), "ttft_mean_s": statistics.fmean(ttfts)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pulse", required=True)
    ap.add_argument("--fake", required=True)
    ap.add_argument("--plugins", required=True)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--prefill-us", type=int, default=250, help="prefill cost per uncached prompt token (µs)")
    ap.add_argument("--down-s", type=float, default=1.0, help="how long the restarted backend is down")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    args.pulse, args.fake, args.plugins = (os.path.abspath(p) for p in (args.pulse, args.fake, args.plugins))
    results = {"conditions": {"sessions": args.sessions, "turns": args.turns, "prefill_us_per_token": args.prefill_us,
                              "backends": 2, "host": os.uname().nodename, "cpus": os.cpu_count()}, "arms": []}
    with tempfile.TemporaryDirectory() as work:
        for restart in (False, True):
            for routing in ("failover", "round_robin", "sticky"):
                samples, after, failures = run_arm(args, work, routing, restart)
                arm = {"routing": routing, "scenario": "restart" if restart else "steady", **summary(samples),
                       "after_midpoint": summary(after), "failed_turns": [list(f) for f in failures]}
                results["arms"].append(arm)
    base = {a["scenario"]: a for a in results["arms"] if a["routing"] == "failover"}
    for title, part in (("all turns", lambda a: a), ("the second half of the requests (the restart falls there)", lambda a: a["after_midpoint"])):
        print(f"{title}:")
        print(f"  {'scenario':8} {'routing':12} {'cached':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'p50/failover':>13} {'p99/failover':>13} {'failed':>7}")
        for a in results["arms"]:
            x, b = part(a), part(base[a["scenario"]])
            x["ttft_p50_vs_failover"] = x["ttft_p50_s"] / b["ttft_p50_s"]
            x["ttft_p99_vs_failover"] = x["ttft_p99_s"] / b["ttft_p99_s"]
            print(f"  {a['scenario']:8} {a['routing']:12} {x['cached_fraction']:7.1%} {x['ttft_p50_s']:8.3f}s {x['ttft_p99_s']:8.3f}s "
                  f"{x['ttft_p50_vs_failover']:13.2f} {x['ttft_p99_vs_failover']:13.2f} {len(a['failed_turns']):7d}")
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)
    for a in results["arms"]:
        for s, t, status in a["failed_turns"]:
            print(f"failed turn: {a['scenario']} {a['routing']} session {s} turn {t}: {status}")
    # Every request must get a terminal event, and a turn must complete on its retry; a turn cut
    # by the restart ending response.failed is reported, not fatal (mid-stream resume is not built).
    lost = [f for a in results["arms"] for f in a["failed_turns"] if f[2].startswith("lost")]
    if lost or any(a["failed_turns"] for a in results["arms"] if a["scenario"] == "steady"):
        sys.exit("routing: requests were lost or failed without a restart")
    if any(a["requests"] != args.sessions * args.turns for a in results["arms"]):
        sys.exit("routing: a turn failed twice")


if __name__ == "__main__":
    main()
