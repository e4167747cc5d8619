#!/usr/bin/env bash
# Device call 32 (eleventh session, 2026-12-02): packed batches whose sequence offsets travel in
# the parameter block (read through the constant bank, ULDC, instead of device memory; batches
# over 255 sequences run as several launches), and an A/B of an L2 prefetch in the decode
# kernel (the warp's next step's K/V lines; a PTX subset through FLASH_ATTN_PTX). At most 590 s.
# A, correctness in parallel (190 s): the packed grid (bit for bit against the dense kernel per
#    sequence; new: 520 sequences, three launches), check --packed against the f64 reference,
#    memcheck of check --packed (bf16, both families).
# B, timing alone: packed / dense (issue 17's 5%, FA3 d = 64 was 0.938-0.948).
# C, PyTorch's decode, then ours as built, with the prefetch, and with an L2::256B prefetch-size
#    hint on the cache loads instead (decode_l2hint.ptx), twice each (A B C A B C).
# Bundle: `cargo xtask bundle` at 718b9e4, without bench-attention, test-gpu_numerics,
#   test-safetensors_io (and the other test binaries but test-gpu_packed and test-gpu_decode,
#   and the wheel); plus bundle/decode_prefetch.ptx and bundle/decode_l2hint.ptx (subsets,
#   scripts/ptx_subset.py 'decode_.*|kv_append_.*'). Run: bash bundle/call32.sh $OUT.
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call32.tgz -C $w .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; shift; ( timeout $(until_s 190) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
job packed bin/test-gpu_packed --test-threads=2
job check_packed bin/flash-attn check --require-gpu --packed
job memcheck_packed compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --packed --dtypes bf16
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$|FAIL \[|cases, " $w/t/*.log | cut -c1-300 | head -30
grep -h "ERROR SUMMARY" $w/t/*check*.log; tail -qn1 $w/t/check_packed.log | cut -c1-200
grep -c "→ pass" $w/t/check_packed.log $w/t/memcheck_packed.log
grep -h "lengths \[(0, 1)" $w/t/packed.log | head -4 | cut -c1-160
echo "correctness at $((SECONDS-t0))s"; save
timeout 50 bin/test-gpu_packed --ignored --nocapture time_packed > $w/packed-timing.log 2>&1
echo "packed timing rc=$? at $((SECONDS-t0))s"; grep "packed / dense" $w/packed-timing.log | cut -c1-200; save
timeout $(until_s 330) python3 scripts/torch_decode_bench.py --out $w/torch-decode.json > $w/torch-decode.log 2>&1
echo "torch-decode rc=$? at $((SECONDS-t0))s"; save
# ~40 s a run; the budgets below leave the last one until 585 s.
n=0
for round in 1 2; do
  for variant in built prefetch l2hint; do
    n=$((n + 1))
    case $variant in
      built) unset FLASH_ATTN_PTX ;;
      *) export FLASH_ATTN_PTX=$PWD/decode_$variant.ptx ;;
    esac
    timeout $(until_s $((330 + n * 42))) bin/flash-attn bench --decode --torch $w/torch-decode.json --out-dir $w/decode-$variant-$round > $w/decode-$variant-$round.log 2>&1
    echo "decode $variant $round rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/decode-$variant-$round/decode.md | cut -c1-300 | head -12; save
  done
done
unset FLASH_ATTN_PTX
echo "done at $((SECONDS-t0))s"; save
