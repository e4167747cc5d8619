#!/usr/bin/env bash
# Device call 8 (2026-12-01 fifth session), three branches in one call:
# - bundle/bwd (branch bwd-kernel): the faithful FA2 backward kernels' first GPU run;
# - bundle/fa3p (branch fa3-persistent): FA3 with the tile loop (persistent grid optional) and
#   the two-compare mask; check, every tiling on both grids, memcheck and synccheck;
# - timing, bf16, PyTorch's flash and cuDNN in the same call: fa3 from main's Hopper module
#   (bundle/ptx/main_hopper.ptx), fa3p one block per tile, fa3p persistent; fa2-tc from main's
#   module against fa3p's (the mask rewrite touches fa2-tc too).
set -u
out=$1; w=$(mktemp -d); mkdir -p $w/san; t0=$SECONDS
save() { tar czf $out/call8.tgz -C $w .; }
F=bundle/fa3p; B=bundle/bwd
for f in bundle/ptx/*.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
FLASH_ATTN_REQUIRE_GPU=1 timeout 150 $B/bin/test-gpu_backward --nocapture > $w/bwd.log 2>&1
echo "bwd rc=$? at $((SECONDS-t0))s"; grep -E "test result|FAILED|panicked|error" $w/bwd.log | head -8; save
timeout 60 $F/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16,f16 > $w/check.log 2>&1
rc=$?; echo "check rc=$rc at $((SECONDS-t0))s"; tail -1 $w/check.log; save
[ $rc = 0 ] || exit 1
( FLASH_ATTN_REQUIRE_GPU=1 timeout 120 $F/bin/test-gpu_attention every_fa3_tiling --show-output > $w/tilings.log 2>&1
  echo "tilings rc=$?" > $w/tilings.rc ) &
for tool in memcheck synccheck; do
  ( timeout 100 compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      $F/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16 --shapes sanitizer \
      > $w/san/$tool.log 2>&1; echo "$tool rc=$?" >> $w/san/rc.txt ) &
done
wait
cat $w/tilings.rc $w/san/rc.txt; grep -E "cases, |test result" $w/tilings.log
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) ok, $(grep -h 'ERROR SUMMARY' $f | head -1)"; done
echo "correctness done at $((SECONDS-t0))s"; save
shapes="--seqlens 2048,4096,8192,16384 --head-dims 64,128 --causal both"
timeout 120 python3 $F/scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $shapes --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"; save
bench() { name=$1; shift; timeout 60 "$@" $shapes --no-max-seqlen --torch $w/torch.json --out-dir $w/$name > $w/$name.log 2>&1
  echo "$name rc=$? at $((SECONDS-t0))s"; grep -E "^\| [0-9]" $w/$name/bench.md | head -16; save; }
FLASH_ATTN_HOPPER_PTX=bundle/ptx/main_hopper.ptx bench fa3-main $F/bin/flash-attn bench --algorithms fa3
bench fa3p-tile $F/bin/flash-attn bench --algorithms fa3
bench fa3p-persistent $F/bin/flash-attn bench --algorithms fa3 --fa3-persistent
FLASH_ATTN_PTX=bundle/ptx/main_sm90.ptx bench fa2tc-main $F/bin/flash-attn bench --algorithms fa2-tc
bench fa2tc-fa3p $F/bin/flash-attn bench --algorithms fa2-tc
FLASH_ATTN_HOPPER_PTX=bundle/ptx/main_hopper.ptx bench fa3-main-again $F/bin/flash-attn bench --algorithms fa3
echo "all done at $((SECONDS-t0))s"
