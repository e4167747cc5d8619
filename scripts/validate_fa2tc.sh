#!/usr/bin/env bash
# One device call that validates fa2-tc changes: correctness (check, every tiling at every
# tensor-core head dim, the grid) and timings of the tilings beside PyTorch (racecheck runs
# separately: bundle/run-sanitizer.sh). Run from the repository root after `cargo xtask bundle`; everything
# lands in OUT_DIR/validate.tgz (one file, so it comes back from the device in one piece).
# Usage: scripts/validate_fa2tc.sh OUT_DIR
set -u
out=${1:?usage: scripts/validate_fa2tc.sh OUT_DIR}
work=$(mktemp -d)
status=0
step() {
  local name=$1; shift
  echo "== $name"
  if timeout "${STEP_TIMEOUT:-240}" "$@" > "$work/$name.log" 2>&1; then echo "   pass"; else echo "   FAIL"; status=1; tail -20 "$work/$name.log"; fi
}
step check bundle/bin/flash-attn check --require-gpu --algorithms fa2-tc
step tilings bundle/bin/test-gpu_attention every_fa2_tc_tiling --test-threads=1 --show-output
step grid bundle/bin/test-gpu_attention fa1_and_fa2_pass_the_grid --test-threads=1 --show-output
for tiling in 4x2s2 4x2s1; do
  step "bench-$tiling" bundle/bin/flash-attn bench --algorithms fa2-tc --seqlens 2048,8192 \
    --head-dims 64,128 --no-max-seqlen --fa2-tc-tiling "$tiling" --out-dir "$work/bench-$tiling"
done
step bench-new-dims bundle/bin/flash-attn bench --algorithms fa2-tc,fa2 --seqlens 4096 \
  --head-dims 32,96,256 --no-max-seqlen --out-dir "$work/bench-new-dims"
step torch python3 scripts/torch_sdpa_bench.py --out "$work/torch.json" --seqlens 2048,4096,8192 \
  --head-dims 32,64,96,128,256
grep -h "worst\|cases" "$work"/tilings.log "$work"/grid.log
for f in "$work"/bench-*/bench.md; do echo "== $f"; grep '^| [0-9]' "$f" | grep -v GiB; done
mkdir -p "$out" && tar czf "$out/validate.tgz" -C "$work" .
exit $status
