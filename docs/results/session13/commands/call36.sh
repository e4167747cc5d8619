#!/usr/bin/env bash
# Device call 36 (thirteenth session, 2026-12-02): the packed path's one body
# (`packed::launch_packed`, reached from the library's buffers and, new, from borrowed memory:
# `attention_packed_borrowed`, which the Python bridge's flash_attn_varlen_func now calls instead
# of wrapping PyTorch's memory as host buffers), and `check --packed`'s bound over the whole
# packed output (flash-attn's varlen rule). At most 400 s.
# A, in parallel: test-gpu_packed; check --packed on a fresh seed and on call 35's failing seed;
#    memcheck of check --packed --algorithms fa3; the Python suite (its varlen tests on the new
#    path); memcheck of the Python varlen tests alone.
# Run: bash bundle/call36.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call36.tgz -C $w .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
job() { name=$1; shift; ( timeout $(until_s 330) "$@" > $w/t/$name.log 2>&1; echo "$name rc=$?" > $w/t/$name.rc ) & }
job packed bin/test-gpu_packed --test-threads=2
job check_packed bin/flash-attn check --require-gpu --packed
job check_seed35 bin/flash-attn check --require-gpu --packed --seed 13222591216699179239
job san_memcheck compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/flash-attn check --require-gpu --packed --algorithms fa3
( EXAMPLE=0 timeout $(until_s 330) bash run-python-tests.sh $w/python > $w/t/python.log 2>&1; echo "python rc=$?" > $w/t/python.rc ) &
wait
cat $w/t/*.rc; grep -hE "test result|panicked|FAILED|FAIL$|FAIL \[" $w/t/*.log | cut -c1-300 | head -20
grep -hE "ERROR SUMMARY" $w/t/*.log; tail -qn1 $w/t/check_*.log | cut -c1-200
grep -h "520 sequences" $w/t/check_seed35.log | cut -c1-220
grep -E "passed|failed" $w/t/python.log | tail -3
echo "correctness at $((SECONDS-t0))s"; save
site=$(mktemp -d); python3 -m pip install --quiet --no-deps --no-index --no-compile --target $site python/wheels/flash_attn_rs-*.whl
( cd /tmp && PYTHONPATH=$site timeout $(until_s 390) compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider -k "varlen and not example" $OLDPWD/python/tests/test_gpu_varlen.py > $w/t/py_memcheck.log 2>&1
  echo "py_memcheck rc=$?" )
grep -hE "ERROR SUMMARY|passed|failed" $w/t/py_memcheck.log | tail -3
echo "done at $((SECONDS-t0))s"; save
