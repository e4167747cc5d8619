#!/usr/bin/env bash
# Device call 11 (2026-12-01 fifth session): call 10's FA3 timing again (its torch step had a bad
# flag): the merged defaults (persistent where call 9 measured it faster) against the row-end-mask
# variant, PyTorch in the same call; and the Python suite with its two test fixes.
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call11.tgz -C $w .; }
cd bundle
for f in ptx/*.gz; do gunzip -kf $f; done
( EXAMPLE=0 FLASH_ATTN_REQUIRE_GPU=1 timeout 150 bash run-python-tests.sh $w/py > $w/py.log 2>&1; echo "python rc=$?" > $w/py.rc )
cat $w/py.rc; grep -E "passed|failed|FAIL" $w/py.log | tail -3; save
shapes="--seqlens 2048,4096,8192,16384 --head-dims 64,128 --causal both"
timeout 60 python3 scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $shapes --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"
timeout 60 bin/flash-attn bench --algorithms fa3 $shapes --no-max-seqlen --torch $w/torch.json --out-dir $w/fa3 > $w/fa3.log 2>&1
echo "fa3 rc=$? at $((SECONDS-t0))s"; grep -E "^\| [0-9]" $w/fa3/bench.md | head -16; save
FLASH_ATTN_HOPPER_PTX=ptx/fa3_rowend.ptx timeout 60 bin/flash-attn bench --algorithms fa3 $shapes --no-max-seqlen --torch $w/torch.json --out-dir $w/fa3-rowend > $w/fa3-rowend.log 2>&1
echo "fa3-rowend rc=$? at $((SECONDS-t0))s"; grep -E "^\| [0-9]" $w/fa3-rowend/bench.md | head -16; save
timeout 60 bin/flash-attn bench --algorithms fa3 $shapes --no-max-seqlen --torch $w/torch.json --out-dir $w/fa3-again > $w/fa3-again.log 2>&1
echo "fa3-again rc=$? at $((SECONDS-t0))s"; grep -E "^\| [0-9]" $w/fa3-again/bench.md | head -16; save
