#!/usr/bin/env bash
# Device call 15 (2026-12-01 sixth session): call 14's timing again (its torch step had a bad flag),
# then correctness in parallel: check --backward three times (fresh seeds) with the in-dtype
# baseline that models the forward's rounded P, the GPU tests that timed out under call 14's load.
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call15.tgz -C $w .; }
left() { local l=$((580 - (SECONDS - t0))); [ $l -gt $1 ] && echo $1 || echo $((l > 5 ? l : 5)); }
cd bundle
for f in ptx/*.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
shapes="--seqlens 2048,8192 --head-dims 64,128 --causal both"
timeout 60 python3 scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $shapes --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"; save
bench() { name=$1; shift; timeout 40 "$@" $shapes --no-max-seqlen --torch $w/torch.json --out-dir $w/$name > $w/$name.log 2>&1
  echo "$name rc=$? at $((SECONDS-t0))s"; grep -E "^\| [0-9]" $w/$name/bench.md | grep -v GiB | head -8; save; }
for round in 1 2; do
  for v in main gqa; do
    FLASH_ATTN_PTX=ptx/${v}_fa2tc.ptx bench fa2tc-$v-$round bin/flash-attn bench --algorithms fa2-tc
    FLASH_ATTN_HOPPER_PTX=ptx/${v}_hopper.ptx bench fa3-$v-$round bin/flash-attn bench --algorithms fa3
  done
done
echo "timing done at $((SECONDS-t0))s"
mkdir -p $w/t
for s in 1 2 3; do
  ( timeout $(left 200) bin/flash-attn check --require-gpu --backward > $w/t/check$s.log 2>&1; echo "check$s rc=$?" > $w/t/check$s.rc ) &
done
for t in gpu_backward gpu_attention gpu_decode; do
  ( timeout $(left 420) bin/test-$t --test-threads=2 > $w/t/$t.log 2>&1; echo "$t rc=$?" > $w/t/$t.rc ) &
done
wait
cat $w/t/*.rc; for s in 1 2 3; do grep -E "FAIL$" $w/t/check$s.log | head -5; tail -1 $w/t/check$s.log; done
grep -hE "test result|panicked|FAILED" $w/t/*.log | head -20
echo "done at $((SECONDS-t0))s"; save
