#!/usr/bin/env python3
"""Train a small Llama with flash_attn_rs as its attention, beside the same weights on PyTorch's
SDPA, with no download: the model is built from a config with random weights, the batch is random
token ids.

1. Agreement (bf16): our logits, loss after one training step and gradients against the same
   model in float64 (PyTorch's math attention), within the project's rule: at most twice the
   error of SDPA's bf16 run of the same weights, plus a small slack.
2. Seed 002's table: one training step (forward, loss, backward, SGD step) with our fastest
   kernel (algorithm=None), PyTorch's flash, cuDNN and math SDPA backends: step time, peak
   memory, tokens per second, and the longest sequence that fits in one step (doubling, up to
   --max-seqlen; "≥ N" where the cap or the --step-budget stopped the search).

Usage: python3 01_train_tiny_llama.py [--quick] [--out results.md]
Exits non-zero when an agreement check fails or a backend errors.
"""

import argparse
import copy
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig, LlamaForCausalLM

import flash_attn_rs
from flash_attn_rs.transformers_attention import register

BACKENDS = {
    "flash_attn_rs": None,
    "torch flash": SDPBackend.FLASH_ATTENTION,
    "torch cuDNN": SDPBackend.CUDNN_ATTENTION,
    "torch math": SDPBackend.MATH,
}


def tiny_llama_config(args):
    return LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.heads * args.head_dim,
        intermediate_size=4 * args.heads * args.head_dim,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        head_dim=args.head_dim,
        max_position_embeddings=max(args.max_seqlen, args.seqlen),
        attention_dropout=0.0,
        tie_word_embeddings=False,
    )


def build_models(args, device, attention):
    """Two copies of one randomly initialised model: ours (bf16, our attention) and SDPA's."""
    torch.manual_seed(args.seed)
    base = LlamaForCausalLM(tiny_llama_config(args)).to(device=device, dtype=torch.bfloat16)
    ours = copy.deepcopy(base)
    ours.set_attn_implementation(attention)
    base.set_attn_implementation("sdpa")
    return ours, base


def random_batch(args, device, batch, seqlen, seed=1):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, args.vocab, (batch, seqlen), generator=g).to(device)


def loss_and_grads(model, ids):
    """One forward and backward: (logits, loss, {name: grad}), the gradients kept."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def sgd_step(model, lr):
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)


def error(a, b):
    return (a.double() - b.double()).abs().max().item()


def relative(a, b):
    """‖a − b‖ / ‖b‖ (Frobenius), in float64."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def agreement(args, device, attention):
    """Logits, loss and gradients of one step, and the loss after it, for ours and SDPA in bf16
    against float64. Returns (lines, all_passed)."""
    ours, sdpa = build_models(args, device, attention)
    exact = copy.deepcopy(sdpa).to(torch.float64)  # SDPA on float64 runs PyTorch's math
    ids = random_batch(args, device, args.batch, args.seqlen)
    runs = {name: loss_and_grads(m, ids) for name, m in
            (("ours", ours), ("sdpa", sdpa), ("exact", exact))}
    lines, passed = [], True

    def check(what, ours_error, sdpa_error, slack):
        nonlocal passed
        bound = 2.0 * sdpa_error + slack
        ok = ours_error <= bound
        passed &= ok
        lines.append(f"| {what} | {ours_error:.3e} | {sdpa_error:.3e} | {bound:.3e} | "
                     f"{'pass' if ok else 'FAIL'} |")

    (lo, l_o, g_o), (ls, l_s, g_s), (le, l_e, g_e) = (runs[n] for n in ("ours", "sdpa", "exact"))
    check("logits (max abs)", error(lo, le), error(ls, le), 1e-2)
    check("loss (abs)", error(l_o, l_e), error(l_s, l_e), 1e-3 * abs(l_e.item()))
    worst = max(g_e, key=lambda n: relative(g_o[n], g_e[n]) / (2 * relative(g_s[n], g_e[n]) + 1e-3))
    for name in (worst, "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"):
        check(f"grad {name} (relative)", relative(g_o[name], g_e[name]),
              relative(g_s[name], g_e[name]), 1e-3)
    missing = set(g_e) - set(g_o)
    if missing:
        passed = False
        lines.append(f"| gradients missing for ours | {sorted(missing)} | | | FAIL |")
    for model, name in ((ours, "ours"), (sdpa, "sdpa"), (exact, "exact")):
        sgd_step(model, args.lr)
    with torch.no_grad():
        after = {name: m(input_ids=ids, labels=ids).loss for name, m in
                 (("ours", ours), ("sdpa", sdpa), ("exact", exact))}
    check("loss after one SGD step (abs)", error(after["ours"], after["exact"]),
          error(after["sdpa"], after["exact"]), 1e-3 * abs(after["exact"].item()))
    header = [
        f"Agreement, bf16, batch {args.batch} × seqlen {args.seqlen}, against float64 "
        f"(loss {l_e.item():.4f}; ours ran `{flash_attn_rs.last_plan()}`, backward "
        f"`{flash_attn_rs.last_backward_plan()}`):",
        "",
        "| quantity | ours vs f64 | SDPA bf16 vs f64 | bound (2× SDPA + slack) | |",
        "|---|---|---|---|---|",
    ]
    return header + lines, passed


