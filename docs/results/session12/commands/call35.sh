#!/usr/bin/env bash
# Device call 35 (twelfth session, 2026-12-02): FA3 packed without the empty-block test before
# the roles split (each role's own tile says so) and with the rescale vote's thresholds
# computed once per row; the Python bridge's flash_attn_varlen_func (new, never run); decode
# timed on random caches (were zeros) and ncu --set full of our split-KV kernel at 128k x 16
# against 32k x 64. At most 590 s.
# A, in parallel: the packed grid (bit for bit against the dense kernel per sequence),
#    check --packed (f64), memcheck and synccheck of check --packed (fa3), the window grid, and
#    the Python suite (its new test_gpu_varlen.py among it).
# B, timing alone: packed / dense, twice.
# C, decode against PyTorch in the same call (random caches both sides).
# D, ncu of one decode split-KV launch at 131072x16 and at 32768x64.
# Run: bash bundle/call35.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call35.tgz -C $w --exclude='*.ncu-rep' .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; shift; ( timeout $(until_s 200) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
job packed bin/test-gpu_packed --test-threads=2
job check_packed bin/flash-attn check --require-gpu --packed
job window bin/test-gpu_window
for tool in memcheck synccheck; do
  job san_$tool compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --packed --algorithms fa3
done
( EXAMPLE=0 timeout $(until_s 200) bash run-python-tests.sh $w/python > $w/t/python.log 2>&1; echo "python rc=$?" > $w/t/python.rc ) &
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$|FAIL \[|cases, " $w/t/*.log | cut -c1-300 | head -20
grep -hE "ERROR SUMMARY" $w/t/*.log; tail -qn1 $w/t/check_packed.log $w/t/san_*.log | cut -c1-200
grep -c "→ pass" $w/t/check_packed.log $w/t/san_*.log
grep -E "passed|failed" $w/t/python.log | tail -4
echo "correctness at $((SECONDS-t0))s"; save
for run in 1 2; do
  timeout 60 bin/test-gpu_packed --ignored --nocapture time_packed > $w/packed-timing-$run.log 2>&1
  echo "packed timing $run rc=$? at $((SECONDS-t0))s"; grep "packed / dense" $w/packed-timing-$run.log | cut -c1-200
done; save
timeout $(until_s 400) python3 scripts/torch_decode_bench.py --out $w/torch-decode.json > $w/torch-decode.log 2>&1
echo "torch-decode rc=$? at $((SECONDS-t0))s"
timeout $(until_s 470) bin/flash-attn bench --decode --torch $w/torch-decode.json --out-dir $w/decode > $w/decode.log 2>&1
echo "decode rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/decode/decode.md | cut -c1-400 | head -12; save
for shape in 131072x16 32768x64; do
  timeout $(until_s $([ $shape = 32768x64 ] && echo 585 || echo 530)) ncu --kernel-name regex:decode_splitkv --launch-skip 3 --launch-count 1 --set full -o $w/decode-$shape \
    bin/flash-attn bench --decode --decode-shapes $shape --out-dir $w/ncu-$shape > $w/ncu-$shape.log 2>&1
  echo "ncu $shape rc=$? at $((SECONDS-t0))s"
  ncu -i $w/decode-$shape.ncu-rep --page details --csv > $w/details-$shape.csv 2>&1
  grep -E "\"(Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit Rate|Achieved Occupancy|Registers Per Thread|Grid Size|Block Size|Warp Cycles Per Issued Instruction|Mem Busy|Max Bandwidth|dram__bytes_read.sum)\"" $w/details-$shape.csv | cut -c1-220
  save
done
echo "done at $((SECONDS-t0))s"; save
