#!/usr/bin/env bash
# Device call 25 (ninth session, 2026-12-01), session9 at 33f0ea1 (call 24's bundle): issue 14's
# sweep in one call, FA3 against PyTorch's flash and cuDNN, bf16, d = 64, 96, 128, 256, N = 2k-16k,
# causal both (B·N = 16384 tokens, H·d = 2048); then issue 15's, the backward (fa3, the default)
# against PyTorch's at d = 64 and 128, N = 2k-16k. At most 300 s.
# Run: bash bundle/call25.sh $OUT (carry bundle).
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call25.tgz -C $w .; }
until_s() { local l=$(($1 - (SECONDS - t0))); echo $((l > 5 ? l : 5)); }
cd bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
fwd="--seqlens 2048,4096,8192,16384 --head-dims 64,96,128,256 --causal both"
timeout 80 python3 scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $fwd --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"; save
timeout $(until_s 170) bin/flash-attn bench --algorithms fa3 $fwd --no-max-seqlen --torch $w/torch.json --out-dir $w/fa3 > $w/fa3.log 2>&1
echo "fa3 rc=$? at $((SECONDS-t0))s"; grep -E '^\|' $w/fa3/bench.md | grep -v GiB | cut -d'|' -f2-8,10-12 | head -36; save
bwd="--seqlens 2048,4096,8192,16384 --head-dims 64,128 --causal both"
timeout $(until_s 235) python3 scripts/torch_backward_bench.py $bwd --out $w/torch-bwd.json > $w/torch-bwd.log 2>&1
echo "torch-bwd rc=$? at $((SECONDS-t0))s"; save
timeout $(until_s 298) bin/flash-attn bench --backward --backward-variants fa3 $bwd --torch $w/torch-bwd.json --out-dir $w/bwd > $w/bwd.log 2>&1
echo "bwd rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/bwd/backward.md | head -40
echo "done at $((SECONDS-t0))s"; save
