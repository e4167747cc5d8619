#!/usr/bin/env bash
# Device call 4 (2026-12-01 second session, nvidia-h200): the four compute-sanitizer tools over
# `check --shapes standard` (every algorithm and dtype, causal both ways), whose head dims include
# 1, 32, 59 and 96: the quad padding of FA1 v2 (d not a multiple of 4) and the fallbacks, which
# the sanitizer shape set (d = 8, 40, 64, 128, 256) does not reach.
set -u
out=$1; w=$(mktemp -d); mkdir -p $w/san
for tool in memcheck racecheck synccheck initcheck; do
  ( t0=$SECONDS; timeout 420 compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      bundle/bin/flash-attn check --require-gpu --shapes standard > $w/san/$tool-standard-shapes.log 2>&1
    echo "$tool rc=$? in $((SECONDS-t0))s" >> $w/san/times.txt ) &
done
wait
cat $w/san/times.txt
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) cases ok, $(grep -c 'FAIL' $f) failed, $(grep -h 'SUMMARY' $f)"; done
tar czf $out/call4.tgz -C $w .
