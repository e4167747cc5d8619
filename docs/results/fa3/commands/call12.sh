#!/usr/bin/env bash
# Device call 12 (2026-12-01 fifth session): the bridge's example without --quick, so seed 002's
# table has the longest sequence that fits one training step (doubling to 256k) for ours, PyTorch
# flash, cuDNN and math.
set -u
out=$1; cd bundle
python3 -m pip install --quiet --no-deps --no-index --target /tmp/site python/wheels/flash_attn_rs-*.whl
PYTHONPATH=/tmp/site timeout 270 python3 python/examples/01_train_tiny_llama.py --max-seqlen 262144 \
  --out $out/example-full.md 2>&1 | tee $out/example-full.log | tail -40
