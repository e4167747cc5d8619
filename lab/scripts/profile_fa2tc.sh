#!/usr/bin/env bash
# Nsight Compute profile of fa2-tc beside PyTorch's FlashAttention-2 kernel on the same shape:
# speed of light, pipes, issue slots, warp stall reasons, occupancy, shared-memory conflicts.
# Run on the GPU machine from the repository root, with the bundle built (`cargo xtask bundle`).
# Usage: lab/scripts/profile_fa2tc.sh OUT_DIR [HEAD_DIM] [CAUSAL: off|on] [SEQLEN]
# FLASH_ATTN_PTX=file.ptx profiles a kernel variant (see host/src/device/module.rs).
set -euo pipefail
out=${1:?usage: lab/scripts/profile_fa2tc.sh OUT_DIR [HEAD_DIM] [off|on] [SEQLEN]}
d=${2:-128}
causal=${3:-off}
n=${4:-8192}
mkdir -p "$out"
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats
  --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats
  --section MemoryWorkloadAnalysis_Tables --section SourceCounters
  --metrics 'regex:^(smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|sm__pipe_tensor_op_hmma_cycles_active\.avg\.pct_of_peak_sustained_active)$')
tag="d${d}_causal-${causal}_n${n}"
ncu --clock-control none "${sections[@]}" -k regex:fa2tc --launch-skip 5 --launch-count 1 \
  bundle/bin/flash-attn bench --algorithms fa2-tc --seqlens "$n" --head-dims "$d" \
  --causal "$causal" --no-max-seqlen --out-dir "$out/bench-$tag" > "$out/ours_$tag.txt" 2>&1
ncu --clock-control none "${sections[@]}" -k regex:flash_fwd --launch-skip 5 --launch-count 1 \
  python3 lab/scripts/torch_sdpa_bench.py --out "$out/torch_$tag.json" --seqlens "$n" \
  --head-dims "$d" --causal "$causal" > "$out/torch_$tag.txt" 2>&1
