#!/usr/bin/env bash
# Device call 17 (2026-12-01 sixth session): where gqa's fa2-tc cost (2-5%, call 15) comes from.
# fa2-tc PTX subsets (d = 64, 128, bf16) through FLASH_ATTN_PTX, one host binary, A B C D twice:
# main; gqa (kv_head = head / group only when group > 1); c1 (unconditional integer division);
# c2 (the division in f32, exact below 2^24).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call17.tgz -C $w .; }
cd bundle
for f in ptx/*.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
shapes="--seqlens 2048,8192 --head-dims 64,128 --causal both"
for round in 1 2; do
  for v in main gqa c1 c2; do
    FLASH_ATTN_PTX=ptx/${v}_fa2tc.ptx timeout 40 bin/flash-attn bench --algorithms fa2-tc $shapes --no-max-seqlen --out-dir $w/$v-$round > $w/$v-$round.log 2>&1
    echo "$v-$round rc=$? at $((SECONDS-t0))s: $(grep -E '^\| [0-9]' $w/$v-$round/bench.md | grep -v GiB | awk -F'|' '{printf "%s ", $7}')"
    save
  done
done
