#!/usr/bin/env python3
# embed.py INPUT OUTPUT NAME: writes a C++ header holding INPUT's bytes as
# `inline constexpr unsigned char NAME[]` (no terminating NUL), so a file ships inside the binary.
import sys

src, dst, name = sys.argv[1:4]
data = open(src, "rb").read()
with open(dst, "w") as out:
    out.write(f"// Generated from {src.rsplit('/', 1)[-1]} by embed.py; do not edit.\n#pragma once\n")
    out.write(f"inline constexpr unsigned char {name}[] = {{\n")
    for i in range(0, len(data), 20):
        out.write("    " + ", ".join(str(b) for b in data[i:i + 20]) + ",\n")
    out.write("};\n")
