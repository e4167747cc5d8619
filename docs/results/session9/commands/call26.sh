#!/usr/bin/env bash
# Device call 26 (ninth session, 2026-12-01), session9 at 33f0ea1 (call 24's bundle): the two
# sanitizer tools not yet run on FA3's backward (v3, the default): racecheck and initcheck, on
# check --backward at seqlen 113, d = 64 and 128, bf16. At most 150 s.
# Run: bash bundle/call26.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call26.tgz -C $w .; }
cd bundle
export FLASH_ATTN_REQUIRE_GPU=1
small="--seqlens 113 --head-dims 64,128 --dtypes bf16 --algorithms fa2-tc --backward --backward-algorithms fa3"
( timeout 140 compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu $small > $w/racecheck.log 2>&1; echo "racecheck rc=$?" > $w/racecheck.rc ) &
( timeout 140 compute-sanitizer --tool initcheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu $small > $w/initcheck.log 2>&1; echo "initcheck rc=$?" > $w/initcheck.rc ) &
wait
cat $w/*.rc; grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|hazard" $w/*.log | head; tail -qn1 $w/*.log | cut -c1-200
echo "done at $((SECONDS-t0))s"; save
