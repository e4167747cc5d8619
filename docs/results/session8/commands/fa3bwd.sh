#!/usr/bin/env bash
# Device call fa3bwd (prepared in the eighth session, 2026-12-01), branch fa3-bwd: FlashAttention-3's
# backward on Hopper (`fa3`, the default backward on compute capability 9.0), never run on a GPU
# before. A, correctness in parallel: the backward GPU tests (fa3 grid, random shapes, fa2-tc
# asked for by name), the GQA tests (every backward algorithm, fa3's grouped kernels),
# `check --backward` on fa3, compute-sanitizer memcheck and synccheck on a small odd shape.
# B, timing alone: PyTorch's backward (flash, cuDNN), then fa3 against fa2-tc, bf16,
# d = 64 and 128, N = 2k, 4k, 8k, causal both (B·N = 16384 tokens, H·d = 2048).
# The bundle: `cargo xtask bundle` on fa3-bwd. Run: bash docs/results/session8/commands/fa3bwd.sh $OUT
# (from the folder that holds bundle/). At most ~400 s.
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/fa3bwd.tgz -C $w .; }
left() { local l=$((390 - (SECONDS - t0))); [ $l -gt $1 ] && echo $1 || echo $((l > 5 ? l : 5)); }
cd bundle
for f in ptx/*.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; limit=$2; shift 2; ( timeout $(left $limit) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
small="--seqlens 113 --head-dims 64,128 --dtypes bf16 --algorithms fa2-tc --backward --backward-algorithms fa3"
job gpu_backward 200 bin/test-gpu_backward --test-threads=4
job gpu_gqa 200 bin/test-gpu_gqa --test-threads=2
job check_backward 200 bin/flash-attn check --require-gpu --backward --backward-algorithms fa3
job memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu $small
job synccheck 200 compute-sanitizer --tool synccheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu $small
bin/flash-attn plan --shape 2,8,1000,128 --backward > $w/t/plan.log 2>&1
bin/flash-attn plan --shape 2,8,1000,128 --kv-heads 2 --backward >> $w/t/plan.log 2>&1
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$" $w/t/*.log | cut -c1-250 | head -30
grep -h "ERROR SUMMARY" $w/t/memcheck.log $w/t/synccheck.log; tail -qn2 $w/t/check_backward.log
grep -h "fa3" $w/t/plan.log | cut -c1-300
echo "A done at $((SECONDS-t0))s"; save
shapes="--seqlens 2048,4096,8192 --head-dims 64,128 --causal both"
timeout $(left 80) python3 scripts/torch_backward_bench.py $shapes --out $w/torch-bwd.json > $w/torch-bwd.log 2>&1
echo "torch-bwd rc=$? at $((SECONDS-t0))s"; save
timeout $(left 110) bin/flash-attn bench --backward --backward-variants fa3,fa2-tc $shapes --torch $w/torch-bwd.json \
  --out-dir $w/bwd > $w/bwd.log 2>&1
echo "bwd rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/bwd/backward.md | head -30
grep -o '"plan": "fa3[^"]*' $w/bwd/backward.json | sort | uniq -c | cut -c1-200 | head -4
echo "done at $((SECONDS-t0))s"; save
