#!/usr/bin/env bash
# Device call 4 (2026-12-01, nvidia-h200): K/V blocks computed in steps of 32 keys (`k32`
# tilings, 0 spills at d = 128 with two stages) against B_c = 64 in one step, at d = 128 (and 96);
# v6t2.ptx is commit a4d7a88 (calls 1-3), the bundle's binaries and v7.ptx this commit. Then
# PyTorch flash and the full sweep, the correctness tests, and compute-sanitizer over fa2-tc's
# defaults and over d = 128 with each k32 tiling.
set -u
out=$1; w=$(mktemp -d)
step() { local name=$1 t=$2; shift 2; echo "== $name"; timeout $t "$@" > $w/$name.log 2>&1; echo "   rc=$? at ${SECONDS}s"; }
ab() { timeout $1 bash scripts/ab_variants.sh $w/ab "${@:2}" 2>&1 | tee -a $w/ab.txt; echo "   at ${SECONDS}s"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
step check 60 bundle/bin/flash-attn check --require-gpu --algorithms fa2-tc
tail -n 1 $w/check.log
export SEQLENS=2048,8192
TILING=4x2s1c64 HEAD_DIMS=128 ab 40 v6t2
for t in 4x2s1c64 4x2s2c64k32 4x2s1c64k32; do TILING=$t HEAD_DIMS=128 ab 40 v7; done
TILING=4x2s1c64 HEAD_DIMS=128 ab 40 v6t2
for t in 4x2s2c64k32 4x2s1c64k32; do TILING=$t HEAD_DIMS=128 ab 40 v7; done
export SEQLENS=4096
for t in 4x2s1c64 4x2s2c64k32 4x2s1c64k32; do TILING=$t HEAD_DIMS=96 ab 30 v7; done
unset SEQLENS
step torch 100 python3 scripts/torch_sdpa_bench.py --backends torch-flash --out $w/torch.json --seqlens 2048,4096,8192 --head-dims 32,64,96,128,256
step bench 120 bundle/bin/flash-attn bench --algorithms fa2-tc --seqlens 2048,4096,8192 --head-dims 32,64,96,128,256 --no-max-seqlen --out-dir $w/bench
for t in 4x2s2c64k32 4x2s1c64k32; do
  step bench-$t 40 bundle/bin/flash-attn bench --algorithms fa2-tc --seqlens 2048,4096,8192 --head-dims 128 --fa2-tc-tiling $t --no-max-seqlen --out-dir $w/bench-$t
done
grep "d=" $w/torch.log; grep -h "^| [0-9]" $w/bench/bench.md $w/bench-*/bench.md | grep -v GiB
step tilings 120 bundle/bin/test-gpu_attention every_fa2_tc_tiling --test-threads=1 --show-output
step numerics 100 bundle/bin/test-gpu_numerics --test-threads=1 --show-output
grep -h "FAILED\|near the bound\|cases\|worst\|test result" $w/tilings.log $w/numerics.log | head -30
mkdir -p $w/san
san() { # name check-args...
  local name=$1; shift
  for tool in memcheck racecheck synccheck initcheck; do
    timeout $((575-SECONDS)) compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      bundle/bin/flash-attn check --require-gpu --shapes sanitizer --algorithms fa2-tc "$@" \
      > $w/san/$tool-$name.log 2>&1 &
  done
}
san default-f16 --dtypes f16
san default-bf16 --dtypes bf16
san d128-s2k32 --dtypes f16,bf16 --head-dims 128 --fa2-tc-tiling 4x2s2c64k32
san d128-s1k32 --dtypes f16,bf16 --head-dims 128 --fa2-tc-tiling 4x2s1c64k32
wait
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) cases ok, $(grep -h 'SUMMARY' $f)"; done
[ $SECONDS -lt 480 ] && step grid $((570-SECONDS)) bundle/bin/test-gpu_attention fa1_and_fa2_pass_the_grid --test-threads=1 --show-output && grep -h "cases" $w/grid.log
tar czf $out/call4.tgz -C $w .
