#!/usr/bin/env bash
# Device call 20 (eighth session, 2026-12-01), replacing the seventh session's call20.sh: call 19
# showed that an older module cannot be timed through a newer host binary once the parameter
# block changed in its middle (window-on-main added the window and soft-capping to
# AttentionShape: fa2-tc with main's PTX under window-on-main's binary stopped on a misaligned
# address). So two host binaries: bin/flash-attn-main (main, f27b163) runs main's modules and
# bin/flash-attn (window-on-main) runs its own.
#   prev5  2556f95, FA3 v4;  v5  a119fc3 (= main's Hopper module, byte-identical);
#   s7     window-on-main;   e2, e4, e8  main with FLASH_ATTN_FA3_EXP2_POLYNOMIAL_EVERY=2/4/8
# First correctness: e2/e4/e8 on FA3 (defaults, persistent d = 64), and window-on-main's
# standard f32 kernel with the precise tanh (call 19: three soft-capped f32 cases at 1.1-1.6× their
# bound). Then FA3 timing (PyTorch in the same call), fa2-tc main vs window-on-main, packed vs dense.
# Bundle: window-on-main's `cargo xtask bundle`, keeping bin/flash-attn, test-gpu_attention and
# test-gpu_packed, plus bin/flash-attn-main and the ptx/ variants of scripts/ptx_variants.sh.
set -u
out=$1; w=$(mktemp -d); t0=$SECONDS
save() { tar czf $out/call20.tgz -C $w .; }
cd bundle
for f in ptx/*.gz; do gunzip -kf $f; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $w/gpu.txt
export FLASH_ATTN_REQUIRE_GPU=1
mkdir -p $w/t
for v in e2 e4 e8; do
  ( FLASH_ATTN_HOPPER_PTX=ptx/${v}_hopper.ptx timeout 100 bin/flash-attn-main check --require-gpu --algorithms fa3 --dtypes bf16,f16 > $w/t/check-$v.log 2>&1; echo "check-$v rc=$?" > $w/t/check-$v.rc ) &
  ( FLASH_ATTN_HOPPER_PTX=ptx/${v}_hopper.ptx timeout 100 bin/flash-attn-main check --require-gpu --algorithms fa3 --dtypes bf16,f16 --fa3-tiling w3c128p --head-dims 40,59,64 > $w/t/check-$v-p.log 2>&1; echo "check-$v-p rc=$?" > $w/t/check-$v-p.rc ) &
done
( timeout 100 bin/flash-attn check --require-gpu --algorithms standard --dtypes f32 > $w/t/check-std32.log 2>&1; echo "check-std32 rc=$?" > $w/t/check-std32.rc ) &
wait; cat $w/t/*.rc; tail -qn1 $w/t/check-*.log; grep -h "FAIL$" $w/t/check-*.log | cut -c1-200 | head
grep softcap $w/t/check-std32.log | awk '{for(i=1;i<=NF;i++) if($i ~ /^max_abs/) {split($i,a,"="); split($(i+2),b,"="); print a[2]/b[2]}}' | sort -g | tail -1 | sed 's/^/std f32 softcap worst err\/bound /'
echo "correctness at $((SECONDS-t0))s"; save
shapes="--seqlens 2048,4096,8192 --head-dims 64,128 --causal both"
timeout 80 python3 scripts/torch_sdpa_bench.py --backends torch-flash,torch-cudnn $shapes --out $w/torch.json > $w/torch.log 2>&1
echo "torch rc=$? at $((SECONDS-t0))s"; save
fa3() { # variant binary
  FLASH_ATTN_HOPPER_PTX=ptx/$1_hopper.ptx timeout 45 bin/$2 bench --algorithms fa3 $shapes --no-max-seqlen --torch $w/torch.json --out-dir $w/$1-$round > $w/$1-$round.log 2>&1
  echo "$1-$round rc=$? at $((SECONDS-t0))s: $(grep -E '^\| [0-9]' $w/$1-$round/bench.md 2>/dev/null | grep -v GiB | awk -F'|' '{printf "%s ", $7}')"; save
}
round=1; fa3 prev5 flash-attn-main
for round in 1 2; do
  fa3 v5 flash-attn-main; fa3 s7 flash-attn; fa3 e4 flash-attn-main; fa3 e8 flash-attn-main
done
round=1; fa3 e2 flash-attn-main
grep -E '^\|' $w/v5-1/bench.md | head -16
tc="--seqlens 2048,8192 --head-dims 64,128 --causal both"
for round in 1 2; do
  for v in main s7; do
    bin=flash-attn; [ $v = main ] && bin=flash-attn-main
    FLASH_ATTN_PTX=ptx/${v}_main.ptx timeout 40 bin/$bin bench --algorithms fa2-tc $tc --no-max-seqlen --out-dir $w/fa2tc-$v-$round > $w/fa2tc-$v-$round.log 2>&1
    echo "fa2tc-$v-$round rc=$? at $((SECONDS-t0))s: $(grep -E '^\| [0-9]' $w/fa2tc-$v-$round/bench.md | grep -v GiB | awk -F'|' '{printf "%s ", $7}')"
    save
  done
done
timeout $((575 - (SECONDS - t0))) bin/test-gpu_packed --ignored --nocapture time_packed > $w/packed-timing.log 2>&1
echo "packed timing rc=$? at $((SECONDS-t0))s"; grep "packed / dense" $w/packed-timing.log
echo "done at $((SECONDS-t0))s"; save
