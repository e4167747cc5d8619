#!/usr/bin/env bash
# One device call that validates fa2-tc changes. GPU 0: correctness (check, every tiling at every
# tensor-core head dim, the grid, the numerics tests with 200 random cases), then fa2-tc and
# PyTorch's flash backend interleaved (lab/scripts/interleaved_bench.sh, d = 64 and 128). The last GPU
# (GPU 1 on an nvidia-h200-x2 machine, else GPU 0 after the rest): compute-sanitizer's four tools
# over fa2-tc at the sanitizer shapes, f16 and bf16, as parallel processes.
# Run from the repository root after `cargo xtask bundle`; every log lands in OUT_DIR/validate.tgz
# (one file: the device returns only a few). Each step is bounded (STEP_TIMEOUT, default 240 s).
# Usage: lab/scripts/validate_fa2tc.sh OUT_DIR
set -u
out=${1:?usage: lab/scripts/validate_fa2tc.sh OUT_DIR}
work=$(mktemp -d)
status=0
step() {
  local name=$1; shift
  echo "== $name"
  if timeout "${STEP_TIMEOUT:-240}" "$@" > "$work/$name.log" 2>&1; then echo "   pass"; else echo "   FAIL"; status=1; tail -20 "$work/$name.log"; fi
}
sanitize() {
  local tool
  for tool in memcheck racecheck synccheck initcheck; do
    CUDA_VISIBLE_DEVICES=$1 timeout "${SANITIZER_TIMEOUT:-420}" compute-sanitizer --tool "$tool" \
      --error-exitcode 99 --print-limit 20 bundle/bin/flash-attn check --require-gpu \
      --shapes sanitizer --algorithms fa2-tc --dtypes f16,bf16 > "$work/sanitizer-$tool.log" 2>&1 &
  done
}
gpus=$(nvidia-smi -L | wc -l)
[ "$gpus" -gt 1 ] && sanitize $((gpus - 1))
export CUDA_VISIBLE_DEVICES=0
step check bundle/bin/flash-attn check --require-gpu --algorithms fa2-tc
step tilings bundle/bin/test-gpu attention::every_fa2_tc_tiling --test-threads=1 --show-output
step grid bundle/bin/test-gpu attention::fa1_and_fa2_pass_the_grid --test-threads=1 --show-output
step numerics bundle/bin/test-gpu numerics:: --test-threads=1 --show-output
STEP_TIMEOUT=300 HEAD_DIMS=64,128 step timing bash lab/scripts/interleaved_bench.sh "$work/timing" 2
unset CUDA_VISIBLE_DEVICES
[ "$gpus" -gt 1 ] || sanitize 0
wait
for tool in memcheck racecheck synccheck initcheck; do
  log=$work/sanitizer-$tool.log
  summary=$(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$log")
  echo "== sanitizer $tool: $(grep -c ' ok$' "$log") cases, ${summary:-no summary (timed out?)}"
  case $summary in *" 0 errors"* | *" 0 hazards"*) ;; *) status=1 ;; esac
done
grep -h "worst\|cases\|test result" "$work"/tilings.log "$work"/grid.log "$work"/numerics.log
cat "$work/timing/summary.md" 2>/dev/null
mkdir -p "$out" && tar czf "$out/validate.tgz" -C "$work" .
exit $status
