#!/usr/bin/env python3
"""Times PyTorch's SDPA backends on decoding (one query token against a KV cache) at ANCHORS.md's
shapes, as ANCHORS.md measured them: bf16, d = 128, 32 query heads sharing 8 KV heads through
`enable_gqa=True`, q (batch, 32, 1, 128) and K, V (batch, 8, kv_len, 128) in SDPA's layout,
median of triton.testing.do_bench (which clears L2 between repetitions). Writes JSON in the schema
of `flash-attn bench --decode` (lab/src/tools/bench/decode.rs: DecodeRecord).

Backends: flash (FlashAttention-2), cudnn, math (refused above 1 GB of cache: it repeats K/V per
query head). The memory-efficient backend refuses GQA.

    python3 lab/scripts/torch_decode_bench.py --out torch-decode.json [--quick]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton.testing

BACKENDS = {
    "torch-flash": SDPBackend.FLASH_ATTENTION,
    "torch-cudnn": SDPBackend.CUDNN_ATTENTION,
    "torch-math": SDPBackend.MATH,
}
FULL = [(4096, 1), (4096, 16), (4096, 64), (32768, 1), (32768, 16), (32768, 64), (131072, 1), (131072, 16)]
QUICK = [(4096, 1), (32768, 16), (131072, 1)]
MATH_MAX_BYTES = 1 << 30


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    args = parser.parse_args()
    heads_q, heads_kv, d, dtype = 32, 8, 128, torch.bfloat16
    records = []
    for kv_len, batch in (QUICK if args.quick else FULL):
        shape = {"kv_len": kv_len, "batch": batch, "heads_q": heads_q, "heads_kv": heads_kv,
                 "head_dim": d, "q_tokens": 1}
        kv_bytes = 2 * batch * kv_len * heads_kv * d * 2
        q = torch.randn(batch, heads_q, 1, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(batch, heads_kv, kv_len, d, device="cuda", dtype=dtype) for _ in range(2))
        for name in args.backends.split(","):
            record = {"implementation": name, "dtype": "bf16", "shape": shape, "median_us": None,
                      "kv_gbs": None, "plan": None, "error": None}
            if BACKENDS[name] == SDPBackend.MATH and kv_bytes > MATH_MAX_BYTES:
                record["error"] = "skipped: math backend above 1 GB of cache"
                records.append(record)
                continue
            try:
                with sdpa_kernel(BACKENDS[name]):
                    call = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    call()
                    torch.cuda.synchronize()
                    ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
                record.update(median_us=ms * 1e3, kv_gbs=kv_bytes / (ms * 1e-3) / 1e9)
            except (RuntimeError, torch.OutOfMemoryError) as e:
                record["error"] = str(e).splitlines()[0][:200]
                torch.cuda.empty_cache()
            records.append(record)
            print(f"{name:12} kv_len={kv_len:<6} batch={batch:<3} "
                  + (f"{record['median_us']:.1f} us, {record['kv_gbs']:.0f} GB/s" if record["kv_gbs"] else record["error"]),
                  file=sys.stderr, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
