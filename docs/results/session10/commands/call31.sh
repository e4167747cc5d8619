#!/usr/bin/env bash
# Device call 31 (tenth session, 2026-12-02): the Python bridge's window_size and softcap (new:
# forward on fa3 and fa2-tc against the float64 reference, the backward's named refusal) and
# the whole Python suite on this wheel (the example is call 29's). At most 270 s.
# Run: bash bundle/call31.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
cd bundle
EXAMPLE=0 timeout 260 bash run-python-tests.sh $w/python > $w/python.log 2>&1
echo "python rc=$? at $((SECONDS-t0))s"; grep -E "passed|failed|FAIL" $w/python.log | tail -6
grep -h "scores" $w/python/numerics.tsv 2>/dev/null | sort -t "$(printf '\t')" -k5,5 -g -r | head -6 | cut -c1-200
tar czf $out/call31.tgz -C $w .
