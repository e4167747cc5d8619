#!/usr/bin/env bash
# Device call 3 (2026-12-01, nvidia-h200): RESCALE_THRESHOLD 2 (the bundle's binaries, v6t2.ptx)
# against 8 (v6t8.ptx, calls 1-2): call 1's failing seed, the numerics tests, an A/B of the two
# thresholds (and v5 at d = 96, 256), then compute-sanitizer's four tools over fa2-tc (f16, bf16)
# as parallel processes for the rest of the call.
set -u
out=$1; w=$(mktemp -d)
step() { local name=$1 t=$2; shift 2; echo "== $name"; timeout $t "$@" > $w/$name.log 2>&1; echo "   rc=$? at ${SECONDS}s"; }
ab() { timeout $1 bash scripts/ab_variants.sh $w/ab "${@:2}" 2>&1 | tee -a $w/ab.txt; echo "   at ${SECONDS}s"; }
FLASH_ATTN_SEED=3897348449739562757 step tilings 100 bundle/bin/test-gpu_attention every_fa2_tc_tiling --test-threads=1 --show-output
step numerics 100 bundle/bin/test-gpu_numerics --test-threads=1 --show-output
grep -h "FAILED\|near the bound\|cases\|worst\|test result" $w/tilings.log $w/numerics.log | head -30
export SEQLENS=2048,8192
TILING=4x2s1c64 HEAD_DIMS=128 ab 150 v6t8 v6t2 v6t8 v6t2
TILING=4x2s2c64 HEAD_DIMS=64 ab 80 v6t8 v6t2
export SEQLENS=4096
TILING=4x2s1c64 HEAD_DIMS=96 ab 60 v5 v6t8 v6t2
TILING=4x1s1c64 HEAD_DIMS=256 ab 60 v5 v6t8 v6t2
mkdir -p $w/san
for tool in memcheck racecheck synccheck initcheck; do for dt in f16 bf16; do
  timeout $((575-SECONDS)) compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
    bundle/bin/flash-attn check --require-gpu --shapes sanitizer --algorithms fa2-tc --dtypes $dt \
    > $w/san/$tool-$dt.log 2>&1 &
done; done
wait
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) cases ok, $(grep -h 'SUMMARY' $f)"; done
tar czf $out/call3.tgz -C $w .
