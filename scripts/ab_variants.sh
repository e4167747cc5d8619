#!/usr/bin/env bash
# A/B timing of fa2-tc kernel variants with one host binary: each bundle/ptx/NAME.ptx(.gz) is
# loaded through FLASH_ATTN_PTX (host/src/device.rs) and run over the same shapes, in the order
# given, so the variants share one device session. Run from the repository root after
# `cargo xtask bundle`; build a variant's PTX with `cargo xtask ptx` (target/ptx/).
# Usage: scripts/ab_variants.sh OUT_DIR NAME... (SEQLENS, HEAD_DIMS, CAUSAL override the shapes)
set -euo pipefail
out=${1:?usage: scripts/ab_variants.sh OUT_DIR NAME...}
shift
mkdir -p "$out"
for name in "$@"; do
  ptx=bundle/ptx/$name.ptx
  [ -f "$ptx" ] || gunzip -kf "$ptx.gz"
  FLASH_ATTN_PTX=$ptx bundle/bin/flash-attn bench --algorithms fa2-tc \
    --seqlens "${SEQLENS:-2048,8192}" --head-dims "${HEAD_DIMS:-64,128}" \
    --causal "${CAUSAL:-both}" --no-max-seqlen --out-dir "$out/$name" > "$out/$name.log" 2>&1
  echo "== $name"
  grep '^| [0-9]' "$out/$name/bench.md" | grep -v GiB | head -24
done
