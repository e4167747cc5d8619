#!/usr/bin/env bash
# Device call 3: final defaults' correctness and timings beside PyTorch on GPU 0; the slow FA1
# racecheck cases on GPU 1.
set -u
out=$1; w=$(mktemp -d); mkdir -p $w/san
san() { # gpu name check-args...
  local gpu=$1 name=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout ${SAN_T:-510} compute-sanitizer --tool racecheck --error-exitcode 99 --print-limit 20 \
    bundle/bin/flash-attn check --require-gpu --shapes sanitizer "$@" > $w/san/racecheck-$name.log 2>&1
  echo "racecheck-$name rc=$? ok=$(grep -c ' ok$' $w/san/racecheck-$name.log) $(grep -h 'SUMMARY' $w/san/racecheck-$name.log)" >> $w/san/summary.txt
}
for dt in f16 bf16; do san 1 fa1-$dt-d40 --dtypes $dt --algorithms fa1 --head-dims 40 & done
for dt in f16 bf16 f32; do san 1 fa1-$dt-d256 --dtypes $dt --algorithms fa1 --head-dims 256 & done
san 1 f32-fa2-d128-256 --dtypes f32 --algorithms fa2 --head-dims 128,256 &
step() { local name=$1 t=$2; shift 2; echo "== $name"; timeout $t "$@" > $w/$name.log 2>&1; echo "   rc=$? at ${SECONDS}s"; }
step check 60 bundle/bin/flash-attn check --require-gpu --algorithms fa2-tc
step bench 150 bundle/bin/flash-attn bench --algorithms fa2-tc --seqlens 2048,4096,8192 --head-dims 32,64,96,128,256 --no-max-seqlen --out-dir $w/bench
step torch 130 python3 scripts/torch_sdpa_bench.py --out $w/torch.json --seqlens 2048,4096,8192 --head-dims 32,64,96,128,256
step tilings 90 bundle/bin/test-gpu_attention every_fa2_tc_tiling --test-threads=1 --show-output
step grid $((530-SECONDS)) bundle/bin/test-gpu_attention fa1_and_fa2_pass_the_grid --test-threads=1 --show-output
tail -2 $w/check.log; grep -h "cases" $w/tilings.log $w/grid.log; grep "^| [0-9]" $w/bench/bench.md | grep -v GiB; grep torch-flash $w/torch.log
while pgrep -f compute-sanitizer > /dev/null && [ $SECONDS -lt 535 ]; do sleep 3; done
sort $w/san/summary.txt
tar czf $out/call3.tgz -C $w .
