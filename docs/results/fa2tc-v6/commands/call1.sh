#!/usr/bin/env bash
# Device call 1 (2026-12-01, nvidia-h200, one GPU): v6 (threshold rescale; B_c = 32 tilings)
# correctness, then v5 against v6's tilings with one host binary, PyTorch flash in the same call.
# bundle/ptx/v5.ptx: main at 3e856ef with its entries renamed to the `c64` names
# (sed 's/\(fa2tc_forward_[a-z0-9]*_d[0-9]*_w[0-9]r[0-9]s[0-9]\)/\1c64/g'); v6.ptx: this commit.
set -u
out=$1; w=$(mktemp -d)
step() { local name=$1 t=$2; shift 2; echo "== $name"; timeout $t "$@" > $w/$name.log 2>&1; echo "   rc=$? at ${SECONDS}s"; }
ab() { timeout $1 bash scripts/ab_variants.sh $w/ab "${@:2}" 2>&1 | tee -a $w/ab.txt; echo "   at ${SECONDS}s"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
step check 60 bundle/bin/flash-attn check --require-gpu --algorithms fa2-tc
step tilings 120 bundle/bin/test-gpu_attention every_fa2_tc_tiling --test-threads=1 --show-output
step numerics 120 bundle/bin/test-gpu_numerics --test-threads=1 --show-output
tail -n 2 $w/check.log; grep -h "cases\|worst\|test result" $w/tilings.log $w/numerics.log
export SEQLENS=2048,8192
TILING=4x2s1c64 HEAD_DIMS=128 ab 100 v5 v6
TILING=4x2s1c32 HEAD_DIMS=128 ab 50 v6
TILING=4x2s2c32 HEAD_DIMS=128 ab 50 v6
TILING=4x2s1c64 HEAD_DIMS=128 ab 50 v5
TILING=4x2s2c64 HEAD_DIMS=64 ab 100 v5 v6
TILING=4x2s2c32 HEAD_DIMS=64 ab 50 v6
step torch 100 python3 scripts/torch_sdpa_bench.py --backends torch-flash --out $w/torch.json --seqlens 2048,8192 --head-dims 64,128
grep "d=" $w/torch.log
export SEQLENS=4096
for t in 4x2s1c64 4x2s1c32 4x2s2c32; do TILING=$t HEAD_DIMS=96 ab 40 v6; done
TILING=4x2s1c64 HEAD_DIMS=96 ab 40 v5
TILING=4x1s1c64 HEAD_DIMS=256 ab 60 v5 v6
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
tar czf $out/call1.tgz -C $w .
