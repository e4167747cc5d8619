#!/usr/bin/env bash
# Device call 2 (2026-12-01 third session, nvidia-h200): the final code of issue 13.
# 1. The kernels whose machine code changed (fa2, fa1, standard's softmax; every fa2-tc kernel's
#    SASS is identical to 9a44f73) timed against the pre-refactor module with one binary, and
#    fa2-tc once each way as a control; then `check` and the grid on the final code.
# 2. The main job, `bundle/run-bench.sh`: PyTorch's SDPA backends and ours over the papers' sweep,
#    one merged table in the new format, the chart, ncu's HBM traffic.
set -u
for v in base house; do [ -f bundle/ptx/$v.ptx ] || gunzip -kf bundle/ptx/$v.ptx.gz; done
out=$1; w=$(mktemp -d)
save() { tar czf $out/call2.tgz -C $w .; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
t0=$SECONDS
ours() {  # variant, run name, algorithms, seqlens, head dims, causal
  FLASH_ATTN_PTX=bundle/ptx/$1.ptx bundle/bin/flash-attn bench --algorithms $3 --seqlens $4 \
    --head-dims $5 --causal $6 --no-max-seqlen --out-dir $w/$2 > $w/$2.log 2>&1
  echo "$2 rc=$? at $((SECONDS-t0))s"
}
for v in base house house base; do
  n=$((${n:-0}+1))
  ours $v scalar-$n-$v fa2,fa1,standard 2048 64,128 both
done
ours base tc-base fa2-tc 4096 64,128 off
ours house tc-house fa2-tc 4096 64,128 off
timeout 60 bundle/bin/flash-attn check --require-gpu > $w/check.log 2>&1; echo "check rc=$?"; tail -n 1 $w/check.log
for d in 64 128 160 192; do bundle/bin/flash-attn plan --shape 4,16,4096,$d --algorithms fa2,fa2-tc; done > $w/plans.txt 2>&1
cat $w/plans.txt
save
timeout $((560-SECONDS)) bash bundle/run-bench.sh $w/results > $w/run-bench.log 2>&1
echo "run-bench rc=$? at $((SECONDS-t0))s"
grep -A40 "^| d |" $w/results/bench.md | head -40
save
# 3. The grid on the final code, in what time is left.
timeout $((595-SECONDS)) bundle/bin/test-gpu_attention fa1_and_fa2_pass_the_grid --test-threads=1 --show-output > $w/grid.log 2>&1
echo "grid rc=$? at $((SECONDS-t0))s"; grep -h "cases" $w/grid.log
save
