#!/usr/bin/env bash
# Device call 28 (tenth session, 2026-12-02), main + the packed-window form (`_varlen_local`, new
# on a GPU) and FA3's local form's row votes. At most 590 s.
# A, correctness in parallel (210 s): the packed grid (bit for bit against the dense kernel per
#    sequence, now with windows and soft-capping), check --packed against the f64 reference,
#    gpu_window (the FA3 local kernels' votes changed), memcheck and synccheck of check --packed.
# B, the Python bridge's tests and the training example with fa3's backward (the README's table
#    predates it).
# C, timing alone: packed / dense (issue 17's 5%), ncu of packed against dense FA3 at d = 64
#    (the one point short of it), PyTorch's decode then ours with forced split counts (128k x 16
#    was 0.99x cuDNN).
# Bundle: `cargo xtask bundle` at the session's head, without bench-attention,
#   test-gpu_numerics, test-safetensors_io. Run: bash bundle/call28.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call28.tgz -C $w .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; shift; ( timeout $(until_s 200) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
job packed bin/test-gpu_packed --test-threads=2
job check_packed bin/flash-attn check --require-gpu --packed
job window bin/test-gpu_window --test-threads=2
job memcheck_packed compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --packed --dtypes bf16
job synccheck_packed compute-sanitizer --tool synccheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --packed --dtypes bf16 --algorithms fa3
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$|FAIL \[" $w/t/*.log | cut -c1-300 | head -30
grep -h "ERROR SUMMARY" $w/t/*check*.log; tail -qn1 $w/t/check_packed.log | cut -c1-200
grep -c "→ pass" $w/t/check_packed.log $w/t/memcheck_packed.log $w/t/synccheck_packed.log
grep -h "window=" $w/t/check_packed.log | head -4 | cut -c1-250
echo "correctness at $((SECONDS-t0))s"; save
EXAMPLE_ARGS="--max-seqlen 262144" timeout $(until_s 330) bash run-python-tests.sh $w/python > $w/python.log 2>&1
echo "python rc=$? at $((SECONDS-t0))s"; tail -4 $w/python.log; grep -E "^\| " $w/python/example.md 2>/dev/null | head -14; save
timeout 50 bin/test-gpu_packed --ignored --nocapture time_packed > $w/packed-timing.log 2>&1
echo "packed timing rc=$? at $((SECONDS-t0))s"; grep "packed / dense" $w/packed-timing.log | cut -c1-200; save
timeout $(until_s 440) ncu --kernel-name regex:fa3_forward_bf16_d64 --launch-skip 10 --launch-count 2 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --section InstructionStats --section ComputeWorkloadAnalysis --section Occupancy \
  bin/test-gpu_packed --ignored --nocapture time_packed > $w/ncu-packed.txt 2>&1
echo "ncu packed rc=$? at $((SECONDS-t0))s"
grep -E "  fa3_forward|Duration|Elapsed Cycles|SM Active|Executed Ipc A|Warp Cycles Per Issued|Executed Instructions  |No Eligible|Registers Per|Grid Size" $w/ncu-packed.txt | head -24; save
timeout $(until_s 530) python3 scripts/torch_decode_bench.py --out $w/torch-decode.json > $w/torch-decode.log 2>&1
echo "torch-decode rc=$? at $((SECONDS-t0))s"; save
timeout $(until_s 585) bin/flash-attn bench --decode --torch $w/torch-decode.json --decode-variants s2,s3,s6,s8,two-launch --out-dir $w/decode > $w/decode.log 2>&1
echo "decode rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/decode/decode.md | cut -c1-400 | head -12
echo "done at $((SECONDS-t0))s"; save
