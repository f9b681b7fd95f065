#!/usr/bin/env python3
"""check_metric_names.py METRICS_TEXT FILE...: every Pulse metric that an expression in the
Grafana dashboards (*.json: each target's "expr") and Prometheus rule files (*.yml: each "expr:")
names must be one the gateway exposes (a `# TYPE` line of METRICS_TEXT; a histogram brings its
_bucket, _sum and _count). Recording rules (names with a colon) must be defined in the rule files
given. Prints what is wrong and exits 1, else prints what it checked."""
import json
import re
import sys

metrics_text, files = sys.argv[1], sys.argv[2:]
exposed = set()
for line in open(metrics_text):
    m = re.match(r"# TYPE (\S+) (\S+)", line)
    if m:
        exposed.add(m.group(1))
        if m.group(2) == "histogram":
            exposed.update(m.group(1) + s for s in ("_bucket", "_sum", "_count"))

exprs, records = [], set()
for path in files:
    text = open(path).read()
    if path.endswith(".json"):
        def walk(node):
            if isinstance(node, dict):
                if isinstance(node.get("expr"), str):
                    exprs.append((path, node["expr"]))
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)
        walk(json.loads(text))
    else:
        # Rule files: `record:` names and `expr:` values (one line, or a folded block below it).
        lines = text.splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"\s*- record:\s*(\S+)", line)
            if m:
                records.add(m.group(1))
            m = re.match(r"(\s*)expr:\s*(.*)", line)
            if m:
                value = m.group(2)
                if value in (">-", ">", "|", "|-"):
                    indent = len(m.group(1))
                    block = []
                    for nxt in lines[i + 1:]:
                        if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                            break
                        block.append(nxt.strip())
                    value = " ".join(block)
                exprs.append((path, value))

problems = []
names = set()
for path, e in exprs:
    e = re.sub(r'"[^"]*"', '""', e)  # label values are not names
    for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        if name.startswith("pulse_"):
            names.add(name)
            if name not in exposed:
                problems.append(f"{path}: {name} is not in the gateway's /metrics")
        elif name.startswith("pulse:"):
            if name not in records:
                problems.append(f"{path}: recording rule {name} is not defined")
if not exprs:
    problems.append("no expressions found")
for p in problems:
    print("FAIL:", p)
if problems:
    sys.exit(1)
print(f"{len(exprs)} expressions, {len(names)} metric names, all exposed: {' '.join(sorted(names))}")
