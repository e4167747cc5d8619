#!/usr/bin/env bash
# Device call 1 (2026-12-01 fourth session, nvidia-h200): FA3 steps 1–3, first run.
# 1. `check` of fa3 alone (f16, bf16; every standard shape, causal both), under a timeout in case
#    the producer/consumer barriers deadlock.
# 2. compute-sanitizer memcheck on fa3 at the sanitizer shapes.
# 3. Timing: fa3 (default tilings, then d = 64 w3c128 and d = 128 w2c176) against fa2-tc, and
#    PyTorch's flash and cuDNN backends, at N = 4096, d = 64 and 128, causal both.
set -u
out=$1; w=$(mktemp -d)
save() { tar czf $out/call1.tgz -C $w .; }
t0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 150 bundle/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16,f16 > $w/check.log 2>&1
echo "check rc=$? at $((SECONDS-t0))s"; tail -5 $w/check.log; grep -ciE "fail" $w/check.log
save
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 \
  bundle/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16 --shapes sanitizer > $w/memcheck.log 2>&1
echo "memcheck rc=$? at $((SECONDS-t0))s"; grep -h "ERROR SUMMARY" $w/memcheck.log | head -2
save
ours() {  # run name, extra args
  timeout 150 bundle/bin/flash-attn bench --seqlens 4096 --head-dims 64,128 --causal both \
    --no-max-seqlen --out-dir $w/$1 "${@:2}" > $w/$1.log 2>&1
  echo "$1 rc=$? at $((SECONDS-t0))s"
}
ours fa3 --algorithms fa3,fa2-tc
timeout 150 python3 bundle/scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn \
  --seqlens 4096 --head-dims 64,128 --causal both --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"
save
ours fa3-w3c128 --algorithms fa3 --fa3-tiling w3c128 --head-dims 64
ours fa3-w2c176 --algorithms fa3 --fa3-tiling w2c176 --head-dims 128
for f in $w/fa3*/bench.md; do echo "== $f"; grep -E "^\|" $f | head -12; done
grep -E "torch|TFLOP" $w/torch.log | tail -10
save
