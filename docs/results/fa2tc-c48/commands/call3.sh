#!/usr/bin/env bash
# Device call 3 (2026-12-01 second session, nvidia-h200): the main job on the final code,
# `bundle/run-bench.sh` (PyTorch's SDPA backends, then every algorithm over the papers' sweep,
# merged into one table; then the HBM traffic under ncu), to refresh docs/results/bench.md with
# the register-blocked FA1 and fa2-tc v6.
set -u
out=$1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
t0=$SECONDS
timeout 570 bash bundle/run-bench.sh $out/results > $out/run-bench.log 2>&1
echo "run-bench rc=$? in $((SECONDS-t0))s"
tail -5 $out/run-bench.log
