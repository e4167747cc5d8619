#!/usr/bin/env bash
# Device call 2 (2026-12-01 fourth session, nvidia-h200): FA3 step 4, the pipelined consumers.
# 1. Correctness of the final kernels: `check` of fa3 (f16, bf16), the grid test binary (every
#    algorithm, fa3 included), compute-sanitizer memcheck, synccheck, initcheck and racecheck on
#    fa3 at the sanitizer shapes.
# 2. Timing, alone on the GPU (and fa2-tc at d = 256 on the pre-session main module against this
#    one, since 8 of its kernels' SASS changed): fa3 (pipelined + ping-pong) against fa2-tc and PyTorch's flash and
#    cuDNN at N = 4096, d = 64/128 causal both, d = 96/256 non-causal; the same binary on
#    call 1's module (bundle/ptx/fa3v1.ptx, serial consumers) and on a module without ping-pong
#    (bundle/ptx/fa3nopp.ptx), through FLASH_ATTN_HOPPER_PTX; the other compiled tilings.
set -u
for v in fa3v1 fa3nopp mainbase; do [ -f bundle/ptx/$v.ptx ] || gunzip -kf bundle/ptx/$v.ptx.gz; done
out=$1; w=$(mktemp -d); mkdir -p $w/san
save() { tar czf $out/call2.tgz -C $w .; }
t0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 120 bundle/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16,f16 > $w/check.log 2>&1
echo "check rc=$? at $((SECONDS-t0))s"; tail -1 $w/check.log
( FLASH_ATTN_REQUIRE_GPU=1 timeout 260 bundle/bin/test-gpu_attention --test-threads=1 > $w/grid.log 2>&1
  echo "grid rc=$?" > $w/grid.rc ) &
for tool in memcheck synccheck initcheck racecheck; do
  ( timeout 250 compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      bundle/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16 --shapes sanitizer \
      > $w/san/$tool.log 2>&1; echo "$tool rc=$?" >> $w/san/rc.txt ) &
done
wait
cat $w/grid.rc $w/san/rc.txt; grep -E "test result|cases|worst" $w/grid.log | tail -6
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) ok, $(grep -h 'ERROR SUMMARY' $f | head -1)"; done
echo "correctness done at $((SECONDS-t0))s"; save
ours() {  # run name, env module, extra args
  FLASH_ATTN_HOPPER_PTX=$2 timeout 120 bundle/bin/flash-attn bench --no-max-seqlen --out-dir $w/$1 "${@:3}" > $w/$1.log 2>&1
  echo "$1 rc=$? at $((SECONDS-t0))s"
}
main="--seqlens 4096 --head-dims 64,128 --causal both"
ours v2 "" --algorithms fa3,fa2-tc $main
timeout 100 python3 bundle/scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $main --out $w/torch.json > $w/torch.log 2>&1
timeout 60 python3 bundle/scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn --seqlens 4096 --head-dims 96,256 --causal off --out $w/torch96.json > $w/torch96.log 2>&1
ours v2-96 "" --algorithms fa3,fa2-tc --seqlens 4096 --head-dims 96,256 --causal off
ours v1 bundle/ptx/fa3v1.ptx --algorithms fa3 $main
ours nopp bundle/ptx/fa3nopp.ptx --algorithms fa3 $main
ours v2b "" --algorithms fa3 $main
ours w3c128 "" --algorithms fa3 --fa3-tiling w3c128 --seqlens 4096 --head-dims 64 --causal both
ours w2c176 "" --algorithms fa3 --fa3-tiling w2c176 --seqlens 4096 --head-dims 128 --causal both
ours w2c64 "" --algorithms fa3 --fa3-tiling w2c64 --seqlens 4096 --head-dims 256 --causal off
# fa2-tc at d = 256: its SASS changed with the shared softmax (8 of 116 kernels); old module vs new.
for m in mainbase new mainbase new; do
  n=$((${n:-0}+1)); [ $m = new ] && p="" || p=bundle/ptx/mainbase.ptx
  FLASH_ATTN_PTX=$p timeout 60 bundle/bin/flash-attn bench --no-max-seqlen --out-dir $w/tc256-$n-$m \
    --algorithms fa2-tc --seqlens 4096 --head-dims 256 --causal both > $w/tc256-$n-$m.log 2>&1
  echo "tc256-$n-$m rc=$? at $((SECONDS-t0))s"
done
for f in $w/*/bench.md; do echo "== $f"; grep -E "^\| [0-9]" $f | head -4; done
grep -h "TFLOP" $w/torch.log $w/torch96.log
save
