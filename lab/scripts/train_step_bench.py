#!/usr/bin/env python3
"""A training step of a Llama-like model per attention backend: ours, PyTorch's flash, cuDNN.

The model: transformers' LlamaForCausalLM built from a LlamaConfig with random weights (no
download): hidden 2048, 16 heads of 128 (--kv-heads K/V heads, default 16), intermediate 5632,
--layers 4 decoder layers, vocabulary 32000, bf16 weights, AdamW. Each step: --tokens (65536)
random token ids as batch × N with batch = tokens / N, at N = 4k, 16k and 64k (--seqlens); the
loss against the same ids, backward, optimizer step.

Backends (--backends), one model and one optimizer, switched between steps with
model.set_attn_implementation:
  ours    flash_attn_rs.transformers_attention.register(): the model's attention on
          flash_attn_func (the default algorithm: fa3 on Hopper)
  flash   attn_implementation "sdpa" inside sdpa_kernel(SDPBackend.FLASH_ATTENTION)
  cudnn   the same inside sdpa_kernel(SDPBackend.CUDNN_ATTENTION)

Timing, one timer for all: per N, --warmup steps per backend, then --rounds rounds, each running
--steps steps per backend in turn (ours, flash, cudnn, ours, ...), every step timed alone by CUDA
events after a synchronization (so it includes the host's launch latency, as training does); a
backend's step time is the median of its timed steps. Peak memory: torch.cuda.max_memory_allocated
over its timed steps (weights, optimizer state, activations, logits), plus for ours
flash_attn_rs.workspace_peak_bytes (the library's own workspace, which PyTorch's allocator does
not see). Tokens per second = tokens / step time.

A sanity check first, at the first N: the loss of one forward on the same weights with each
backend; they must agree within 1% (random weights: a loss near ln(32000)), or the run fails.
The kernels' own correctness is python/tests' and bench_vs_torch.py's job.

--longest: per backend, the longest sequence one step fits at batch 1, N doubling from
--longest-from (65536) to --longest-max (262144) until out of memory ("≥ N" at the cap). At these
lengths the logits (N × 32000, and their float32 copy in the loss) take much of the memory, so
the backends may all stop at the same N.

    python3 lab/scripts/train_step_bench.py --out train-step.json --markdown train-step.md
    [--quick] [--longest]

Expected, not yet measured: about 1-2 minutes on an H200 at the defaults (18 steps per N, the
longest about a second at N = 64k); --quick (N = 4k and 16k, 32k tokens, 2 rounds) well under
one. Exit status 1 when a backend errors (other than out of memory) or the losses
disagree.
"""

import argparse
import json
import statistics
import sys
import time

try:  # The pure parts (batch sizes, the table) import without PyTorch: the CPU tests.
    import torch
except ImportError:
    torch = None

BACKENDS = ("ours", "flash", "cudnn")
LABELS = {"ours": "flash_attn_rs", "flash": "SDPA flash", "cudnn": "SDPA cuDNN"}
SEQLENS = (4096, 16384, 65536)
QUICK = {"seqlens": (4096, 16384), "tokens": 32768, "rounds": 2}
#: The losses of the sanity check must agree within this, relative to ours.
LOSS_AGREEMENT = 0.01


# -- pure Python ---------------------------------------------------------------------------


