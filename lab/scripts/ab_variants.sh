#!/usr/bin/env bash
# A/B timing of fa2-tc kernel variants with one host binary: each bundle/ptx/NAME.ptx(.gz) is
# loaded through FLASH_ATTN_PTX (host/src/device/module.rs) and run over the same shapes, in the order
# given, so the variants share one device session. Run from the repository root after
# `cargo xtask bundle`; build a variant's PTX with `cargo xtask ptx` (target/ptx/).
# Usage: lab/scripts/ab_variants.sh OUT_DIR NAME... (SEQLENS, HEAD_DIMS, CAUSAL override the shapes;
# TILING picks a tiling, e.g. 4x2s1)
set -euo pipefail
out=${1:?usage: lab/scripts/ab_variants.sh OUT_DIR NAME...}
shift
mkdir -p "$out"
for name in "$@"; do
  ptx=bundle/ptx/$name.ptx
  [ -f "$ptx" ] || gunzip -kf "$ptx.gz"
  run=$name${TILING:+-$TILING}
  FLASH_ATTN_PTX=$ptx bundle/bin/flash-attn bench --algorithms fa2-tc \
    --seqlens "${SEQLENS:-2048,8192}" --head-dims "${HEAD_DIMS:-64,128}" \
    --causal "${CAUSAL:-both}" ${TILING:+--fa2-tc-tiling "$TILING"} --no-max-seqlen \
    --out-dir "$out/$run" > "$out/$run.log" 2>&1
  echo "== $run"
  grep '^| [0-9]' "$out/$run/bench.md" | grep -v GiB | head -24
done
