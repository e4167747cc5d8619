#!/usr/bin/env python3
"""Writes a PTX module holding only the entry points whose names match a regex, for A/B timing
through FLASH_ATTN_PTX: the driver JIT-compiles a whole module on load, and the main module's
hundred-odd kernels take over a minute; a subset of the kernels one benchmark runs takes seconds.

Usage: lab/scripts/ptx_subset.py IN.ptx OUT.ptx REGEX
Keeps the header and the module-level declarations (.func prototypes, .extern .shared), every
`.func` definition (the panic stubs the entries may call), and every `.visible .entry NAME(...)
{...}` whose NAME matches REGEX (re.fullmatch)."""
import re
import sys

source, target, pattern = sys.argv[1:4]
text = open(source).read()
starts = [m.start() for m in re.finditer(r"^(\.visible \.entry |\.func \w+\()", text, re.M)]
if not starts:
    sys.exit(f"{source}: no entry points")
# An entry runs to the next entry (or the end); the LLVM comment before each `.visible` line
# belongs to the previous block, which is harmless.
pieces, kept = [text[: starts[0]]], []
for start, end in zip(starts, starts[1:] + [len(text)]):
    entry = re.match(r"\.visible \.entry (\w+)", text[start:])
    if entry is None:
        pieces.append(text[start:end])
    elif re.fullmatch(pattern, entry.group(1)):
        pieces.append(text[start:end])
        kept.append(entry.group(1))
if not kept:
    sys.exit(f"no entry point of {source} matches {pattern!r}")
open(target, "w").write("".join(pieces))
print(f"{len(kept)} entry points in {target}")