def batch_for(tokens, seqlen):
    """batch = tokens / N, at least 1."""
    return max(1, tokens // seqlen)


def seqlen_label(n):
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _ok(record):
    return record is not None and not record.get("error") and record.get("step_ms")


def markdown(records, environment=None, longest=None):
    """The training table: a row per (N, backend): step time, tokens per second, peak memory,
    and the step time against ours (> 1: ours is faster); then the longest sequences."""
    env = environment or {}
    out = [
        "# A training step per attention backend",
        "",
        f"{env.get('gpu', '?')}; torch {env.get('torch', '?')}, transformers "
        f"{env.get('transformers', '?')}, flash_attn_rs {env.get('flash_attn_rs', '?')}; "
        f"{env.get('date', '?')}.",
        "",
        f"Llama-like, bf16, AdamW: {env.get('model', '?')}. {env.get('tokens', '?')} tokens per "
        "step (batch × N). Step: forward, loss, backward, optimizer step, each timed alone by CUDA "
        f"events; median of {env.get('timed_steps', '?')} steps per backend, backends alternated. "
        "Peak memory: PyTorch's allocator plus, for ours, the library's workspace.",
        "",
        "| N | batch | attention | step (ms) | tokens/s | peak memory (GiB) | step / ours' step |",
        "|---|---|---|---|---|---|---|",
    ]
    ours = {r["seqlen"]: r for r in records if r["backend"] == "ours"}
    for r in records:
        row = [seqlen_label(r["seqlen"]), str(r["batch"]), LABELS.get(r["backend"], r["backend"])]
        if not _ok(r):
            row += [f"error: {r.get('error')}", "", "", ""]
        else:
            mine = ours.get(r["seqlen"])
            ratio = f"{r['step_ms'] / mine['step_ms']:.2f}" if _ok(mine) else "—"
            row += [f"{r['step_ms']:.1f}", f"{r['tokens_per_s']:,.0f}",
                    f"{r['peak_bytes'] / 2**30:.1f}" if r.get("peak_bytes") is not None else "—",
                    ratio]
        out.append("| " + " | ".join(row) + " |")
    if longest:
        out += ["", "Longest sequence one step fits, batch 1 (N doubling until out of memory):",
                "", "| attention | longest N |", "|---|---|"]
        out += [f"| {LABELS.get(name, name)} | {text} |" for name, text in longest.items()]
    return "\n".join(out) + "\n"


# -- on the GPU ----------------------------------------------------------------------------


def _short(error, limit=200):
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:limit]


def _is_oom(error):
    return isinstance(error, torch.OutOfMemoryError)


class Backend:
    """An attention backend: the model's attn_implementation and, for SDPA, the backend forced
    inside sdpa_kernel."""

    def __init__(self, name, implementation, sdpa_backend=None):
        self.name, self.implementation, self.sdpa_backend = name, implementation, sdpa_backend

    def use(self, model):
        model.set_attn_implementation(self.implementation)

    def context(self):
        import contextlib

        if self.sdpa_backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel(self.sdpa_backend)


def backends(names, ours_name):
    from torch.nn.attention import SDPBackend

    known = {"ours": Backend("ours", ours_name),
             "flash": Backend("flash", "sdpa", SDPBackend.FLASH_ATTENTION),
             "cudnn": Backend("cudnn", "sdpa", SDPBackend.CUDNN_ATTENTION)}
    return [known[n] for n in names]


