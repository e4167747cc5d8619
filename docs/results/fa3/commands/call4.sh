#!/usr/bin/env bash
# Device call 4 (2026-12-01 fourth session, nvidia-h200): the final code. Call 3's module hung:
# its Õ rescale between the S and P̃·V issues put a wgmma.fence inside a per-warp branch
# (synccheck: "Mismatching warpgroup instruction pc between warps"); this one rescales after
# the P̃·V wait again (call 2's schedule), with d = 64 on three consumer warpgroups.
# 1. Correctness: `check` of fa3 (stops here if it fails or hangs); every FA3 tiling against the
#    reference (test binary, filtered) beside memcheck and synccheck on fa3.
# 2. The benchmark, PyTorch's flash and cuDNN in the same call: the papers' sweep for N ≥ 2k at
#    d = 64 and 128, causal both, fa3 and fa2-tc; d = 96 and 256 at N = 4k and 16k, non-causal.
set -u
out=$1; w=$(mktemp -d); mkdir -p $w/san
save() { tar czf $out/call4.tgz -C $w .; }
t0=$SECONDS
timeout 60 bundle/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16,f16 > $w/check.log 2>&1
rc=$?; echo "check rc=$rc at $((SECONDS-t0))s"; tail -1 $w/check.log; save
[ $rc = 0 ] || exit 1
( FLASH_ATTN_REQUIRE_GPU=1 timeout 120 bundle/bin/test-gpu_attention every_fa3_tiling --show-output > $w/tilings.log 2>&1
  echo "tilings rc=$?" > $w/tilings.rc ) &
for tool in memcheck synccheck; do
  ( timeout 100 compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      bundle/bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16 --shapes sanitizer \
      > $w/san/$tool.log 2>&1; echo "$tool rc=$?" >> $w/san/rc.txt ) &
done
wait
cat $w/tilings.rc $w/san/rc.txt; grep -E "cases, |test result" $w/tilings.log
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) ok, $(grep -h 'ERROR SUMMARY' $f | head -1)"; done
echo "correctness done at $((SECONDS-t0))s"; save
sweep="--seqlens 2048,4096,8192,16384 --head-dims 64,128 --causal both"
timeout 130 python3 bundle/scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $sweep --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"; save
timeout 130 bundle/bin/flash-attn bench --algorithms fa3,fa2-tc $sweep --no-max-seqlen --torch $w/torch.json --out-dir $w/bench > $w/bench.log 2>&1
echo "bench rc=$? at $((SECONDS-t0))s"; save
other="--seqlens 4096,16384 --head-dims 96,256 --causal off"
timeout 60 python3 bundle/scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $other --out $w/torch-other.json > $w/torch-other.log 2>&1
timeout 60 bundle/bin/flash-attn bench --algorithms fa3,fa2-tc $other --no-max-seqlen --torch $w/torch-other.json --out-dir $w/bench-other > $w/bench-other.log 2>&1
echo "other rc=$? at $((SECONDS-t0))s"
grep -E "^\| [0-9]" $w/bench/bench.md | head -16; grep -E "^\| [0-9]" $w/bench-other/bench.md | head -4
save
