#!/usr/bin/env bash
# Device call 34 (eleventh session, 2026-12-02): FA3's packed kernels with the empty-block test
# moved to thread 0 (the tile slot, published with the barriers' init) instead of every warp
# before the split. At most 300 s.
# A, in parallel (170 s): the packed grid (bit for bit against the dense kernel per sequence;
#    mixed lengths with empty row blocks), check --packed (f64), and memcheck, synccheck and
#    racecheck of check --packed (fa3, bf16).
# B, timing alone, twice: packed / dense.
# Bundle: `cargo xtask bundle` at the session's head, keeping flash-attn and test-gpu_packed.
# Run: bash bundle/call34.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call34.tgz -C $w .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; shift; ( timeout $(until_s 170) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
job packed bin/test-gpu_packed --test-threads=2
job check_packed bin/flash-attn check --require-gpu --packed
for tool in memcheck synccheck racecheck; do
  job san_$tool compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --packed --dtypes bf16 --algorithms fa3
done
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$|FAIL \[|cases, " $w/t/*.log | cut -c1-300 | head -20
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" $w/t/*.log; tail -qn1 $w/t/check_packed.log $w/t/san_*.log | cut -c1-200
grep -c "→ pass" $w/t/check_packed.log $w/t/san_*.log
echo "correctness at $((SECONDS-t0))s"; save
for round in 1 2; do
  timeout 50 bin/test-gpu_packed --ignored --nocapture time_packed > $w/packed-timing-$round.log 2>&1
  echo "packed timing $round rc=$? at $((SECONDS-t0))s"; grep "packed / dense" $w/packed-timing-$round.log | cut -c1-200; save
done
echo "done at $((SECONDS-t0))s"; save
