#!/usr/bin/env bash
# Device call 3 (2026-12-01 fourth session, nvidia-h200): FA3 with Õ's rescale moved between the
# issue of S_{j+1} and of P̃_j·V_j (FlashAttention-3's order), d = 64 on three consumers.
# 1. Correctness: `check` of fa3; the grid test binary (every algorithm; every FA3 tiling at its
#    head dim and 8 below, asserting the FA3 kernel ran); the four compute-sanitizer tools on fa3
#    at the sanitizer shapes.
# 2. Timing alone: this module against call 2's (bundle/ptx/fa3v2.ptx), alternated twice, N = 4096;
#    d = 64's other tilings (w2c128, w3c96, w3c64).
set -u
for v in fa3v2; do [ -f bundle/ptx/$v.ptx ] || gunzip -kf bundle/ptx/$v.ptx.gz; done
out=$1; w=$(mktemp -d); mkdir -p $w/san
save() { tar czf $out/call3.tgz -C $w .; }
t0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 120 bundle/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16,f16 > $w/check.log 2>&1
echo "check rc=$? at $((SECONDS-t0))s"; tail -1 $w/check.log
( FLASH_ATTN_REQUIRE_GPU=1 timeout 300 bundle/bin/test-gpu_attention --test-threads=1 --show-output > $w/grid.log 2>&1
  echo "grid rc=$?" > $w/grid.rc ) &
for tool in memcheck synccheck initcheck racecheck; do
  ( timeout 250 compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      bundle/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16 --shapes sanitizer \
      > $w/san/$tool.log 2>&1; echo "$tool rc=$?" >> $w/san/rc.txt ) &
done
wait
cat $w/grid.rc $w/san/rc.txt; grep -E "test result|cases, " $w/grid.log | tail -8
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) ok, $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' $f | head -1)"; done
echo "correctness done at $((SECONDS-t0))s"; save
ours() {  # run name, hopper module, extra args
  FLASH_ATTN_HOPPER_PTX=$2 timeout 100 bundle/bin/flash-attn bench --no-max-seqlen --out-dir $w/$1 "${@:3}" > $w/$1.log 2>&1
  echo "$1 rc=$? at $((SECONDS-t0))s"
}
main="--algorithms fa3 --seqlens 4096 --head-dims 64,128 --causal both"
for v in v2 v3 v3 v2; do
  n=$((${n:-0}+1)); [ $v = v3 ] && m="" || m=bundle/ptx/fa3v2.ptx
  ours $n-$v "$m" $main
done
ours 96-v3 "" --algorithms fa3 --seqlens 4096 --head-dims 96,256 --causal both
ours 96-v2 bundle/ptx/fa3v2.ptx --algorithms fa3 --seqlens 4096 --head-dims 96,256 --causal both
for t in w2c128 w3c96 w3c64; do ours d64-$t "" --algorithms fa3 --fa3-tiling $t --seqlens 4096 --head-dims 64 --causal both; done
for f in $w/*/bench.md; do echo "== $f"; grep -E "^\| [0-9]" $f | head -4; done
save
