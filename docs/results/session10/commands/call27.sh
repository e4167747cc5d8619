#!/usr/bin/env bash
# Device call 27 (tenth session, 2026-12-02), main at b26ce98 (session 9's call-24 bundle: the
# same kernels). A: the four compute-sanitizer tools on fa3's backward at every sanitizer shape
# (d = 8..256 at seqlen 1, 17, 1000: the d = 128 kernel never ran under a sanitizer), in parallel.
# B: ncu --set full on one launch at issue 14's last missed point, d = 64 causal N = 2k bf16
# (B = 8, H = 32): FA3 v8 and cuDNN's kernel through PyTorch, to compare by counters.
# Run: bash bundle/call27.sh $OUT (carry bundle). At most 560 s.
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call27.tgz -C $w .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,driver_version --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
args="--shapes sanitizer --dtypes bf16 --algorithms fa2-tc --backward --backward-algorithms fa3"
for tool in memcheck racecheck initcheck synccheck; do
  extra=""; [ $tool = racecheck ] && extra="--racecheck-report hazard"
  ( timeout $(until_s 260) compute-sanitizer --tool $tool $extra --error-exitcode 99 --print-limit 20 \
      bin/flash-attn check --require-gpu $args > $w/$tool.log 2>&1; echo "$tool rc=$?" > $w/$tool.rc ) &
done
wait
cat $w/*.rc; grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $w/*.log; tail -qn1 $w/*check.log | cut -c1-120
grep -h "fa3\b.*d=128" $w/memcheck.log | head -3 | cut -c1-200
echo "sanitizers at $((SECONDS-t0))s"; save
key="Duration|Elapsed Cycles|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Executed Ipc A|Issue Slots Busy|Issued Warp|No Eligible|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Block Size|Grid Size|Shared Memory Config|Dynamic Shared|Executed Instructions  |Waves|Threads  "
timeout $(until_s 380) ncu --kernel-name regex:fa3_forward --launch-skip 5 --launch-count 1 --set full \
  --export $w/fa3-d64-causal-2k --print-summary none \
  bin/flash-attn bench --algorithms fa3 --seqlens 2048 --head-dims 64 --causal on --no-max-seqlen \
  --out-dir /tmp/b27 > $w/ncu-fa3.log 2>&1
echo "ncu fa3 rc=$? at $((SECONDS-t0))s"; save
timeout $(until_s 520) ncu --kernel-name 'regex:(?i)(cudnn|sdpa|fprop|fmha|flash)' --launch-skip 10 --launch-count 1 \
  --set full --export $w/cudnn-d64-causal-2k --print-summary none \
  python3 scripts/torch_sdpa_bench.py --backends torch-cudnn --seqlens 2048 --head-dims 64 --causal on \
  --out /tmp/t27.json > $w/ncu-cudnn.log 2>&1
echo "ncu cudnn rc=$? at $((SECONDS-t0))s"; save
for r in fa3-d64-causal-2k cudnn-d64-causal-2k; do
  [ -f $w/$r.ncu-rep ] || continue
  ncu --import $w/$r.ncu-rep --page details > $w/$r.details.txt 2>&1
  ncu --import $w/$r.ncu-rep --page raw --csv > $w/$r.raw.csv 2>&1
  echo "== $r"; grep -m1 -E "^  [a-zA-Z_].*\(" $w/$r.details.txt | cut -c1-160; grep -E "$key" $w/$r.details.txt | head -30
  grep -E "Stall|stall" $w/$r.details.txt | head -8 | cut -c1-200
done
echo "done at $((SECONDS-t0))s"; save
