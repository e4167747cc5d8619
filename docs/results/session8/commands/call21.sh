#!/usr/bin/env bash
# Device call 21 (eighth session, 2026-12-01), branch session8: window-on-main with windows and
# soft-capping as their own kernel form (`_local`; the dense and packed kernels compile them out),
# the one-launch decode and FA3's backward (both new, never run on a GPU), in one bundle.
# A, correctness in parallel (200 s at most): the forward tilings (dense kernels' code changed),
#    windows, packed batches, the backward (fa3's grid), GQA, decode; check on packed, decode and
#    fa3's backward; memcheck and synccheck of fa3's backward, memcheck of decode, synccheck of
#    the FA3 local kernels.
# B, timing alone: PyTorch's forward; FA3 and FA2-TC dense, main (bin/flash-attn-main: main's
#    f27b163, FA3 = v5) against session8; packed against dense; PyTorch's backward, then fa3 against
#    fa2-tc; PyTorch's decode, then ours.
# Bundle: `cargo xtask bundle` on session8, without bench-attention, test-gpu_numerics,
#   test-safetensors_io and the wheel; plus bin/flash-attn-main (main's release CLI) and
#   SUBSET='fa2tc_forward_bf16_d(64|128)_w4r2s[12]c64' scripts/ptx_variants.sh main=f27b163 s8=.
# Run: bash docs/results/session8/commands/call21.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call21.tgz -C $w .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
for f in ptx/*.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; shift; ( timeout $(until_s 200) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
small="--seqlens 113 --head-dims 64,128 --dtypes bf16 --algorithms fa2-tc --backward --backward-algorithms fa3"
job tilings bin/test-gpu_attention every_ --test-threads=2
job window bin/test-gpu_window --test-threads=2
job packed bin/test-gpu_packed --test-threads=2
job backward bin/test-gpu_backward --test-threads=4
job gqa bin/test-gpu_gqa --test-threads=2
job decode bin/test-gpu_decode --test-threads=8
job check_packed bin/flash-attn check --require-gpu --packed
job check_decode bin/flash-attn check --require-gpu --decode
job check_bwd bin/flash-attn check --require-gpu --backward --backward-algorithms fa3
job memcheck_bwd compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu $small
job synccheck_bwd compute-sanitizer --tool synccheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu $small
job memcheck_decode compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --decode --shapes sanitizer --dtypes bf16
job synccheck_local compute-sanitizer --tool synccheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --shapes window --algorithms fa3 --dtypes bf16 --head-dims 64,128
bin/flash-attn plan --shape 2,8,1000,128 --backward > $w/t/plan.log 2>&1
bin/flash-attn plan --shape 2,8,4096,128 --window 256,0 >> $w/t/plan.log 2>&1
bin/flash-attn plan --decode --causal --shape 1,32,1,128 --kv-heads 8 --seqlen-k 4096 >> $w/t/plan.log 2>&1
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$|FAIL \[" $w/t/*.log | cut -c1-250 | head -40
grep -h "ERROR SUMMARY" $w/t/*check_*.log $w/t/memcheck*.log $w/t/synccheck*.log 2>/dev/null
tail -qn1 $w/t/check_*.log; cut -c1-300 $w/t/plan.log
echo "correctness at $((SECONDS-t0))s"; save
fwd="--seqlens 2048,8192 --head-dims 64,128 --causal both"
timeout 40 python3 scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $fwd --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"; save
col() { grep -E '^\| [0-9]' $1 2>/dev/null | grep -v GiB | awk -F'|' '{printf "%s ", $7}'; }
for v in main s8; do
  bin=flash-attn; [ $v = main ] && bin=flash-attn-main
  timeout 45 bin/$bin bench --algorithms fa3 $fwd --no-max-seqlen --torch $w/torch.json --out-dir $w/fa3-$v > $w/fa3-$v.log 2>&1
  echo "fa3-$v rc=$? at $((SECONDS-t0))s: $(col $w/fa3-$v/bench.md)"
  FLASH_ATTN_PTX=ptx/${v}_main.ptx timeout 40 bin/$bin bench --algorithms fa2-tc $fwd --no-max-seqlen --out-dir $w/fa2tc-$v > $w/fa2tc-$v.log 2>&1
  echo "fa2tc-$v rc=$? at $((SECONDS-t0))s: $(col $w/fa2tc-$v/bench.md)"; save
done
grep -E '^\|' $w/fa3-s8/bench.md | head -11
timeout 45 bin/test-gpu_packed --ignored --nocapture time_packed > $w/packed-timing.log 2>&1
echo "packed timing rc=$? at $((SECONDS-t0))s"; grep "packed / dense" $w/packed-timing.log | cut -c1-200; save
bwd="--seqlens 2048,8192 --head-dims 64,128 --causal both"
timeout $(until_s 470) python3 scripts/torch_backward_bench.py $bwd --out $w/torch-bwd.json > $w/torch-bwd.log 2>&1
echo "torch-bwd rc=$? at $((SECONDS-t0))s"; save
timeout $(until_s 520) bin/flash-attn bench --backward --backward-variants fa3,fa2-tc $bwd --torch $w/torch-bwd.json --out-dir $w/bwd > $w/bwd.log 2>&1
echo "bwd rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/bwd/backward.md | head -14; save
timeout $(until_s 550) python3 scripts/torch_decode_bench.py --out $w/torch-decode.json > $w/torch-decode.log 2>&1
echo "torch-decode rc=$? at $((SECONDS-t0))s"; save
timeout $(until_s 585) bin/flash-attn bench --decode --torch $w/torch-decode.json --decode-variants two-launch --out-dir $w/decode > $w/decode.log 2>&1
echo "decode rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/decode/decode.md | cut -c1-300 | head -14
echo "done at $((SECONDS-t0))s"; save
