#!/usr/bin/env bash
# Device call 16 (2026-12-01 sixth session), branch gqa (main merged): the backward rule with one
# ulp of slack and the standard backward's D = rowsum(P∘dP): check --backward three times with
# fresh seeds and the backward GPU tests; the standard backward timed; memcheck over the decode
# tests (call 14's timed out under load).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call16.tgz -C $w .; }
left() { local l=$((560 - (SECONDS - t0))); [ $l -gt $1 ] && echo $1 || echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
timeout 90 bin/flash-attn bench --backward --backward-variants standard,fa2-tc --seqlens 2048,4096 --head-dims 64,128 --causal both --out-dir $w/bwd-std > $w/bwd-std.log 2>&1
echo "bwd-std rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/bwd-std/backward.md | head -12; save
mkdir -p $w/t
for s in 1 2 3; do
  ( timeout $(left 240) bin/flash-attn check --require-gpu --backward > $w/t/check$s.log 2>&1; echo "check$s rc=$?" > $w/t/check$s.rc ) &
done
( timeout $(left 300) bin/test-gpu_backward --test-threads=2 > $w/t/gpu_backward.log 2>&1; echo "gpu_backward rc=$?" > $w/t/gpu_backward.rc ) &
( timeout $(left 300) bin/test-gpu_gqa --test-threads=2 > $w/t/gpu_gqa.log 2>&1; echo "gpu_gqa rc=$?" > $w/t/gpu_gqa.rc ) &
( timeout $(left 440) compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 bin/test-gpu_decode --test-threads=4 \
    > $w/t/memcheck-gpu_decode.log 2>&1; echo "memcheck-gpu_decode rc=$?" > $w/t/memcheck-gpu_decode.rc ) &
wait
cat $w/t/*.rc; for s in 1 2 3; do grep -E "FAIL$" $w/t/check$s.log | cut -c1-250 | head -5; tail -1 $w/t/check$s.log; done
grep -hE "test result|panicked|FAILED" $w/t/*.log | head -20; grep -h "ERROR SUMMARY" $w/t/memcheck-*.log
# The largest ratio of error to bound over every backward check case.
cat $w/t/check*.log | python3 -c '
import re,sys
worst=[]
for l in sys.stdin:
    if not l.startswith("backward"): continue
    r=[float(a)/float(b) for a,b in re.findall(r"d[qkv]=([0-9.e+-]+)/([0-9.e+-]+)",l)]
    if r: worst.append((max(r), l[:110]))
worst.sort(reverse=True); print(len(worst),"cases; worst error/bound:"); [print("%.3f"%x, s) for x,s in worst[:6]]'
echo "done at $((SECONDS-t0))s"; save
