#!/usr/bin/env python3
"""The Python bridge's cost per call on the host, against PyTorch's SDPA backends: shapes small
enough that the GPU finishes each call before the host has issued the next, so the time per
call is what the host spends issuing it (checks, plan, workspace, launches, autograd).

For each attention: the forward alone (no grad), and forward + backward (q, k, v requiring grad,
``o.sum().backward()``), N calls back to back, then one synchronize; microseconds per call, the
median of 3 such runs. Then ``cProfile`` of our forward + backward, the functions by own time, so
the native half's share shows.

    PYTHONPATH=<site with flash_attn_rs> python3 lab/scripts/bridge_overhead.py [--calls 200]
"""
import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attn_rs


def per_call_us(step, calls, runs=3):
    """Median over `runs` of (wall time of `calls` steps and one synchronize) / calls, in µs."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--shape", default="1,128,8,64", help="batch,seqlen,heads,head_dim")
    args = parser.parse_args()
    batch, seqlen, heads, head_dim = (int(x) for x in args.shape.split(","))
    torch.manual_seed(0)

    def tensors(grad):
        # SDPA's layout for both (ours through scaled_dot_product_attention).
        return [torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                            requires_grad=grad) for _ in range(3)]

    backends = {
        "flash_attn_rs": None,
        "torch flash": SDPBackend.FLASH_ATTENTION,
        "torch cuDNN": SDPBackend.CUDNN_ATTENTION,
    }
    print(f"bf16, causal, (batch, seqlen, heads, d) = {args.shape}, {args.calls} calls per run")
    print("| attention | forward (µs per call) | forward + backward (µs per call) |")
    print("|---|---|---|")
    for name, backend in backends.items():
        def attend(q, k, v):
            if backend is None:
                return flash_attn_rs.scaled_dot_product_attention(q, k, v, is_causal=True)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        q, k, v = tensors(False)

        def forward():
            with torch.no_grad():
                attend(q, k, v)

        gq, gk, gv = tensors(True)

        def forward_backward():
            attend(gq, gk, gv).sum().backward()

        fwd = per_call_us(forward, args.calls)
        both = per_call_us(forward_backward, args.calls)
        print(f"| {name} | {fwd:.1f} | {both:.1f} |")
    print(f"our plans: {flash_attn_rs.last_plan()} / {flash_attn_rs.last_backward_plan()}")

    q, k, v = tensors(True)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.calls):
        flash_attn_rs.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    torch.cuda.synchronize()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(14)
    print(f"cProfile of {args.calls} forward + backward calls of ours, by own time:")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:4000])


if __name__ == "__main__":
    main()
