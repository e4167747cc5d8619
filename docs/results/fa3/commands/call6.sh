#!/usr/bin/env bash
# Device call 6 (2026-12-01 fourth session): why d = 64 causal at N = 2k trails cuDNN (0.87×) when
# N = 16k leads (1.10×): ncu on one fa3 launch of each (and non-causal N = 2k), SM activity
# (active cycles mean/min against elapsed: idle SMs in the grid's tail), occupancy, warp stalls.
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
for shape in "2048 on" "2048 off" "16384 on"; do
  set -- $shape
  timeout 60 ncu --kernel-name regex:fa3_forward --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --metrics sm__cycles_active.avg,sm__cycles_active.min,sm__cycles_active.max,sm__cycles_elapsed.max \
    bundle/bin/flash-attn bench --algorithms fa3 --seqlens $1 --head-dims 64 --causal $2 --no-max-seqlen \
    --out-dir $w/b-$1-$2 > $w/ncu-$1-$2.txt 2>&1
  echo "ncu $1 $2 rc=$? at $((SECONDS-t0))s"
  grep -E "sm__cycles|Duration|Achieved Occupancy|Waves Per SM|Compute \(SM\) Throughput|Stall|Grid Size" $w/ncu-$1-$2.txt | head -14
done
tar czf $out/call6.tgz -C $w .
