#!/usr/bin/env bash
# Device call 5 (2026-12-01, nvidia-h200): the final code (the k32 experiment of call 4 reverted;
# d = 256 back on the unconditional rescale): check, d = 256 and d = 128 timings beside PyTorch
# flash, and compute-sanitizer's four tools over fa2-tc at d = 256 (the one kernel whose code
# differs from the ones sanitized in calls 3 and 4).
set -u
out=$1; w=$(mktemp -d)
step() { local name=$1 t=$2; shift 2; echo "== $name"; timeout $t "$@" > $w/$name.log 2>&1; echo "   rc=$? at ${SECONDS}s"; }
step check 60 bundle/bin/flash-attn check --require-gpu --algorithms fa2-tc
tail -n 1 $w/check.log
step torch 60 python3 scripts/torch_sdpa_bench.py --backends torch-flash --out $w/torch.json --seqlens 2048,4096,8192 --head-dims 128,256
step bench 60 bundle/bin/flash-attn bench --algorithms fa2-tc --seqlens 2048,4096,8192 --head-dims 128,256 --no-max-seqlen --out-dir $w/bench
grep "d=" $w/torch.log; grep -h "^| [0-9]" $w/bench/bench.md | grep -v GiB
mkdir -p $w/san
for tool in memcheck racecheck synccheck initcheck; do
  timeout $((250-SECONDS)) compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
    bundle/bin/flash-attn check --require-gpu --shapes sanitizer --algorithms fa2-tc --dtypes f16,bf16 \
    --head-dims 256 > $w/san/$tool-d256.log 2>&1 &
done
wait
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) cases ok, $(grep -h 'SUMMARY' $f)"; done
tar czf $out/call5.tgz -C $w .
