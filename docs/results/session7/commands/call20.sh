#!/usr/bin/env bash
# Device call 20 (prepared in the seventh session): FA3 timing, one host binary, Hopper modules
# through FLASH_ATTN_HOPPER_PTX, each variant twice (A B C D E, A B C D E), PyTorch in the same
# call, causal and not, d = 64 and 128, N = 2k-8k:
#   prev5  2556f95, FA3 v4 (before call 18's LPT order and rescale; v5 was never timed
#          non-causal)
#   v5     a119fc3, main before the window merge
#   s7     branch window-on-main, the window merge (sliding window and soft-capping in every FA3 kernel: its cost on
#          the dense path)
#   e2, e4, e8 main (v5's SASS with the split off) with every 2nd / 4th / 8th 8-key tile's
#          exponentials on the FMA units at d = 64
#          (FLASH_ATTN_FA3_EXP2_POLYNOMIAL_EVERY, `common::softmax::exp2_polynomial`)
# Last, packed batches of equal lengths timed against the dense call (tests/gpu_packed.rs,
# `time_packed_batches_against_the_dense_call`).
# First the e2, e4 and e8 modules' correctness (check on FA3 alone, both dtypes, their defaults and
# the persistent tiling at d = 64).
# The bundle: as call 19's (on window-on-main: 59.2 MiB with its 10 binaries; delete
# bin/bench-attention and bin/test-gpu_numerics, unused here, to make room), then
#   SUBSET=fa2tc_forward_bf16_d64_w4r2s2c64 scripts/ptx_variants.sh prev5=2556f95 v5=a119fc3 s7=. \
#     e2=main:FLASH_ATTN_FA3_EXP2_POLYNOMIAL_EVERY=2 e4=main:FLASH_ATTN_FA3_EXP2_POLYNOMIAL_EVERY=4 \
#     e8=main:FLASH_ATTN_FA3_EXP2_POLYNOMIAL_EVERY=8
# (SUBSET keeps the main modules it also writes small; they are not used here).
# Run: bash docs/results/session7/commands/call20.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call20.tgz -C $w .; }
cd bundle
for f in ptx/*_hopper.ptx.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
for v in e2 e4 e8; do
  ( FLASH_ATTN_HOPPER_PTX=ptx/${v}_hopper.ptx timeout 90 bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16,f16 > $w/t/check-$v.log 2>&1; echo "check-$v rc=$?" > $w/t/check-$v.rc ) &
  ( FLASH_ATTN_HOPPER_PTX=ptx/${v}_hopper.ptx timeout 90 bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16,f16 --fa3-tiling w3c128p --head-dims 40,59,64 > $w/t/check-$v-p.log 2>&1; echo "check-$v-p rc=$?" > $w/t/check-$v-p.rc ) &
done
wait; cat $w/t/*.rc; tail -qn1 $w/t/check-*.log; grep -h "FAIL$" $w/t/check-*.log | cut -c1-200 | head
echo "correctness at $((SECONDS-t0))s"; save
shapes="--seqlens 2048,4096,8192 --head-dims 64,128 --causal both"
timeout 80 python3 scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $shapes --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"; save
for round in 1 2; do
  for v in prev5 v5 s7 e2 e4 e8; do
    FLASH_ATTN_HOPPER_PTX=ptx/${v}_hopper.ptx timeout 60 bin/flash-attn bench --algorithms fa3 $shapes --no-max-seqlen --torch $w/torch.json --out-dir $w/$v-$round > $w/$v-$round.log 2>&1
    echo "$v-$round rc=$? at $((SECONDS-t0))s"; grep -E '^\| [0-9]' $w/$v-$round/bench.md | grep -v GiB | head -12; save
  done
done
# Packed batches of equal lengths against the dense call (issue 17's prefill target).
timeout $((560 - (SECONDS - t0))) bin/test-gpu_packed --ignored --nocapture time_packed > $w/packed-timing.log 2>&1
echo "packed timing rc=$? at $((SECONDS-t0))s"; grep "packed / dense" $w/packed-timing.log
echo "done at $((SECONDS-t0))s"; save
