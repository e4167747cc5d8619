#!/usr/bin/env bash
# Device call 13 (2026-12-01 fifth session): counters for the remaining FA3 miss, d = 64 causal
# N = 2k (0.94× cuDNN): ncu on one launch of the persistent default (w3c128p) and of the one-tile
# w3c128, the committed kernels (bundle/ptx/fa3_rowend.ptx: call 11's module).
set -u
out=$1; cd bundle; gunzip -kf ptx/fa3_rowend.ptx.gz
for t in w3c128p w3c128; do
  FLASH_ATTN_HOPPER_PTX=ptx/fa3_rowend.ptx timeout 75 ncu --kernel-name regex:fa3_forward --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
    --metrics sm__cycles_active.avg,sm__cycles_active.min,sm__cycles_elapsed.max,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum \
    bin/flash-attn bench --algorithms fa3 --fa3-tiling $t --seqlens 2048 --head-dims 64 --causal on \
    --no-max-seqlen --out-dir /tmp/b-$t > $out/ncu-$t.txt 2>&1
  echo "$t rc=$?"; grep -E "Duration|sm__|Compute \(SM\) Throughput|Memory Throughput|Stall|Grid Size|Achieved Occupancy|Issued Warp|No Eligible" $out/ncu-$t.txt | head -24
done
