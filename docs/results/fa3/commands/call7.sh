#!/usr/bin/env bash
# Device call 7 (2026-12-01 fourth session): the committed code. Its FA3 module is instruction for
# instruction call 2's (scripts/compare_kernels.py: 16 of 16 identical; call 4 ran a build whose
# LLVM output differed in layout only), plus d = 64 w3c96/w3c64. Correctness of every tiling
# again, and the d = 64/128 timing at N = 4096 beside call 4's.
set -u
out=$1; w=$(mktemp -d); mkdir -p $w/san; t0=$SECONDS
save() { tar czf $out/call7.tgz -C $w .; }
timeout 60 bundle/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16,f16 > $w/check.log 2>&1
rc=$?; echo "check rc=$rc at $((SECONDS-t0))s"; tail -1 $w/check.log; save
[ $rc = 0 ] || exit 1
( FLASH_ATTN_REQUIRE_GPU=1 timeout 100 bundle/bin/test-gpu_attention every_fa3_tiling --show-output > $w/tilings.log 2>&1
  echo "tilings rc=$?" > $w/tilings.rc ) &
for tool in memcheck synccheck; do
  ( timeout 90 compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      bundle/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16 --shapes sanitizer \
      > $w/san/$tool.log 2>&1; echo "$tool rc=$?" >> $w/san/rc.txt ) &
done
wait
cat $w/tilings.rc $w/san/rc.txt; grep -E "cases, |test result" $w/tilings.log
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) ok, $(grep -h 'ERROR SUMMARY' $f | head -1)"; done
timeout 40 bundle/bin/flash-attn bench --algorithms fa3 --seqlens 4096 --head-dims 64,128 --causal both --no-max-seqlen --out-dir $w/bench > $w/bench.log 2>&1
echo "bench rc=$? at $((SECONDS-t0))s"; grep -E "^\| [0-9]" $w/bench/bench.md | head -4
save
