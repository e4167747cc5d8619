#!/usr/bin/env bash
# fa2-tc against PyTorch's flash backend, interleaved: each round times every shape with ours, then
# with PyTorch (odd rounds) or the other way round (even rounds), while `nvidia-smi dmon` logs SM
# clock, power and temperature once a second. Meant to tell a real gap from the session-to-session
# spread (docs/perf, v5: the same kernel measured 0.96–1.02× in one session, 0.93–0.96× in another)
# and from clock or power throttling under long back-to-back runs.
# Run from the repository root after `cargo xtask bundle`; everything lands in OUT_DIR, and the
# table of ratios per round in OUT_DIR/summary.md.
# Usage: lab/scripts/interleaved_bench.sh OUT_DIR [ROUNDS]   (HEAD_DIMS, SEQLENS, CAUSAL override)
set -euo pipefail
out=${1:?usage: lab/scripts/interleaved_bench.sh OUT_DIR [ROUNDS]}
rounds=${2:-3}
head_dims=${HEAD_DIMS:-128}
seqlens=${SEQLENS:-2048,4096,8192}
causal=${CAUSAL:-both}
mkdir -p "$out"
nvidia-smi dmon -s pcu -d 1 -o T > "$out/dmon.log" 2>&1 &
dmon=$!
trap 'kill $dmon 2>/dev/null || true' EXIT

ours() {
  bundle/bin/flash-attn bench --algorithms fa2-tc --seqlens "$seqlens" --head-dims "$head_dims" \
    --causal "$causal" --no-max-seqlen --out-dir "$out/ours-$1" > "$out/ours-$1.log" 2>&1
  echo "$(date +%T) ours round $1 done" >> "$out/timeline.log"
}
theirs() {
  python3 lab/scripts/torch_sdpa_bench.py --backends torch-flash --seqlens "$seqlens" \
    --head-dims "$head_dims" --causal "$causal" --out "$out/torch-$1.json" > "$out/torch-$1.log" 2>&1
  echo "$(date +%T) torch round $1 done" >> "$out/timeline.log"
}
for round in $(seq 1 "$rounds"); do
  echo "$(date +%T) round $round starts" >> "$out/timeline.log"
  if [ $((round % 2)) -eq 1 ]; then ours "$round"; theirs "$round"; else theirs "$round"; ours "$round"; fi
done

python3 - "$out" "$rounds" <<'EOF' | tee "$out/summary.md"
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def tflops(path, name):
    records = json.load(open(path))["records"]
    return {(r["shape"]["head_dim"], r["shape"]["causal"], r["shape"]["seqlen"]): r["tflops"]
            for r in records if r["implementation"].startswith(name) and r["tflops"]}
print("| d | causal | N | " + " | ".join(f"round {r}: ours / flash = ratio" for r in range(1, rounds + 1)) + " |")
print("|---|---|---|" + "---|" * rounds)
per_round = [(tflops(f"{out}/ours-{r}/bench.json", "fa2-tc"), tflops(f"{out}/torch-{r}.json", "torch-flash"))
             for r in range(1, rounds + 1)]
for key in sorted(per_round[0][0]):
    cells = []
    for ours, theirs in per_round:
        a, b = ours.get(key), theirs.get(key)
        cells.append(f"{a:.1f} / {b:.1f} = {a / b:.3f}" if a and b else "missing")
    d, causal, n = key
    print(f"| {d} | {'yes' if causal else 'no'} | {n} | " + " | ".join(cells) + " |")
EOF
