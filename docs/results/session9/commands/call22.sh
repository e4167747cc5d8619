#!/usr/bin/env bash
# Device call 22 (ninth session, 2026-12-01), main at 0d415bd. No timing of new code: the GPU tests
# call 21 left unfinished (13 jobs in 200 s), run with few jobs and longer limits, then counters.
# A, correctness (5 jobs, 330 s at most): every fa2-tc and FA3 tiling after the mask clip change,
#    gpu_window's every-_local-kernel test (never run), the fa3 backward grids, the two-launch
#    decode grid and long caches, `check --decode` whole.
# B, ncu on one launch each: FA3's backward, d = 128, N = 4k, non-causal (--set full: tensor pipe,
#    L2 reductions of dQ, stalls), fa2-tc's backward on the same shape (the same set, to compare),
#    and FA3's forward at d = 128, N = 2k, packed against dense (the first 12 d = 128 launches of
#    test-gpu_packed's timing test: 11 packed, then 1 dense).
# Bundle: `cargo xtask bundle` on main. Run: bash bundle/call22.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call22.tgz -C $w .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; shift; ( timeout $(until_s 330) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
job tilings bin/test-gpu_attention every_ --test-threads=2
job window bin/test-gpu_window every_local_kernel --test-threads=1
job bwd_fa3 bin/test-gpu_backward fa3_gradients --test-threads=2
job decode bin/test-gpu_decode decode_passes_the_grid decode_long_caches decode_split_counts --test-threads=3
job check_decode bin/flash-attn check --require-gpu --decode
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$|FAIL \[" $w/t/*.log | cut -c1-300 | head -40
tail -qn1 $w/t/check_decode.log | cut -c1-300; grep -c "→ pass" $w/t/check_decode.log; grep -c "→ FAIL" $w/t/check_decode.log
echo "correctness at $((SECONDS-t0))s"; save
ncu_bwd() {
  timeout $(until_s $3) ncu --kernel-name regex:$1 --launch-skip 2 --launch-count 1 --set full \
    bin/flash-attn bench --backward --backward-variants $2 --seqlens 4096 --head-dims 128 --causal off \
    --no-max-seqlen --out-dir /tmp/ncu-$2 > $w/ncu-bwd-$2.txt 2>&1
  echo "ncu $2 rc=$? at $((SECONDS-t0))s"
}
ncu_bwd fa3_backward fa3 430
ncu_bwd fa2tc_backward fa2-tc 490
key="Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Executed Ipc|Issue Slots|No Eligible|Stall|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|L2 Hit|Shared Memory|Bank|Block Size|Grid Size|Tensor|Local Memory"
for v in fa3 fa2-tc; do echo "== $v"; grep -E "$key" $w/ncu-bwd-$v.txt | head -40; done
save
timeout $(until_s 570) ncu --kernel-name regex:fa3_forward_bf16_d128 --launch-count 12 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --section Occupancy --section InstructionStats --section ComputeWorkloadAnalysis \
  bin/test-gpu_packed --ignored --nocapture time_packed > $w/ncu-packed.txt 2>&1
echo "ncu packed rc=$? at $((SECONDS-t0))s"
grep -E "fa3_forward|Duration|Executed Ipc|Warp Cycles Per Issued|Executed Instructions |Stall|Registers Per|Grid Size" $w/ncu-packed.txt | tail -40
echo "done at $((SECONDS-t0))s"; save