def llama(args, device):
    """LlamaForCausalLM with random weights, bf16, on the device."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.heads * args.head_dim,
        intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=max([*args.seqlens, args.longest_max if args.longest else 0]),
        attention_dropout=0.0, tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype=torch.bfloat16).train()


def training_step(model, optimizer, ids):
    optimizer.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    optimizer.step()
    return loss


class Device:
    """The timer and memory counters: CUDA events and PyTorch's allocator on a GPU; wall clock
    and no memory figures on the CPU (the smoke test)."""

    def __init__(self, device, workspace=None):
        self.device, self.cuda = device, str(device).startswith("cuda")
        self.workspace = workspace  # (reset, peak) of flash_attn_rs's workspace

    def time_ms(self, fn):
        if not self.cuda:
            started = time.perf_counter()
            fn()
            return (time.perf_counter() - started) * 1e3
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def reset_peak(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        if self.workspace:
            self.workspace[0]()

    def peak(self, with_workspace):
        if not self.cuda:
            return None
        peak = torch.cuda.max_memory_allocated()
        if with_workspace and self.workspace:
            peak += self.workspace[1]()
        return peak

    def free(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def random_ids(vocab, batch, seqlen, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, vocab, (batch, seqlen), generator=g).to(device)


def agreement(model, chosen, ids):
    """The loss of one forward per backend on the same weights; (lines, passed)."""
    losses = {}
    for b in chosen:
        b.use(model)
        try:
            with b.context(), torch.no_grad():
                losses[b.name] = model(input_ids=ids, labels=ids, use_cache=False).loss.item()
        except Exception as e:  # noqa: BLE001 - reported, and the timing says it again
            losses[b.name] = _short(e)
    base = losses.get("ours")
    passed = True
    parts = []
    for name, loss in losses.items():
        if isinstance(loss, str):
            parts.append(f"{name} {loss}")
            continue
        ok = loss == loss and abs(loss) != float("inf")
        if isinstance(base, float) and name != "ours":
            ok &= abs(loss - base) <= LOSS_AGREEMENT * abs(base)
        passed &= ok
        parts.append(f"{name} {loss:.4f}" + ("" if ok else " (DISAGREES)"))
    return "loss of one forward, same weights: " + ", ".join(parts), passed, losses


def measure(model, optimizer, chosen, seqlen, args, dev, plans=None, log=print):
    """One N: warm-up, then the rounds alternating backends. Returns a record per backend;
    plans() gives ours' (forward, backward) plans."""
    batch = batch_for(args.tokens, seqlen)
    ids = random_ids(args.vocab, batch, seqlen, dev.device, seed=seqlen)
    records = {b.name: {"backend": b.name, "seqlen": seqlen, "batch": batch,
                        "tokens": batch * seqlen, "step_ms": None, "steps_ms": [],
                        "tokens_per_s": None, "peak_bytes": None, "error": None, "plan": None,
                        "backward_plan": None} for b in chosen}

    def steps(b, count, timed):
        r = records[b.name]
        if r["error"]:
            return
        b.use(model)
        try:
            if timed:
                dev.reset_peak()
            with b.context():
                for _ in range(count):
                    ms = dev.time_ms(lambda: training_step(model, optimizer, ids))
                    if timed:
                        r["steps_ms"].append(ms)
            if timed:
                peak = dev.peak(b.name == "ours")
                if peak is not None:
                    r["peak_bytes"] = max(peak, r["peak_bytes"] or 0)
        except Exception as e:  # noqa: BLE001 - recorded; the sweep goes on
            r["error"], r["steps_ms"] = _short(e), []
            optimizer.zero_grad(set_to_none=True)
            dev.free()

    for b in chosen:
        steps(b, args.warmup, timed=False)
    for _ in range(args.rounds):
        for b in chosen:
            steps(b, args.steps, timed=True)
    for b in chosen:
        r = records[b.name]
        if r["steps_ms"] and not r["error"]:
            r["step_ms"] = statistics.median(r["steps_ms"])
            r["tokens_per_s"] = r["tokens"] / (r["step_ms"] * 1e-3)
        if b.name == "ours" and plans is not None:
            r["plan"], r["backward_plan"] = plans()
    parts = []
    for b in chosen:
        r = records[b.name]
        parts.append(f"{b.name} error: {r['error']}" if not _ok(r) else
                     f"{b.name} {r['step_ms']:.1f} ms, {r['tokens_per_s']:,.0f} tok/s"
                     + (f", {r['peak_bytes'] / 2**30:.1f} GiB" if r["peak_bytes"] else ""))
    log(f"N {seqlen_label(seqlen)} × batch {batch}: " + " | ".join(parts))
    ids = None
    dev.free()
    return [records[b.name] for b in chosen]


def longest_fit(model, optimizer, backend, args, dev):
    """The longest power-of-two N one step fits at batch 1: "N", "≥ N (cap)", "< N", or the
    error that stopped it."""
    n, best = args.longest_from, None
    backend.use(model)
    while n <= args.longest_max:
        ids = random_ids(args.vocab, 1, n, dev.device, seed=n)
        try:
            with backend.context():
                seconds = dev.time_ms(lambda: training_step(model, optimizer, ids)) / 1e3
        except torch.OutOfMemoryError:
            return str(best) if best else f"< {n}"
        except Exception as e:  # noqa: BLE001 - a backend that cannot run: said in the table
            return f"error at {n}: {_short(e)}"
        finally:
            optimizer.zero_grad(set_to_none=True)
            del ids
            dev.free()
        best = n
        if seconds > args.longest_budget:
            return f"≥ {best} (a step took {seconds:.0f} s)"
        n *= 2
    return f"≥ {best} (cap)"


def environment(args, model):
    import transformers

    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
           "transformers": transformers.__version__, "argv": sys.argv[1:],
           "tokens": args.tokens, "timed_steps": args.rounds * args.steps,
           "model": f"{args.layers} layers, hidden {args.heads * args.head_dim}, {args.heads} "
                    f"heads × d {args.head_dim} ({args.kv_heads} K/V heads), intermediate "
                    f"{args.intermediate}, vocabulary {args.vocab}, "
                    f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters"}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    try:
        from importlib.metadata import version

        env["flash_attn_rs"] = version("flash-attn-rs")
    except Exception:  # noqa: BLE001 - a version is nice to have
        env["flash_attn_rs"] = None
    return env