def training_step(model, ids, lr):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    sgd_step(model, lr)
    return loss


def backend_context(backend):
    return sdpa_kernel([backend]) if backend is not None else _no_context()


class _no_context:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def time_steps(model, ids, backend, args):
    """Mean milliseconds of a training step (after warm-up) and the peak memory in bytes
    (PyTorch's allocator plus, for ours, the library's own workspace)."""
    with backend_context(backend):
        for _ in range(args.warmup):
            training_step(model, ids, args.lr)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        flash_attn_rs.reset_workspace_peak(torch.cuda.current_device())
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.steps):
            training_step(model, ids, args.lr)
        end.record()
        end.synchronize()
    peak = torch.cuda.max_memory_allocated()
    if backend is None:
        peak += flash_attn_rs.workspace_peak_bytes(torch.cuda.current_device())
    return start.elapsed_time(end) / args.steps, peak


def fits(model, backend, args, seqlen):
    """(fits, seconds): one training step at batch 1 × seqlen, or out of memory."""
    ids = random_batch(args, "cuda", 1, seqlen, seed=seqlen)
    started = time.perf_counter()
    try:
        with backend_context(backend):
            training_step(model, ids, 0.0)
            torch.cuda.synchronize()
        return True, time.perf_counter() - started
    except torch.OutOfMemoryError:
        return False, time.perf_counter() - started
    finally:
        model.zero_grad(set_to_none=True)
        del ids
        torch.cuda.empty_cache()


def longest_fit(model, backend, args):
    """The longest power-of-two sequence (from --seqlen) one step fits; "≥" when stopped by the
    cap or the time budget."""
    seqlen, best = args.seqlen, None
    while seqlen <= args.max_seqlen:
        ok, seconds = fits(model, backend, args, seqlen)
        if not ok:
            return str(best) if best else f"< {seqlen}"
        best = seqlen
        if seconds > args.step_budget:
            return f"≥ {best} (a step took {seconds:.0f} s)"
        seqlen *= 2
    return f"≥ {best} (cap)"


def table(args, attention):
    _, base = build_models(args, "cuda", attention)
    ids = random_batch(args, "cuda", args.batch, args.seqlen)
    tokens = args.batch * args.seqlen
    rows, ok = [], True
    for name, backend in BACKENDS.items():
        model = copy.deepcopy(base)
        model.set_attn_implementation(attention if backend is None else "sdpa")
        try:
            ms, peak = time_steps(model, ids, backend, args)
            longest = longest_fit(model, backend, args)
            rows.append(f"| {name} | {ms:.2f} | {peak / 2**30:.2f} | {tokens / ms * 1e3:,.0f} | "
                        f"{longest} |")
        except (RuntimeError, torch.OutOfMemoryError) as e:  # e.g. a backend that cannot run
            ok = False
            rows.append(f"| {name} | error: {str(e).splitlines()[0][:120]} | | | |")
        print(rows[-1], flush=True)
        del model
        torch.cuda.empty_cache()
    header = [
        f"Training step (forward, loss, backward, SGD), bf16 Llama: {args.layers} layers, "
        f"{args.heads} heads × d {args.head_dim}, vocab {args.vocab}, batch {args.batch} × "
        f"seqlen {args.seqlen} ({tokens} tokens), causal; mean of {args.steps} steps after "
        f"{args.warmup}. Longest sequence: batch 1, doubling from {args.seqlen} to "
        f"{args.max_seqlen}.",
        "",
        "| attention | step (ms) | peak memory (GiB) | tokens/s | longest sequence in one step |",
        "|---|---|---|---|---|",
    ]
    return header + rows, ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller table, shorter search")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--max-seqlen", type=int, default=65536)
    parser.add_argument("--step-budget", type=float, default=20.0,
                        help="stop the longest-sequence search after a step this long (s)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-table", action="store_true")
    parser.add_argument("--out", help="also write the tables (markdown) here")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_seqlen, args.steps, args.step_budget = min(args.max_seqlen, 16384), 3, 5.0
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA GPU (torch.cuda.is_available() is False)")
    attention = register()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)

    started = time.perf_counter()
    agree_args = copy.copy(args)
    agree_args.batch, agree_args.seqlen = 2, min(args.seqlen, 512)
    lines, passed = agreement(agree_args, "cuda", attention)
    print("\n".join(lines), flush=True)
    output = lines + [""]
    ok = passed
    if not args.skip_table:
        rows, table_ok = table(args, attention)
        print("\n".join(rows[:4]))  # the rows printed as they came
        output += rows
        ok &= table_ok
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(output) + "\n")
    print(f"agreement: {'pass' if passed else 'FAIL'}; "
          f"table: {'skipped' if args.skip_table else 'done'}; "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
