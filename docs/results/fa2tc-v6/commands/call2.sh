#!/usr/bin/env bash
# Device call 2 (2026-12-01, nvidia-h200): call 1's one tiling-test failure replayed with its seed
# on v6 and on v5 (same inputs), the grid, then the full sweep of v6's defaults and PyTorch flash.
set -u
out=$1; w=$(mktemp -d)
step() { local name=$1 t=$2; shift 2; echo "== $name"; timeout $t "$@" > $w/$name.log 2>&1; echo "   rc=$? at ${SECONDS}s"; }
export FLASH_ATTN_SEED=3897348449739562757
step tilings-v6 100 bundle/bin/test-gpu_attention every_fa2_tc_tiling --test-threads=1 --show-output
gunzip -kf bundle/ptx/v5.ptx.gz
FLASH_ATTN_PTX=bundle/ptx/v5.ptx step tilings-v5 100 bundle/bin/test-gpu_attention every_fa2_tc_tiling --test-threads=1 --show-output
unset FLASH_ATTN_SEED
grep -h "FAILED\|near the bound\|cases" $w/tilings-v6.log $w/tilings-v5.log | head -40
step grid 150 bundle/bin/test-gpu_attention fa1_and_fa2_pass_the_grid --test-threads=1 --show-output
grep -h "cases" $w/grid.log
step bench 170 bundle/bin/flash-attn bench --algorithms fa2-tc --seqlens 2048,4096,8192 --head-dims 32,64,96,128,256 --no-max-seqlen --out-dir $w/bench
step torch 140 python3 scripts/torch_sdpa_bench.py --backends torch-flash --out $w/torch.json --seqlens 2048,4096,8192 --head-dims 32,64,96,128,256
grep "^| [0-9]" $w/bench/bench.md | grep -v GiB; grep "d=" $w/torch.log
tar czf $out/call2.tgz -C $w .
