#!/usr/bin/env bash
# Device call 5 (2026-12-01 fourth session): d = 64 causal at N = 2k and 4k, where call 4 missed
# cuDNN (0.87×, 0.94×): FA3's other compiled d = 64 tilings, the default (w3c128) twice around them.
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
for t in w3c128 w3c96 w3c64 w2c128 w3c128; do
  n=$((${n:-0}+1))
  timeout 40 bundle/bin/flash-attn bench --algorithms fa3 --fa3-tiling $t --seqlens 2048,4096 --head-dims 64 \
    --causal both --no-max-seqlen --out-dir $w/$n-$t > $w/$n-$t.log 2>&1
  echo "$n-$t rc=$? at $((SECONDS-t0))s"; grep -E "^\| [0-9]" $w/$n-$t/bench.md | head -4
done
tar czf $out/call5.tgz -C $w .
