#!/usr/bin/env bash
# Device call 1 (2026-12-01 second session, nvidia-h200): #6's last open point, the B_c = 48
# tiling `4x2s2c48` (0 spills) at d = 128 beside the default `4x2s1c64` (92 B spills) and
# PyTorch flash, alternated in one call; its correctness (check, tilings test) and the four
# sanitizer tools on it. Then #5's cost model: FA1 under racecheck, one case at a time, timed.
set -u
out=$1; w=$(mktemp -d)
step() { local name=$1 t=$2; shift 2; echo "== $name"; local t0=$SECONDS; timeout $t "$@" > $w/$name.log 2>&1; echo "   rc=$? in $((SECONDS-t0))s (at ${SECONDS}s)"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
step check 60 bundle/bin/flash-attn check --require-gpu --algorithms fa2-tc --head-dims 128 --fa2-tc-tiling 4x2s2c48
tail -n 1 $w/check.log
step torch1 60 python3 scripts/torch_sdpa_bench.py --backends torch-flash --out $w/torch1.json --seqlens 2048,4096,8192 --head-dims 128
for round in 1 2; do
  for t in 4x2s1c64 4x2s2c48; do
    step bench-$t-$round 50 bundle/bin/flash-attn bench --algorithms fa2-tc --seqlens 2048,4096,8192 --head-dims 128 --fa2-tc-tiling $t --no-max-seqlen --out-dir $w/bench-$t-$round
  done
done
step torch2 60 python3 scripts/torch_sdpa_bench.py --backends torch-flash --out $w/torch2.json --seqlens 2048,4096,8192 --head-dims 128
grep -h "d=" $w/torch1.log $w/torch2.log
for f in $w/bench-*/bench.md; do echo "-- $f"; grep -h "^| [0-9]" $f | grep -v GiB; done
step tilings 90 bundle/bin/test-gpu_attention every_fa2_tc_tiling --test-threads=1 --show-output
grep -h "FAILED\|near the bound\|cases\|test result" $w/tilings.log | head
mkdir -p $w/san
for tool in memcheck racecheck synccheck initcheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
    bundle/bin/flash-attn check --require-gpu --shapes sanitizer --algorithms fa2-tc --dtypes f16,bf16 \
    --head-dims 128 --fa2-tc-tiling 4x2s2c48 > $w/san/$tool-c48.log 2>&1 &
done
wait
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) cases ok, $(grep -h 'SUMMARY' $f)"; done
echo "san done at ${SECONDS}s"
# FA1 under racecheck, alone on the GPU, one case per process: d = 8 (calibration) then a missing case.
rc1() { local name=$1 t=$2; shift 2; step race-$name $t compute-sanitizer --tool racecheck --error-exitcode 99 --print-limit 20 \
  bundle/bin/flash-attn check --require-gpu --shapes sanitizer --algorithms fa1 --seqlens 1000 "$@"; grep -h " ok$\|SUMMARY" $w/race-$name.log; }
rc1 d8-f32 120 --dtypes f32 --head-dims 8 --causal off
tar czf $out/call1.tgz -C $w .
rc1 d40-f16-causal $((585-SECONDS)) --dtypes f16 --head-dims 40 --causal on
tar czf $out/call1.tgz -C $w .