def _ints(text):
    return tuple(int(v) for v in text.split(",") if v.strip())


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N = 4k and 16k, 32k tokens, 2 rounds")
    p.add_argument("--seqlens", type=_ints, help="default 4096,16384,65536")
    p.add_argument("--tokens", type=int, help="tokens per step, batch × N (default 65536)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="comma-separated, alternated in this order (default ours,flash,cudnn)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per backend and N")
    p.add_argument("--rounds", type=int, help="rounds of alternation (default 5)")
    p.add_argument("--steps", type=int, default=1, help="timed steps per backend per round")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--longest", action="store_true",
                   help="also the longest N one step fits at batch 1, per backend")
    p.add_argument("--longest-from", type=int, default=65536)
    p.add_argument("--longest-max", type=int, default=262144)
    p.add_argument("--longest-budget", type=float, default=60.0,
                   help="stop the search after a step this long (s)")
    p.add_argument("--out", help="JSON: the records and the environment")
    p.add_argument("--markdown", help="the table (markdown)")
    return p


def resolve(args):
    """--quick's and the defaults' values where not given."""
    quick = QUICK if args.quick else {}
    args.seqlens = args.seqlens or quick.get("seqlens", SEQLENS)
    args.tokens = args.tokens or quick.get("tokens", 65536)
    args.rounds = args.rounds or quick.get("rounds", 5)
    args.backends = tuple(b for b in args.backends.split(",") if b)
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        raise SystemExit(f"--backends: unknown {sorted(unknown)}; allowed: {', '.join(BACKENDS)}")
    return args


def run(args, device, ours_name, dev, plans=None, write=None, log=print):
    """Builds the model, checks the losses agree, measures every N (and the longest fit),
    calling write(records, longest, environment) after each N. Returns (records, longest,
    environment, passed)."""
    model = llama(args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    chosen = backends(args.backends, ours_name)
    env = environment(args, model)
    log(f"{env.get('gpu', device)}, torch {env['torch']}, transformers {env['transformers']}; "
        f"{env['model']}")
    first = args.seqlens[0]
    line, passed, losses = agreement(
        model, chosen, random_ids(args.vocab, batch_for(args.tokens, first), first, device, 7))
    env["agreement"] = losses
    log(line)
    records = []
    for n in args.seqlens:
        records += measure(model, optimizer, chosen, n, args, dev, plans, log)
        if write is not None:
            write(records, None, env)
    longest = None
    if args.longest:
        longest = {}
        for b in chosen:
            longest[b.name] = longest_fit(model, optimizer, b, args, dev)
            log(f"longest at batch 1: {b.name} {longest[b.name]}")
    passed &= not any(r["error"] and not r["error"].startswith("OutOfMemoryError")
                      for r in records)
    return records, longest, env, passed


def main(argv=None):
    args = resolve(parser().parse_args(argv))
    if torch is None:
        sys.exit("train_step_bench.py needs PyTorch, transformers and the flash_attn_rs wheel")
    if not torch.cuda.is_available():
        sys.exit("train_step_bench.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    import flash_attn_rs
    from flash_attn_rs.transformers_attention import register

    device = torch.cuda.current_device()
    dev = Device("cuda", (lambda: flash_attn_rs.reset_workspace_peak(device),
                          lambda: flash_attn_rs.workspace_peak_bytes(device)))
    def write(records, longest, env):
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"environment": env, "records": records, "longest": longest}, f,
                          indent=1)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(markdown(records, env, longest))

    started = time.perf_counter()
    records, longest, env, passed = run(
        args, "cuda", register(), dev,
        plans=lambda: (flash_attn_rs.last_plan(), flash_attn_rs.last_backward_plan()),
        write=write, log=lambda line: print(line, flush=True))
    write(records, longest, env)
    print(markdown(records, env, longest), flush=True)
    print(f"{'done' if passed else 'FAILED'} in {time.perf_counter() - started:.0f} s",
          flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
