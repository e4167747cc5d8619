#!/usr/bin/env bash
# Device call 18 (2026-12-01 sixth session), branch fa3-lpt: FA3's causal tiles longest first
# within L2 sections of heads (lpt: scheduler.rs), and that with Õ's rescale moved between the
# issue of S_j and of P̃_{j-1}·V_{j-1} (res). Correctness of res through FLASH_ATTN_HOPPER_PTX
# (check on the defaults and on both persistent tilings), then causal timing main, lpt, res twice,
# PyTorch in the same call.
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call18.tgz -C $w .; }
cd bundle
for f in ptx/*.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1 FLASH_ATTN_HOPPER_PTX=ptx/res_hopper.ptx
( timeout 70 bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16,f16 > $w/check.log 2>&1; echo "check rc=$?" > $w/check.rc ) &
( timeout 70 bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16 --fa3-tiling w3c128p --head-dims 40,59,64 > $w/check-p64.log 2>&1; echo "check-p64 rc=$?" > $w/check-p64.rc ) &
( timeout 70 bin/flash-attn check --require-gpu --algorithms fa3 --dtypes f16 --fa3-tiling w2c128p --head-dims 100,128 > $w/check-p128.log 2>&1; echo "check-p128 rc=$?" > $w/check-p128.rc ) &
( timeout 70 compute-sanitizer --tool synccheck --error-exitcode 99 --print-limit 10 bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16 --shapes sanitizer > $w/synccheck.log 2>&1; echo "synccheck rc=$?" > $w/synccheck.rc ) &
wait; cat $w/*.rc; grep -h "ERROR SUMMARY" $w/synccheck.log; tail -qn1 $w/check*.log; echo "correctness at $((SECONDS-t0))s"; save
grep -q "rc=0" $w/check.rc || exit 1
unset FLASH_ATTN_HOPPER_PTX
shapes="--seqlens 2048,4096,8192 --head-dims 64,128 --causal on"
timeout 40 python3 scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $shapes --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"
for round in 1 2; do
  for v in main lpt res; do
    FLASH_ATTN_HOPPER_PTX=ptx/${v}_hopper.ptx timeout 30 bin/flash-attn bench --algorithms fa3 $shapes --no-max-seqlen --torch $w/torch.json --out-dir $w/$v-$round > $w/$v-$round.log 2>&1
    echo "$v-$round rc=$? at $((SECONDS-t0))s"; grep -E '^\| [0-9]' $w/$v-$round/bench.md | grep -v GiB | head -6; save
  done
done
