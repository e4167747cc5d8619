#!/usr/bin/env bash
# Device call 1 (2026-12-01 third session, nvidia-h200): the house refactor (issue 13).
# 1. (after 2) The PTX changed (same kernels, same parameters, LLVM orders a few instructions differently):
#    time the pre-refactor module (9a44f73, bundle/ptx/base.ptx) against the new one
#    (bundle/ptx/house.ptx) with one binary through FLASH_ATTN_PTX, alternated twice (base, house,
#    house, base), with PyTorch's flash backend timed between them on the same shapes.
# 2. (first) bundle/run.sh: every test binary (the grid now at d = 160, 192, 200 for every algorithm) and
#    `check` (d = 160 and 192 in its standard shapes); beside it, compute-sanitizer's memcheck,
#    synccheck and initcheck over every algorithm at the sanitizer shapes and at d = 160.
set -u
for v in base house; do [ -f bundle/ptx/$v.ptx ] || gunzip -kf bundle/ptx/$v.ptx.gz; done
out=$1; w=$(mktemp -d); mkdir -p $w/san
save() { tar czf $out/call1.tgz -C $w .; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
t0=$SECONDS
ours() {  # variant, run name, algorithms, seqlens, head dims, causal
  FLASH_ATTN_PTX=bundle/ptx/$1.ptx bundle/bin/flash-attn bench --algorithms $3 --seqlens $4 \
    --head-dims $5 --causal $6 --no-max-seqlen --out-dir $w/$2 > $w/$2.log 2>&1
  echo "$2 rc=$? at $((SECONDS-t0))s"
}
theirs() {
  python3 bundle/scripts/torch_sdpa_bench.py --backends torch-flash --seqlens $2 --head-dims $3 \
    --causal $4 --out $w/$1.json > $w/$1.log 2>&1
  echo "$1 rc=$? at $((SECONDS-t0))s"
}
# 2: the tests, and three sanitizer tools beside them.
( cd bundle && timeout 360 bash run.sh > $w/run.log 2>&1; echo "run.sh rc=$? at $((SECONDS-t0))s" >> $w/run.rc )&
for tool in memcheck synccheck initcheck; do
  ( timeout 280 compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      bundle/bin/flash-attn check --require-gpu --shapes sanitizer > $w/san/$tool.log 2>&1
    echo "$tool rc=$?" >> $w/san/rc.txt
    timeout 70 compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 \
      bundle/bin/flash-attn check --require-gpu --head-dims 160,192 > $w/san/$tool-d160.log 2>&1
    echo "$tool d160/192 rc=$?" >> $w/san/rc.txt ) &
done
wait
cat $w/run.rc $w/san/rc.txt
grep -E "^=== .*: (pass|FAIL)|passed, .* failed|cases" $w/run.log | tail -30
for f in $w/san/*.log; do echo "$(basename $f .log): $(grep -c ' ok$' $f) ok, $(grep -h 'ERROR SUMMARY' $f | head -1)"; done
save
# 1: timing, alone on the GPU.
for v in base house house base; do
  n=$((${n:-0}+1))
  ours $v tc-$n-$v fa2-tc 2048,8192 64,128 both
  [ $n = 2 ] && theirs torch-flash 2048,8192 64,128 both
done
ours base tc96-base fa2-tc 4096 96,256 off
ours house tc96-house fa2-tc 4096 96,256 off
ours base scalar-base fa2,fa1 2048 64 off
ours house scalar-house fa2,fa1 2048 64 off
save
