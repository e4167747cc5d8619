#!/usr/bin/env bash
# Device call 30 (tenth session, 2026-12-02): call 29 again, in the right order. There the first
# process to open the GPU (the overhead script) paid the modules' JIT and ran out of time, and
# the tests then had 7 s. A: the out-of-memory tests, check on fa3 and fa2-tc and fa3's backward
# grids (they also warm the driver's JIT cache); B: scripts/bridge_overhead.py with the wheel
# before (python/old/) and after (python/wheels/). At most 400 s.
# Run: bash bundle/call30.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call30.tgz -C $w .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
export FLASH_ATTN_REQUIRE_GPU=1 PYTHONDONTWRITEBYTECODE=1
mkdir -p $w/t
job() { name=$1; shift; ( timeout $(until_s 190) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
job oom_numerics bin/test-gpu_numerics out_of_memory
job oom_backward bin/test-gpu_backward out_of_memory
job oom_gqa bin/test-gpu_gqa past_memory
job check bin/flash-attn check --require-gpu --algorithms fa3,fa2-tc --dtypes bf16
job bwd_fa3 bin/test-gpu_backward fa3 --test-threads=2
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$" $w/t/*.log | cut -c1-300 | head -20; tail -qn1 $w/t/check.log
echo "tests at $((SECONDS-t0))s"; save
for v in new old; do
  site=$(mktemp -d); whl=python/wheels/*.whl; [ $v = old ] && whl=python/old/*.whl
  python3 -m pip install --quiet --no-deps --no-index --no-compile --target $site $whl
  PYTHONPATH=$site timeout $(until_s $([ $v = new ] && echo 290 || echo 390)) python3 scripts/bridge_overhead.py --calls 100 > $w/overhead-$v.txt 2>&1
  echo "overhead $v rc=$? at $((SECONDS-t0))s"; grep -E "^\||plans" $w/overhead-$v.txt | tail -4 | cut -c1-300
  sed -n '/cProfile/,$p' $w/overhead-$v.txt | head -24 | cut -c1-150; save
done
echo "done at $((SECONDS-t0))s"; save
