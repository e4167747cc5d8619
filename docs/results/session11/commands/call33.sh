#!/usr/bin/env bash
# Device call 33 (eleventh session, 2026-12-02), at e7ceb92: the packed kernels' final source
# (lengths by subtraction), the new GQA prefill timing, fa3's and fa2-tc's d = 96 kernels
# under the sanitizers (never run), and per-instruction counts of packed against dense FA3 at
# d = 64 (where its last 5% goes). At most 570 s.
# A, in parallel (190 s): the packed grid (bit for bit against the dense kernel per sequence),
#    check --packed (f64), and memcheck, racecheck, synccheck, initcheck of
#    `check --shapes sanitizer --head-dims 96` (fa3, fa2-tc; bf16; with fa3's backward).
# B, timing alone: packed / dense; grouped / ungrouped (new).
# C, ncu SourceCounters of one d = 64 2k non-causal launch each, packed and dense, exported as
#    per-SASS-instruction CSV.
# D, decode with forced split counts whose grids fill whole waves at 128k x 16 (33 splits: 4224
#    blocks, 16 waves of 264), against PyTorch in the same call.
# Bundle: `cargo xtask bundle` at e7ceb92, keeping flash-attn, test-gpu_packed, test-gpu_gqa.
# Run: bash bundle/call33.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call33.tgz -C $w --exclude='*.ncu-rep' .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; shift; ( timeout $(until_s 190) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
san="bin/flash-attn check --require-gpu --shapes sanitizer --head-dims 96 --algorithms fa3,fa2-tc --dtypes bf16 --backward --backward-algorithms fa3"
job packed bin/test-gpu_packed --test-threads=2
job check_packed bin/flash-attn check --require-gpu --packed
for tool in memcheck racecheck synccheck initcheck; do
  job san_$tool compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 $san
done
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$|FAIL \[|cases, " $w/t/*.log | cut -c1-300 | head -20
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" $w/t/*.log; tail -qn1 $w/t/check_packed.log $w/t/san_*.log | cut -c1-200
grep -c "→ pass" $w/t/check_packed.log $w/t/san_*.log
echo "correctness at $((SECONDS-t0))s"; save
timeout 50 bin/test-gpu_packed --ignored --nocapture time_packed > $w/packed-timing.log 2>&1
echo "packed timing rc=$? at $((SECONDS-t0))s"; grep "packed / dense" $w/packed-timing.log | cut -c1-200; save
timeout $(until_s 340) bin/test-gpu_gqa --ignored --nocapture time_grouped > $w/gqa-timing.log 2>&1
echo "gqa timing rc=$? at $((SECONDS-t0))s"; grep "grouped / ungrouped" $w/gqa-timing.log | cut -c1-330; save
for kernel in fa3_forward_bf16_d64_w3c128_varlen fa3_forward_bf16_d64_w3c128; do
  timeout $(until_s $([ $kernel = fa3_forward_bf16_d64_w3c128 ] && echo 500 || echo 420)) ncu --kernel-name $kernel --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section InstructionStats --section WarpStateStats -o $w/$kernel \
    bin/test-gpu_packed --ignored --nocapture time_packed > $w/ncu-$kernel.log 2>&1
  echo "ncu $kernel rc=$? at $((SECONDS-t0))s"
  ncu -i $w/$kernel.ncu-rep --page source --csv --print-source sass > $w/source-$kernel.csv 2> $w/source-$kernel.err
  echo "source export rc=$? $(wc -l < $w/source-$kernel.csv) lines"; head -c 600 $w/source-$kernel.err
  ncu -i $w/$kernel.ncu-rep --page details --csv > $w/details-$kernel.csv 2>&1
  grep -E "Executed Instructions\"|Duration\"|Warp Cycles Per Issued" $w/details-$kernel.csv | cut -c1-200
  save
done
timeout $(until_s 525) python3 scripts/torch_decode_bench.py --out $w/torch-decode.json > $w/torch-decode.log 2>&1
echo "torch-decode rc=$? at $((SECONDS-t0))s"
timeout $(until_s 565) bin/flash-attn bench --decode --torch $w/torch-decode.json --decode-variants s4,s33,s66 --out-dir $w/decode > $w/decode.log 2>&1
echo "decode rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/decode/decode.md | cut -c1-400 | head -12
echo "done at $((SECONDS-t0))s"; save
