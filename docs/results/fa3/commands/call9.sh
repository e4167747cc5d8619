#!/usr/bin/env bash
# Device call 9 (2026-12-01 fifth session), branch fa3-persistent after call 8:
# - correctness: check; every FA3 tiling, now with the persistent ones (w3c128p, ...: the dynamic
#   scheduler's counters reused across the test's hundreds of calls); memcheck and synccheck on
#   the one-tile default and on the persistent tilings at d = 64 and 128;
# - timing, bf16, PyTorch flash and cuDNN in the same call: fa3 from main's Hopper module, the
#   branch's one-tile default (the two-compare mask), the branch's persistent tilings, main again;
#   fa2-tc with the old mask (main's kernels, a PTX subset) against the new, A B A.
set -u
out=$1; w=$(mktemp -d); mkdir -p $w/san; t0=$SECONDS
save() { tar czf $out/call9.tgz -C $w .; }
F=bundle/fa3p
for f in bundle/ptx/*.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
timeout 60 $F/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16,f16 > $w/check.log 2>&1
rc=$?; echo "check rc=$rc at $((SECONDS-t0))s"; tail -1 $w/check.log; save
[ $rc = 0 ] || exit 1
timeout 60 $F/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16 --fa3-tiling w3c128p --head-dims 40,59,64 > $w/check-p64.log 2>&1
rc=$?; echo "check w3c128p rc=$rc"; tail -1 $w/check-p64.log; save
[ $rc = 0 ] || exit 1
( FLASH_ATTN_REQUIRE_GPU=1 timeout 150 $F/bin/test-gpu_attention every_fa3_tiling --show-output > $w/tilings.log 2>&1
  echo "tilings rc=$?" > $w/tilings.rc ) &
san() { name=$1; shift; ( timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      $F/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16 --shapes sanitizer "$@" \
      > $w/san/$tool-$name.log 2>&1; echo "$tool-$name rc=$?" >> $w/san/rc.txt ) & }
for tool in memcheck synccheck; do
  san default
  san p64 --fa3-tiling w3c128p --head-dims 8,40,64
  san p128 --fa3-tiling w2c128p --head-dims 128
done
wait
cat $w/tilings.rc $w/san/rc.txt; grep -E "cases, |test result" $w/tilings.log
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) ok, $(grep -h 'ERROR SUMMARY' $f | head -1)"; done
echo "correctness done at $((SECONDS-t0))s"; save
shapes="--seqlens 2048,4096,8192,16384 --causal both"
timeout 120 python3 $F/scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $shapes --head-dims 64,128 --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"; save
bench() { name=$1; dims=$2; shift 2; timeout 90 "$@" $shapes --head-dims $dims --no-max-seqlen --torch $w/torch.json --out-dir $w/$name > $w/$name.log 2>&1
  echo "$name rc=$? at $((SECONDS-t0))s"; grep -E "^\| [0-9]" $w/$name/bench.md | head -16; save; }
FLASH_ATTN_HOPPER_PTX=bundle/ptx/main_hopper.ptx bench fa3-main 64,128 $F/bin/flash-attn bench --algorithms fa3
bench fa3-branch 64,128 $F/bin/flash-attn bench --algorithms fa3
bench fa3-p64 64 $F/bin/flash-attn bench --algorithms fa3 --fa3-tiling w3c128p
bench fa3-p128 128 $F/bin/flash-attn bench --algorithms fa3 --fa3-tiling w2c128p
FLASH_ATTN_HOPPER_PTX=bundle/ptx/main_hopper.ptx bench fa3-main-again 64,128 $F/bin/flash-attn bench --algorithms fa3
FLASH_ATTN_PTX=bundle/ptx/main_fa2tc.ptx bench fa2tc-old 64,128 $F/bin/flash-attn bench --algorithms fa2-tc
FLASH_ATTN_PTX=bundle/ptx/fa3p_fa2tc.ptx bench fa2tc-new 64,128 $F/bin/flash-attn bench --algorithms fa2-tc
FLASH_ATTN_PTX=bundle/ptx/main_fa2tc.ptx bench fa2tc-old-again 64,128 $F/bin/flash-attn bench --algorithms fa2-tc
echo "all done at $((SECONDS-t0))s"
