#!/usr/bin/env bash
# Device call 29 (tenth session, 2026-12-02): the bridge's host cost per call. Call 28's training
# example ran 16.91 ms a step against PyTorch flash's 13.96 on a model small enough to be bound by
# the host issuing kernels. `Gpu::alloc` now asks the pool first and cuMemGetInfo only on failure.
# A: scripts/bridge_overhead.py with the wheel before (python/old/) and after (python/wheels/),
#    at the tiny shape and at the example's; B: the out-of-memory tests (the path that changed);
#    C: the Python suite and the example on the new wheel; D: check on fa3 and fa2-tc, fa3's
#    backward grids. At most 420 s. Run: bash bundle/call29.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call29.tgz -C $w .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1 PYTHONDONTWRITEBYTECODE=1
for v in old new; do
  site=$(mktemp -d); whl=python/wheels/*.whl; [ $v = old ] && whl=python/old/*.whl
  python3 -m pip install --quiet --no-deps --no-index --no-compile --target $site $whl
  for shape in 1,128,8,64 4,2048,8,64; do
    PYTHONPATH=$site timeout 60 python3 scripts/bridge_overhead.py --shape $shape > $w/overhead-$v-$shape.txt 2>&1
    echo "overhead $v $shape rc=$? at $((SECONDS-t0))s"; grep "^|" $w/overhead-$v-$shape.txt | tail -3
  done
done
sed -n '/cProfile/,$p' $w/overhead-old-1,128,8,64.txt | head -22 | cut -c1-160
sed -n '/cProfile/,$p' $w/overhead-new-1,128,8,64.txt | head -22 | cut -c1-160
save
mkdir -p $w/t
job() { name=$1; shift; ( timeout $(until_s 250) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
job oom_numerics bin/test-gpu_numerics out_of_memory
job oom_backward bin/test-gpu_backward out_of_memory
job oom_gqa bin/test-gpu_gqa past_memory
job check bin/flash-attn check --require-gpu --algorithms fa3,fa2-tc --dtypes bf16
job bwd_fa3 bin/test-gpu_backward fa3 --test-threads=2
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$" $w/t/*.log | cut -c1-300 | head -20; tail -qn1 $w/t/check.log
echo "tests at $((SECONDS-t0))s"; save
EXAMPLE_ARGS="--max-seqlen 262144" timeout $(until_s 410) bash run-python-tests.sh $w/python > $w/python.log 2>&1
echo "python rc=$? at $((SECONDS-t0))s"; tail -3 $w/python.log; grep -E "^\| " $w/python/example.md 2>/dev/null | tail -5
echo "done at $((SECONDS-t0))s"; save
