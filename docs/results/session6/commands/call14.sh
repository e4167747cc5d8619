#!/usr/bin/env bash
# Device call 14 (2026-12-01 sixth session): branch gqa merged with main, in one bundle.
# A, correctness in parallel: every test binary (gpu_gqa new; gpu_backward with the standard
#    backward, never GPU-run before), check --backward, memcheck over the backward and decode tests.
# B, timing alone: main's kernels against gqa's (one extra division in BlockInfo), A B A B, for
#    fa2-tc (PTX subsets, FLASH_ATTN_PTX) and fa3 (whole Hopper modules, FLASH_ATTN_HOPPER_PTX),
#    PyTorch in the same call; the backward bench and its memory table.
# C, counters: ncu on one tensor-core backward launch, d = 128, N = 8k, non-causal.
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call14.tgz -C $w .; }
left() { local l=$((580 - (SECONDS - t0))); [ $l -gt $1 ] && echo $1 || echo $((l > 5 ? l : 5)); }
cd bundle
for f in ptx/*.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
( timeout 200 bin/flash-attn check --require-gpu --backward > $w/check.log 2>&1; echo "check rc=$?" > $w/t/check.rc ) &
for t in bin/test-*; do n=$(basename $t)
  ( timeout 230 $t --test-threads=2 > $w/t/$n.log 2>&1; echo "$n rc=$?" > $w/t/$n.rc ) &
done
for t in gpu_backward gpu_decode; do
  ( timeout 230 compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/test-$t --test-threads=1 \
      > $w/t/memcheck-$t.log 2>&1; echo "memcheck-$t rc=$?" > $w/t/memcheck-$t.rc ) &
done
wait
cat $w/t/*.rc; tail -2 $w/check.log
grep -hE "test result|panicked|FAILED" $w/t/*.log | sort | uniq -c | head -20
grep -h "ERROR SUMMARY" $w/t/memcheck-*.log
echo "A done at $((SECONDS-t0))s"; save
shapes="--seqlens 2048,8192 --head-dims 64,128 --causal both --no-max-seqlen"
timeout $(left 60) python3 scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $shapes --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"; save
bench() { name=$1; shift; timeout $(left 60) "$@" $shapes --torch $w/torch.json --out-dir $w/$name > $w/$name.log 2>&1
  echo "$name rc=$? at $((SECONDS-t0))s"; grep -E "^\| [0-9]" $w/$name/bench.md | grep -v GiB | head -8; save; }
for round in 1 2; do
  for v in main gqa; do
    FLASH_ATTN_PTX=ptx/${v}_fa2tc.ptx bench fa2tc-$v-$round bin/flash-attn bench --algorithms fa2-tc
    FLASH_ATTN_HOPPER_PTX=ptx/${v}_hopper.ptx bench fa3-$v-$round bin/flash-attn bench --algorithms fa3
  done
done
timeout $(left 90) python3 scripts/torch_backward_bench.py --out $w/torch-bwd.json > $w/torch-bwd.log 2>&1
echo "torch-bwd rc=$? at $((SECONDS-t0))s"; save
timeout $(left 90) bin/flash-attn bench --backward --quick --torch $w/torch-bwd.json --out-dir $w/bwd > $w/bwd.log 2>&1
echo "bwd rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/bwd/backward.md | head -30; save
timeout $(left 60) bin/flash-attn bench --backward --memory --out-dir $w/bwd-mem > $w/bwd-mem.log 2>&1
echo "bwd-mem rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/bwd-mem/backward.md | head -30; save
timeout $(left 90) ncu --kernel-name regex:fa2tc_backward --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  --section ComputeWorkloadAnalysis --metrics smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
  bin/flash-attn bench --backward --backward-variants fa2-tc --seqlens 8192 --head-dims 128 --causal off --no-max-seqlen \
  --out-dir /tmp/ncu-bwd > $w/ncu-bwd.txt 2>&1
echo "ncu rc=$? at $((SECONDS-t0))s"
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Stall|Registers|Achieved Occupancy|Issued Warp|No Eligible|Shared Memory|L1/TEX Hit|L2 Hit|Block Size|Grid Size|pipe_tensor|inst_executed|Bank" $w/ncu-bwd.txt | head -30
save
