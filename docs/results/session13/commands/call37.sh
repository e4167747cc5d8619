#!/usr/bin/env bash
# Device call 37 (thirteenth session): every GPU test binary and `check` mode of dbd4da7's bundle,
# in parallel (the regression run after the packed path's refactor). At most 500 s.
# Run: bash bundle/call37.sh $OUT (carry bundle; bench-attention, test-safetensors_io, test-gpu_window
# and the Python wheel left out for size: the window grid ran in call 35).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
for mode in backward decode packed; do
  ( timeout 480 bin/flash-attn check --require-gpu --$mode > $w/check-$mode.log 2>&1; echo "check-$mode rc=$?" > $w/check-$mode.rc ) &
done
( timeout 480 bin/flash-attn check --require-gpu > $w/check-forward.log 2>&1; echo "check-forward rc=$?" > $w/check-forward.rc ) &
for t in bin/test-*; do
  n=$(basename $t)
  ( timeout 480 $t --test-threads=2 > $w/$n.log 2>&1; echo "$n rc=$?" > $w/$n.rc ) &
done
wait
cat $w/*.rc; grep -hE "^test result|panicked|FAILED|check: " $w/*.log | cut -c1-200
grep -h "FAIL" $w/check-*.log | head -5 | cut -c1-250
echo "done at $((SECONDS-t0))s"; tar czf $out/call37.tgz -C $w .
