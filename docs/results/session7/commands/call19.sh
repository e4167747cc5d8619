#!/usr/bin/env bash
# Device call 19 (prepared in the seventh session, 2026-12-01), branch window-on-main: main (with
# the GQA backward) + window (sliding window and soft-capping). Correctness of both on the GPU,
# then the window's cost on fa2-tc's dense path (main's and window-on-main's PTX subsets through
# FLASH_ATTN_PTX, A B A B), then the standard backward timed at one shape.
# The bundle (64 MiB at most): `cargo xtask bundle` on window-on-main (main merged; it carries only
# the tests that need a GPU: 59.2 MiB); remove bin/bench-attention and bin/test-gpu_numerics
# (unused here) to make room; then
#   SUBSET='fa2tc_forward_bf16_d(64|128)_.*' scripts/ptx_variants.sh main=a119fc3 s7=.
# Run: bash docs/results/session7/commands/call19.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call19.tgz -C $w .; }
left() { local l=$((330 - (SECONDS - t0))); [ $l -gt $1 ] && echo $1 || echo $((l > 5 ? l : 5)); }
cd bundle
for f in ptx/*.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; limit=$2; shift 2; ( timeout $(left $limit) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
job gpu_gqa 300 bin/test-gpu_gqa --test-threads=2
job gpu_backward 300 bin/test-gpu_backward --test-threads=2
job gpu_window 300 bin/test-gpu_window --test-threads=2
job gpu_packed 300 bin/test-gpu_packed --test-threads=2
job gpu_attention 320 bin/test-gpu_attention --test-threads=2
job safetensors_io 200 bin/test-safetensors_io --test-threads=1
job check 300 bin/flash-attn check --require-gpu
job check_backward 300 bin/flash-attn check --require-gpu --backward
job check_decode 300 bin/flash-attn check --require-gpu --decode
job check_packed 300 bin/flash-attn check --require-gpu --packed
job python 300 ./run-python-tests.sh
job memcheck_bwd 300 compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --backward --seqlens 113 --head-dims 64 --dtypes bf16
job memcheck_window 300 compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --shapes window --dtypes bf16
job synccheck_window 300 compute-sanitizer --tool synccheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --shapes window --algorithms fa3 --dtypes bf16
bin/flash-attn plan --shape 2,8,1000,128 --kv-heads 2 --backward > $w/t/plan.log 2>&1
bin/flash-attn plan --shape 2,8,4096,128 --window 256,0 > $w/t/plan-window.log 2>&1
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$" $w/t/*.log | cut -c1-250 | head -30
grep -h "ERROR SUMMARY" $w/t/*check*.log; tail -qn2 $w/t/check.log $w/t/check_backward.log $w/t/check_decode.log $w/t/check_packed.log $w/t/python.log
echo "correctness at $((SECONDS-t0))s"; save
shapes="--seqlens 2048,8192 --head-dims 64,128 --causal both"
for round in 1 2; do
  for v in main s7; do
    FLASH_ATTN_PTX=ptx/${v}_main.ptx timeout 40 bin/flash-attn bench --algorithms fa2-tc $shapes --no-max-seqlen --out-dir $w/fa2tc-$v-$round > $w/fa2tc-$v-$round.log 2>&1
    echo "fa2tc-$v-$round rc=$? at $((SECONDS-t0))s: $(grep -E '^\| [0-9]' $w/fa2tc-$v-$round/bench.md | grep -v GiB | awk -F'|' '{printf "%s ", $7}')"
    save
  done
done
timeout $((560 - (SECONDS - t0))) bin/flash-attn bench --backward --backward-variants standard,fa2-tc --seqlens 4096 --head-dims 128 --causal both --out-dir $w/bwd-std > $w/bwd-std.log 2>&1
echo "bwd-std rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/bwd-std/backward.md | head -8
echo "done at $((SECONDS-t0))s"; save
