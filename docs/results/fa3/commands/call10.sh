#!/usr/bin/env bash
# Device call 10 (2026-12-01 fifth session): the merged branch `integ` (FA3's persistent grid
# and defaults; the tensor-core backward; the bridge's GPU suite; split-KV decode), in one call.
# A: correctness in parallel (backward grids and deterministic bits, decode grid, the Python
#    suite, FA3 check). B: timing alone: PyTorch's backward and ours; PyTorch's decode and ours;
#    FA3's defaults against the row-end-mask variant (bundle/ptx/fa3_rowend.ptx). Then the example.
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call10.tgz -C $w .; }
left() { local l=$((575 - (SECONDS - t0))); [ $l -gt $1 ] && echo $1 || echo $((l > 5 ? l : 5)); }
cd bundle
for f in ptx/*.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
( timeout 240 bin/test-gpu_backward --nocapture > $w/bwd.log 2>&1; echo "bwd rc=$?" > $w/bwd.rc ) &
( timeout 240 bin/test-gpu_decode --test-threads=4 --show-output > $w/decode.log 2>&1; echo "decode rc=$?" > $w/decode.rc ) &
( EXAMPLE=0 timeout 240 bash run-python-tests.sh $w/py > $w/py.log 2>&1; echo "python rc=$?" > $w/py.rc ) &
( timeout 120 bin/flash-attn check --require-gpu --algorithms fa3 --dtypes bf16,f16 > $w/check.log 2>&1; echo "check rc=$?" > $w/check.rc ) &
wait
cat $w/*.rc; tail -1 $w/check.log
grep -E "^test |test result|panicked" $w/bwd.log | head -14; grep -E "test result|panicked|FAILED" $w/decode.log | head -6
grep -E "passed|failed|FAIL" $w/py.log | tail -4
echo "A done at $((SECONDS-t0))s"; save
timeout $(left 100) python3 scripts/torch_backward_bench.py --out $w/torch-bwd.json > $w/torch-bwd.log 2>&1
echo "torch-bwd rc=$? at $((SECONDS-t0))s"; cat $w/torch-bwd.log | cut -c1-160; save
timeout $(left 150) bin/test-gpu_backward --ignored --nocapture time_the_tensor_core_backward > $w/bwd-time.log 2>&1
echo "bwd-time rc=$? at $((SECONDS-t0))s"; grep "^d = " $w/bwd-time.log; save
timeout $(left 60) python3 scripts/torch_decode_bench.py --out $w/torch-decode.json > $w/torch-decode.log 2>&1
echo "torch-decode rc=$? at $((SECONDS-t0))s"; save
timeout $(left 60) bin/flash-attn bench --decode --torch $w/torch-decode.json --out-dir $w/decode-bench > $w/decode-bench.log 2>&1
echo "decode-bench rc=$? at $((SECONDS-t0))s"; grep -E "^\|" $w/decode-bench/decode.md | head -40; save
shapes="--seqlens 2048,4096,8192,16384 --head-dims 64,128 --causal both --no-max-seqlen"
timeout $(left 40) python3 scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $shapes --out $w/torch.json > $w/torch.log 2>&1
timeout $(left 50) bin/flash-attn bench --algorithms fa3 $shapes --torch $w/torch.json --out-dir $w/fa3 > $w/fa3.log 2>&1
echo "fa3 rc=$? at $((SECONDS-t0))s"; grep -E "^\| [0-9]" $w/fa3/bench.md | head -16; save
FLASH_ATTN_HOPPER_PTX=ptx/fa3_rowend.ptx timeout $(left 50) bin/flash-attn bench --algorithms fa3 $shapes --torch $w/torch.json --out-dir $w/fa3-rowend > $w/fa3-rowend.log 2>&1
echo "fa3-rowend rc=$? at $((SECONDS-t0))s"; grep -E "^\| [0-9]" $w/fa3-rowend/bench.md | head -16; save
python3 -m pip install --quiet --no-deps --no-index --target $w/site python/wheels/flash_attn_rs-*.whl
PYTHONPATH=$w/site timeout $(left 200) python3 python/examples/01_train_tiny_llama.py --quick --out $w/example.md > $w/example.log 2>&1
echo "example rc=$? at $((SECONDS-t0))s"; tail -30 $w/example.log | cut -c1-200; save
