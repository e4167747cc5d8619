#!/usr/bin/env bash
# Device call 24 (ninth session, 2026-12-01), branch session9 at 33f0ea1: FA3 forward v8 (the mask
# decided per consumer warpgroup), FA3 backward v3 (dQ's column pairs by red.global.add.v2.f32,
# the Hopper module at PTX ISA 8.1) and fa3 the default backward again, all new on a GPU.
# A, correctness in parallel (150 s): fa3 backward grids, random shapes, deterministic and
#    fallbacks (the default changed), check --backward on fa3, memcheck and synccheck of fa3's
#    backward and forward at odd shapes, every FA3 tiling, every _local kernel, packed, GQA's fa3
#    tests, check on fa3's forward.
# B, timing alone: PyTorch's forward, then FA3 through FLASH_ATTN_HOPPER_PTX with call 23's
#    kernels (ptx/v23.ptx, 2f1d127) and this branch's (ptx/v24.ptx), A B A B; PyTorch's backward,
#    then fa3 (v24) and fa2-tc, and fa3 on call 23's kernels.
# Bundle: `cargo xtask bundle` on session9 without bench-attention, test-gpu_numerics,
#   test-safetensors_io and python/; ptx/v23.ptx and ptx/v24.ptx from scripts/ptx_subset.py
#   'fa3_(forward_bf16_d(64|128)_w[23]c128p?|backward_bf16_d(64|128))'.
# Run: bash bundle/call24.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call24.tgz -C $w .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; shift; ( timeout $(until_s 150) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
small="--seqlens 113 --head-dims 64,128 --dtypes bf16 --algorithms fa2-tc --backward --backward-algorithms fa3"
job bwd bin/test-gpu_backward fa3 deterministic falls_back --test-threads=3
job check_bwd bin/flash-attn check --require-gpu --backward --backward-algorithms fa3
job memcheck_bwd compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu $small
job synccheck_bwd compute-sanitizer --tool synccheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu $small
job synccheck_fwd compute-sanitizer --tool synccheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --shapes sanitizer --algorithms fa3 --dtypes bf16
job tilings bin/test-gpu_attention every_fa3_tiling
job window bin/test-gpu_window every_local_kernel
job packed bin/test-gpu_packed --test-threads=2
job gqa bin/test-gpu_gqa fa3 --test-threads=2
job check_fwd bin/flash-attn check --require-gpu --algorithms fa3
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$|FAIL \[" $w/t/*.log | cut -c1-300 | head -40
grep -h "ERROR SUMMARY" $w/t/memcheck*.log $w/t/synccheck*.log; tail -qn1 $w/t/check_*.log | cut -c1-200
echo "correctness at $((SECONDS-t0))s"; save
fwd="--seqlens 2048,8192 --head-dims 64,128 --causal both"
timeout 40 python3 scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $fwd --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"; save
col() { grep -E '^\| [0-9]' $1 2>/dev/null | grep -v GiB | awk -F'|' '{printf "%s ", $7}'; }
for v in v23 v24 v23 v24; do
  FLASH_ATTN_HOPPER_PTX=ptx/$v.ptx timeout 35 bin/flash-attn bench --algorithms fa3 $fwd --no-max-seqlen --torch $w/torch.json --out-dir $w/fa3-$v-$SECONDS > $w/fa3-$v-$SECONDS.log 2>&1
  echo "fa3-$v rc=$? at $((SECONDS-t0))s: $(col $(ls -td $w/fa3-$v-*/ | head -1)bench.md)"; save
done
grep -E '^\|' $(ls -td $w/fa3-v24-*/ | head -1)bench.md | head -11
bwd="--seqlens 2048,8192 --head-dims 64,128 --causal both"
timeout $(until_s 330) python3 scripts/torch_backward_bench.py $bwd --out $w/torch-bwd.json > $w/torch-bwd.log 2>&1
echo "torch-bwd rc=$? at $((SECONDS-t0))s"; save
FLASH_ATTN_HOPPER_PTX=ptx/v24.ptx timeout $(until_s 390) bin/flash-attn bench --backward --backward-variants fa3,fa2-tc $bwd --torch $w/torch-bwd.json --out-dir $w/bwd > $w/bwd.log 2>&1
echo "bwd rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/bwd/backward.md | head -14; save
FLASH_ATTN_HOPPER_PTX=ptx/v23.ptx timeout $(until_s 430) bin/flash-attn bench --backward --backward-variants fa3 $bwd --out-dir $w/bwd-v23 > $w/bwd-v23.log 2>&1
echo "bwd-v23 rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/bwd-v23/backward.md | head -11
echo "done at $((SECONDS-t0))s"; save
