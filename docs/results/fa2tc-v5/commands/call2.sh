#!/usr/bin/env bash
# Device call 2: racecheck/sanitizer chunks on GPU 1 (parallel processes), A/B and tilings on GPU 0.
set -u
out=$1; w=$(mktemp -d); mkdir -p $w/san
san() { # gpu tool name check-args...
  local gpu=$1 tool=$2 name=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu timeout ${SAN_T:-500} compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
    bundle/bin/flash-attn check --require-gpu --shapes sanitizer "$@" > $w/san/$tool-$name.log 2>&1
  echo "$tool-$name rc=$? ok=$(grep -c ' ok$' $w/san/$tool-$name.log) $(grep -h 'SUMMARY' $w/san/$tool-$name.log)" >> $w/san/summary.txt
}
for dt in f16 bf16; do for d in 40 64 128 256; do san 1 racecheck fa1-$dt-d$d --dtypes $dt --algorithms fa1 --head-dims $d & done; done
for dt in f16 bf16; do san 1 racecheck fa2-$dt-d256 --dtypes $dt --algorithms fa2 --head-dims 256 & done
for a in standard fa2 fa2-tc; do san 1 racecheck f32-$a --dtypes f32 --algorithms $a --head-dims 64,128,256 & done
for d in 64 128 256; do san 1 racecheck f32-fa1-d$d --dtypes f32 --algorithms fa1 --head-dims $d & done
for tool in memcheck synccheck initcheck; do san 1 $tool fa2tc --dtypes f16,bf16 --algorithms fa2-tc & done
sleep 2
export SEQLENS=2048,4096,8192
TILING=4x2s1 HEAD_DIMS=128 timeout 200 bash scripts/ab_variants.sh $w/ab v4s1 v5a v4s1 v5a
TILING=4x2s2 HEAD_DIMS=128 timeout 100 bash scripts/ab_variants.sh $w/ab v5a
export SEQLENS=4096
for t in 4x2s2 4x2s1 4x1s2 8x1s2; do TILING=$t HEAD_DIMS=32,96 timeout 60 bash scripts/ab_variants.sh $w/tilings v5a; done
for t in 8x1s2 8x1s1 4x1s2 4x1s1; do TILING=$t HEAD_DIMS=256 timeout 60 bash scripts/ab_variants.sh $w/tilings v5a; done
timeout 150 python3 scripts/torch_sdpa_bench.py --out $w/torch.json --seqlens 2048,4096,8192 --head-dims 32,64,96,128,256 > $w/torch.log 2>&1; tail -3 $w/torch.log
for dt in f16 bf16; do SAN_T=$((525-SECONDS)) san 0 racecheck fa2tc-$dt --dtypes $dt --algorithms fa2-tc & done
while pgrep -f compute-sanitizer > /dev/null && [ $SECONDS -lt 535 ]; do sleep 3; done
sort $w/san/summary.txt
tar czf $out/call2.tgz -C $w .
