#!/usr/bin/env python3
"""The include rules that keep the architecture as core/gateway/README.md draws it.

- core/gateway's job folders include only the folders before them in ORDER (and the root's
  snapshot.h and their own folder); none includes gateway.h, the router: a request sees the
  gateway through request/request_context.h.
- plugins/decoder's folders likewise include only those before them in DECODER_ORDER (device/cpu
  and device/cuda count as device), with the one exception DECODER_EXCEPTIONS names;
- core/ includes no plugin's header; a plugin includes no host header but the libraries SHARED
  names (core/http, the HTTP client; core/args, the command-line convention; core/toml, the
  TOML reader).
Prints each violation with the file and line; exit 1 when there is one.
usage: layout_check.py SOURCE_ROOT
"""
import pathlib
import re
import sys

ORDER = ["protocol", "upstream", "background", "status", "request"]
DECODER_ORDER = ["format", "device", "model", "speculation", "serving", "tools"]
# The plugin's make_demo option writes the demo model with the synthetic-model generator.
DECODER_EXCEPTIONS = {("serving/plugin.cpp", "tools/synthetic.h")}
# Libraries in core/ that the host and plugins both link: the HTTP client, the command-line
# convention, the TOML reader.
SHARED = ("http", "args", "toml")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def includes(path):
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = INCLUDE.match(line)
        if m:
            yield n, m.group(1)


def main(root):
    root = pathlib.Path(root)
    core, plugins = root / "core", root / "plugins"
    host_dirs = {p.name for p in core.iterdir() if p.is_dir()}
    problems, checked = [], 0
    for f in sorted(core.rglob("*")):
        if f.suffix not in (".h", ".cpp"):
            continue
        checked += 1
        rel = f.relative_to(core)
        parts = rel.parts
        job = parts[1] if parts[0] == "gateway" and len(parts) == 3 else None
        for n, inc in includes(f):
            where = f"{f.relative_to(root)}:{n}: #include \"{inc}\""
            if inc.startswith("plugins/"):
                problems.append(f"{where}: the host includes a plugin's header")
            if job is None or not inc.startswith("gateway/"):
                continue
            target = inc.split("/")
            if target == ["gateway", "gateway.h"]:
                problems.append(f"{where}: {job}/ includes the router; use request/request_context.h")
            elif len(target) == 3 and target[1] != job:
                if target[1] not in ORDER or ORDER.index(target[1]) > ORDER.index(job):
                    allowed = ", ".join(ORDER[: ORDER.index(job)]) or "none"
                    problems.append(f"{where}: {job}/ may include {allowed} (core/gateway/README.md)")
    for f in sorted(plugins.rglob("*")):
        if f.suffix not in (".h", ".cpp", ".cu", ".cuh"):
            continue
        checked += 1
        rel = f.relative_to(plugins)
        if rel.parts[0] == "decoder" and len(rel.parts) >= 3:
            job = rel.parts[1]
            for n, inc in includes(f):
                target = inc.split("/")[0]
                if "/" not in inc or target not in DECODER_ORDER or target == job:
                    continue
                if (str(rel.relative_to("decoder")), inc) in DECODER_EXCEPTIONS:
                    continue
                if job not in DECODER_ORDER or DECODER_ORDER.index(target) > DECODER_ORDER.index(job):
                    allowed = (", ".join(DECODER_ORDER[: DECODER_ORDER.index(job)]) if job in DECODER_ORDER else "") or "none"
                    problems.append(f"{f.relative_to(root)}:{n}: #include \"{inc}\": decoder/{job}/ may include {allowed} (plugins/decoder/README.md)")
        for n, inc in includes(f):
            head = inc.split("/")[0]
            if "/" in inc and head in host_dirs and head not in SHARED:
                problems.append(f"{f.relative_to(root)}:{n}: #include \"{inc}\": a plugin includes a host header (only {', '.join('core/' + d for d in SHARED)} are shared)")
    for p in problems:
        print(p)
    print(f"layout: {checked} files, {len(problems)} violations")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
