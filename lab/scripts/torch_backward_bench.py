#!/usr/bin/env python3
"""PyTorch's SDPA backward (flash and cuDNN backends) at the benchmark's shapes, as ANCHORS.md
measured it: bf16, batch·seqlen = 16384 tokens, heads·head_dim = 2048, with a random dO. Two
numbers per point, as `flash-attn bench --backward` reports ours: the backward alone
(`torch.autograd.grad` of the output, the graph retained) and forward + backward (the SDPA call
and the gradient), each timed with `triton.testing.do_bench` (median). TFLOP/s = 2.5 × the
forward's FLOPs / backward time and 3.5 × / forward + backward time (4·B·H·N²·d, halved when
causal). Peak memory: one forward + backward from an empty pool (inputs and gradients
included). Prints one line per point and writes, with --out, JSON in `flash-attn bench
--backward --torch`'s schema ({"records": [...]}, one record per backend and shape).

Usage: lab/scripts/torch_backward_bench.py [--quick] [--seqlens 2048,4096] [--head-dims 64,128]
       [--causal off|on|both] [--tokens 16384] [--hidden 2048] [--out F]"""
import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

BACKENDS = {"torch-flash": SDPBackend.FLASH_ATTENTION, "torch-cudnn": SDPBackend.CUDNN_ATTENTION}


def time_backend(backend, q, k, v, d_o, causal, flops):
    """One backend's record fields: ms and TFLOP/s of the backward and of forward + backward, and
    the peak memory of one forward + backward."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with sdpa_kernel(backend):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        o = sdpa(q, k, v, is_causal=causal)
        torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        backward = lambda: torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True)
        backward_ms = do_bench(backward, warmup=25, rep=100, return_mode="median")

        def forward_backward():
            out = sdpa(q, k, v, is_causal=causal)
            return torch.autograd.grad(out, (q, k, v), d_o)

        forward_backward_ms = do_bench(forward_backward, warmup=25, rep=100, return_mode="median")
    return {
        "backward_ms": backward_ms,
        "backward_tflops": 2.5 * flops / (backward_ms * 1e-3) / 1e12,
        "forward_backward_ms": forward_backward_ms,
        "forward_backward_tflops": 3.5 * flops / (forward_backward_ms * 1e-3) / 1e12,
        "peak_memory_bytes": peak,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="N = 2048 and 8192 only")
    parser.add_argument("--seqlens")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--causal", default="both", choices=["off", "on", "both"])
    parser.add_argument("--tokens", type=int, default=16384, help="batch · seqlen")
    parser.add_argument("--hidden", type=int, default=2048, help="heads · head_dim")
    parser.add_argument("--out")
    args = parser.parse_args()
    seqlens = args.seqlens or ("2048,8192" if args.quick else "2048,4096,8192,16384")
    causals = {"off": [False], "on": [True], "both": [False, True]}[args.causal]
    records = []
    for head_dim in map(int, args.head_dims.split(",")):
        for causal in causals:
            for seqlen in map(int, seqlens.split(",")):
                batch, heads = max(args.tokens // seqlen, 1), max(args.hidden // head_dim, 1)
                dims = (batch, heads, seqlen, head_dim)
                shape = {"batch": batch, "heads": heads, "seqlen": seqlen, "head_dim": head_dim,
                         "causal": causal}
                q, k, v = (torch.randn(dims, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                d_o = torch.randn(dims, device="cuda", dtype=torch.bfloat16)
                flops = 4.0 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
                line = f"d = {head_dim}, N = {seqlen}, causal = {causal}:"
                for name, backend in BACKENDS.items():
                    record = {"implementation": name, "dtype": "bf16", "shape": shape,
                              "backward_ms": None, "backward_tflops": None,
                              "forward_backward_ms": None, "forward_backward_tflops": None,
                              "peak_memory_bytes": None, "plan": None, "error": None}
                    try:
                        record.update(time_backend(backend, q, k, v, d_o, causal, flops))
                        line += (f" {name} {record['backward_ms']:.3f} ms "
                                 f"({record['backward_tflops']:.1f} TFLOP/s), fwd+bwd "
                                 f"{record['forward_backward_ms']:.3f} ms "
                                 f"({record['forward_backward_tflops']:.1f} TFLOP/s)")
                    except (RuntimeError, torch.OutOfMemoryError) as e:
                        record["error"] = str(e).splitlines()[0][:200]
                        line += f" {name}: {record['error']}"
                        torch.cuda.empty_cache()
                    records.append(record)
                print(line, flush=True)
                del q, k, v, d_o
                torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
