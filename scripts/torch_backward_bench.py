#!/usr/bin/env python3
"""PyTorch's SDPA backward (flash and cuDNN backends) at the benchmark's shapes, as ANCHORS.md
measured it: bf16, batch·seqlen = 16384 tokens, heads·head_dim = 2048, `torch.autograd.grad` of
the output with a random dO, timed with `triton.testing.do_bench` (median). TFLOP/s = 2.5 × the
forward's FLOPs / backward time (4·B·H·N²·d, halved when causal). Prints one line per point, in
the form `tests/gpu_backward.rs`'s timing test prints ours, and writes JSON with --out.

Usage: scripts/torch_backward_bench.py [--seqlens 2048,4096] [--head-dims 64,128] [--out F]"""
import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

BACKENDS = {"torch-flash": SDPBackend.FLASH_ATTENTION, "torch-cudnn": SDPBackend.CUDNN_ATTENTION}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlens", default="2048,4096,8192,16384")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--out")
    args = parser.parse_args()
    records = []
    for head_dim in map(int, args.head_dims.split(",")):
        for seqlen in map(int, args.seqlens.split(",")):
            for causal in (False, True):
                batch, heads = 16384 // seqlen, 2048 // head_dim
                shape = (batch, heads, seqlen, head_dim)
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                d_o = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
                flops = 4.0 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
                line = f"d = {head_dim}, N = {seqlen}, causal = {causal}:"
                for name, backend in BACKENDS.items():
                    with sdpa_kernel(backend):
                        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        grad = lambda: torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True)
                        ms = do_bench(grad, warmup=25, rep=100)
                    tflops = 2.5 * flops / (ms * 1e-3) / 1e12
                    line += f" {name} {ms:.3f} ms ({tflops:.1f} TFLOP/s)"
                    records.append({"backend": name, "head_dim": head_dim, "seqlen": seqlen,
                                    "causal": causal, "ms": ms, "tflops": tflops})
                print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
