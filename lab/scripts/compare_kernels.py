#!/usr/bin/env python3
"""Compare two builds of the kernel module, kernel by kernel: PTX (normalised) and, if given,
SASS (as `cargo xtask sass` writes it to target/ptx/<module>.sass).

PTX is normalised per entry point: comments, .loc/.file lines dropped; labels and registers
renumbered in order of first use, so a renumbering alone is no difference. SASS is compared
instruction by instruction with addresses and branch targets masked.

Usage: lab/scripts/compare_kernels.py OLD.ptx NEW.ptx [OLD.sass NEW.sass]
Prints how many kernels are identical and lists the others; exits 0.
"""
import re
import sys


def ptx_kernels(path):
    text = open(path).read()
    out = {}
    for part in re.split(r"\n(?=\s*\.visible \.entry )", text)[1:]:
        name = re.match(r"\s*\.visible \.entry (\w+)", part).group(1)
        labels, regs, lines = {}, {}, []
        for line in part.splitlines():
            line = re.sub(r"//.*", "", line).rstrip()
            if not line.strip() or line.strip().startswith((".file", ".loc")):
                continue
            line = re.sub(r"\$L__\w+", lambda m: labels.setdefault(m.group(0), f"L{len(labels)}"), line)
            line = line.replace(name + "_param_", "P_")

            def rename(m):
                key = m.group(0)
                if key not in regs:
                    kind = m.group(1)
                    regs[key] = kind + str(sum(1 for k in regs if k.startswith(kind)))
                return regs[key]

            lines.append(re.sub(r"(%[a-z]+)\d+\b", rename, line))
        out[name] = lines
    return out


def sass_kernels(path):
    out = {}
    for part in re.split(r"\n\s*Function : ", open(path).read())[1:]:
        name = part.split("\n", 1)[0].strip()
        body = []
        for line in part.split("\n")[1:]:
            m = re.match(r"\s*/\*[0-9a-f]{4}\*/\s+(.*?)\s*;?\s*/\*", line)
            if m:
                body.append(re.sub(r"0x[0-9a-f]+", "ADDR", m.group(1)))
        out[name] = body
    return out


def compare(what, old, new):
    same = sorted(k for k in old if k in new and old[k] == new[k])
    differ = sorted(k for k in old if k in new and old[k] != new[k])
    print(f"{what}: {len(old)} kernels before, {len(new)} after; identical {len(same)}, differ {len(differ)}")
    for k in sorted(set(old) ^ set(new)):
        print(f"  only in {'old' if k in old else 'new'}: {k}")
    for k in differ:
        print(f"  differs: {k} ({len(old[k])} -> {len(new[k])} lines)")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 5):
        sys.exit(__doc__)
    compare("PTX", ptx_kernels(sys.argv[1]), ptx_kernels(sys.argv[2]))
    if len(sys.argv) == 5:
        compare("SASS", sass_kernels(sys.argv[3]), sass_kernels(sys.argv[4]))
