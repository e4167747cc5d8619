#!/usr/bin/env bash
# Device call 2 (2026-12-01 second session, nvidia-h200): FA1 with 4 × 4 register blocks fed by
# 16-byte shared-memory reads. Correctness first (check, the grid, the randomized test), a quick
# FA1 timing, then compute-sanitizer's racecheck over every FA1 sanitizer case (one process per
# dtype), then memcheck, synccheck and initcheck over FA1 as far as the time allows.
set -u
out=$1; w=$(mktemp -d); mkdir -p $w/san
step() { local name=$1 t=$2; shift 2; echo "== $name"; local t0=$SECONDS; timeout $t "$@" > $w/$name.log 2>&1; echo "   rc=$? in $((SECONDS-t0))s (at ${SECONDS}s)"; }
save() { tar czf $out/call2.tgz -C $w .; }
step check 60 bundle/bin/flash-attn check --require-gpu --algorithms fa1
tail -n 1 $w/check.log
step bench-fa1 90 bundle/bin/flash-attn bench --algorithms fa1 --seqlens 2048 --head-dims 64,128 --no-max-seqlen --out-dir $w/bench-fa1
grep -h "^| [0-9]" $w/bench-fa1/bench.md | grep -v GiB
# FA1 under racecheck, one process per dtype, started now; the rest runs beside it.
race_t0=$SECONDS
for dt in f32 f16 bf16; do
  ( t0=$SECONDS; timeout 540 compute-sanitizer --tool racecheck --error-exitcode 99 --print-limit 20 \
      bundle/bin/flash-attn check --require-gpu --shapes sanitizer --algorithms fa1 --dtypes $dt \
      > $w/san/racecheck-fa1-$dt.log 2>&1; echo "racecheck $dt rc=$? in $((SECONDS-t0))s" >> $w/san/times.txt ) &
done
step grid 120 bundle/bin/test-gpu_attention fa1_and_fa2_pass_the_grid --test-threads=1 --show-output
grep -h "cases" $w/grid.log
step numerics 120 bundle/bin/test-gpu_numerics --test-threads=1 --show-output
grep -h "cases passed\|test result" $w/numerics.log
save
wait
cat $w/san/times.txt
for f in $w/san/racecheck-*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) cases ok, $(grep -h 'SUMMARY' $f)"; done
save
left=$((585-SECONDS))
if [ $left -gt 40 ]; then
  for tool in memcheck synccheck initcheck; do
    timeout $left compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      bundle/bin/flash-attn check --require-gpu --shapes sanitizer --algorithms fa1 > $w/san/$tool-fa1.log 2>&1 &
  done
  wait
  for f in $w/san/{memcheck,synccheck,initcheck}-fa1.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) cases ok, $(grep -h 'SUMMARY' $f)"; done
fi
save
