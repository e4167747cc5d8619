#!/usr/bin/env bash
# Device call (prepared in the eighth session, 2026-12-01), branch decode-one-launch: decoding in
# one launch (issue #17's batch-1 point). The split-KV blocks store their partial (Õ, m, ℓ) and
# arrive at a per-(batch·KV head, row tile) counter (atom.acq_rel.gpu); the last one merges the
# splits and resets the counter; the plan merges that way while the grid fits one wave.
# A, correctness in parallel (170 s at most; call 10's decode tests took 175 s beside other jobs,
#    their grid's 144 cases one after another): the decode GPU tests (the one-launch grid, both
#    merges at forced split counts, one workspace called with other split counts in a row), check
#    --decode, and compute-sanitizer memcheck and racecheck on check --decode's short caches
#    (`--shapes sanitizer`: both merges, repeated calls, appends); the plans at the anchors.
# B, timing alone (105 s at most; ~60 s expected): PyTorch's decode backends, then ours at
#    ANCHORS.md's shapes: the plan's choice (`decode`), two launches forced (`decode-two-launch`),
#    16 and 64 splits forced (`decode-s16`, `decode-s64`).
# The bundle: `cargo xtask bundle` on decode-one-launch (at d5d8707: 51.5 MiB, 9 binaries and the
# wheel; it fits the 64 MiB transfer as it is).
# Run from the repository root: bash docs/results/session8/commands/decode.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/decode.tgz -C $w .; }
left() { local l=$((290 - (SECONDS - t0))); [ $l -gt $1 ] && echo $1 || echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; limit=$2; shift 2; ( timeout $(left $limit) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
job gpu_decode 170 bin/test-gpu_decode --test-threads=8 --show-output
job check_decode 150 bin/flash-attn check --require-gpu --decode
job memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --decode --shapes sanitizer --dtypes bf16
job racecheck 150 compute-sanitizer --tool racecheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --decode --shapes sanitizer --dtypes bf16
for batch_len in 1,4096 16,4096 64,4096 1,32768 16,32768 1,131072; do
  bin/flash-attn plan --decode --causal --shape ${batch_len%,*},32,1,128 --kv-heads 8 --seqlen-k ${batch_len#*,} | tail -1
done > $w/t/plans.log 2>&1
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL \[|worst error" $w/t/gpu_decode.log | cut -c1-250 | head -20
grep -h "ERROR SUMMARY" $w/t/memcheck.log $w/t/racecheck.log; grep -hE "FAIL \[" $w/t/check_decode.log | cut -c1-250 | head -5
tail -qn1 $w/t/check_decode.log $w/t/memcheck.log $w/t/racecheck.log; cut -c1-200 $w/t/plans.log
echo "correctness at $((SECONDS-t0))s"; save
timeout $(left 60) python3 scripts/torch_decode_bench.py --out $w/torch-decode.json > $w/torch-decode.log 2>&1
echo "torch-decode rc=$? at $((SECONDS-t0))s"; save
timeout $(left 45) bin/flash-attn bench --decode --torch $w/torch-decode.json --decode-variants two-launch,s16,s64 --out-dir $w/decode-bench > $w/decode-bench.log 2>&1
echo "decode-bench rc=$? at $((SECONDS-t0))s"; grep -E "^\||^- " $w/decode-bench/decode.md | cut -c1-400
echo "done at $((SECONDS-t0))s"; save
