#!/usr/bin/env python3
"""Ours against PyTorch's SDPA in one process, with one timer: the comparison the README cites.

Implementations (--implementations picks a subset):
  ours    flash_attn_rs.flash_attn_func, algorithm None ("auto": fa3 on Hopper) or --algorithm,
          from the installed wheel
  cudnn   torch.nn.functional.scaled_dot_product_attention under
          torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
  flash   the same under SDPBackend.FLASH_ATTENTION (PyTorch's FlashAttention-2)

All read the same tensors: per point, Q, K, V and dO are allocated once, in flash-attn's layout
(batch, seqlen, heads, head_dim), with torch.randn; SDPA is given their .transpose(1, 2) views
(batch, heads, seqlen, head_dim), as transformers passes them: the same memory, no copy. Grouped
heads go to SDPA with enable_gqa=True; a backend that refuses it (found at the correctness check)
gets K and V expanded with repeat_interleave outside the timed region, and its records and table
cells carry a note saying so.

Passes (--passes):
  forward           the call, under torch.no_grad()
  backward          the backward alone: the forward once with gradients, then
                    torch.autograd.grad(o, (q, k, v), dO, retain_graph=True) timed
  forward_backward  the call and torch.autograd.grad, timed together

One timer: triton.testing.do_bench(fn, warmup, rep, grad_to_none, return_mode="median"), which
clears the L2 cache before each repetition, for every implementation. Alternation: per point and
pass, --rounds rounds, each timing every implementation in turn (ours, cudnn, flash, ours, cudnn,
flash, ...); an implementation's time is the median of its rounds' medians. The ratio against
another implementation is its time over ours (t_other / t_ours): above 1, ours is faster.

FLOPs: the forward counts 4·B·H·N²·d (H the query heads), halved when causal: the FlashAttention
papers' count (the exact causal count is 2·B·H·d·N(N+1), 0.2% more at N = 512); the backward 2.5×
the forward's (five matrix products against two), forward + backward 3.5×.

Correctness, before timing each point: every implementation's output (and, when a backward pass
is asked for, its dQ, dK, dV) against a float32 reference computed with an explicit softmax on a
slice (batch 0; the first two heads, or with grouped heads the first K/V head and its query
heads), bound: max |x - ref| <= TOLERANCE[dtype] × max |ref| per tensor; also against ours on the
whole tensors (printed, not a bound). An implementation that fails the check or raises is
recorded with the error and not timed at that point; the sweep goes on. Out of memory too.

The sweep (the default; the one the README's tables show): dtypes bf16 and f16; head dims 64,
96, 128, 192, 256; causal off and on; N = 512, 1k, 2k, 4k, 8k, 16k with B·N = --tokens (16384)
tokens and H = round(--hidden / d) heads (--hidden 2048: H·d = 2048 as in the FlashAttention
papers, 21 heads at d = 96 and 11 at d = 192); then grouped heads: 32 query heads on 8 K/V heads
at d = 128, causal off and on, the same N and tokens. --quick: bf16, d 64 and 128, N 512, 2k, 8k,
causal both, and one grouped point (causal, N = 2k). Expected, not yet measured: the default
sweep is 144 points × 3 passes × 3 implementations × 3 rounds = 3,888 do_bench calls of about
60-80 ms each (--warmup 10 and --rep 50 ms, plus the L2 clearing), about 5-7 minutes on an H200;
--quick under a minute. --dtypes, --passes and the other options split it.

Output: a line per point and pass as it goes; --out FILE.json (every record, the environment, the
plans flash_attn_rs ran: last_plan() and last_backward_plan() per point) and --markdown FILE.md
(one table per dtype and pass, cells "ours / other TFLOP/s (ratio)", a grouped-heads table, and a
summary per pass: the ratio's min, median and max and how many points reach 1.05×), against cuDNN
then PyTorch's flash. Both are rewritten after every point, so a run cut short keeps what it
measured. Exit status 1 when ours fails a correctness check or raises anything but out-of-memory.

    python3 lab/scripts/bench_vs_torch.py --out vs-torch.json --markdown vs-torch.md [--quick]

The pure parts (the sweep, FLOPs, ratios, the markdown) import without PyTorch: the CPU tests
(python/tests/test_bench_scripts_cpu.py) check them.
"""

import argparse
import contextlib
import json
import math
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections import namedtuple

try:  # Only the timing needs PyTorch; the sweep, FLOPs and tables import without it.
    import torch
except ImportError:
    torch = None

DTYPES = ("bf16", "f16")
HEAD_DIMS = (64, 96, 128, 192, 256)
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
CAUSALS = {"off": (False,), "on": (True,), "both": (False, True)}
PASSES = ("forward", "backward", "forward_backward")
IMPLEMENTATIONS = ("ours", "cudnn", "flash")
#: Each pass's FLOPs as a multiple of the forward's.
PASS_FLOPS = {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}
#: Grouped heads: 32 query heads on 8 K/V heads at d = 128.
GQA_HEADS, GQA_KV_HEADS, GQA_HEAD_DIM = 32, 8, 128
QUICK = {"dtypes": ("bf16",), "head_dims": (64, 128), "seqlens": (512, 2048, 8192),
         "gqa_seqlens": (2048,), "gqa_causals": (True,)}
#: The correctness bound: max |x - ref| <= TOLERANCE × max |ref|, per tensor. Loose: it catches a
#: wrong mask, head or scale (errors of order 1), not the last bits of the rounding.
TOLERANCE = {"bf16": 0.05, "f16": 0.02}
#: The ratio the summary counts points at or above.
AHEAD = 1.05
LABELS = {"ours": "ours", "cudnn": "cuDNN", "flash": "PyTorch flash"}

#: One shape of the sweep. kind: "dense" (H = round(hidden / d), K/V heads = H) or "gqa".
Point = namedtuple("Point", "kind dtype head_dim causal seqlen batch heads kv_heads")


# -- the sweep, FLOPs, ratios and tables: pure Python ----------------------------------------


def heads_for(hidden, head_dim):
    """H = round(hidden / d), at least 1: 32 at d = 64, 21 at 96, 16 at 128, 11 at 192, 8 at 256."""
    return max(1, int(hidden / head_dim + 0.5))


def batch_for(tokens, seqlen):
    """B = tokens / N, at least 1."""
    return max(1, tokens // seqlen)


def sweep(dtypes=DTYPES, head_dims=HEAD_DIMS, causals=(False, True), seqlens=SEQLENS,
          tokens=16384, hidden=2048, gqa_causals=(False, True), gqa_seqlens=SEQLENS):
    """The points, in the order they run: per dtype, the dense points (d, causal, N), then the
    grouped-heads points (causal, N). Empty gqa_* lists leave the grouped points out."""
    points = []
    for dtype in dtypes:
        for d in head_dims:
            heads = heads_for(hidden, d)
            for causal in causals:
                for n in seqlens:
                    points.append(Point("dense", dtype, d, causal, n, batch_for(tokens, n),
                                        heads, heads))
        for causal in gqa_causals:
            for n in gqa_seqlens:
                points.append(Point("gqa", dtype, GQA_HEAD_DIM, causal, n, batch_for(tokens, n),
                                    GQA_HEADS, GQA_KV_HEADS))
    return points


def forward_flops(batch, heads, seqlen, head_dim, causal):
    """4·B·H·N²·d, halved when causal (the FlashAttention papers' count)."""
    return 4.0 * batch * heads * seqlen * seqlen * head_dim / (2.0 if causal else 1.0)


def flops(point, pass_name):
    """The FLOPs of one pass at a point: the forward's × 1, 2.5 (backward) or 3.5 (both)."""
    return PASS_FLOPS[pass_name] * forward_flops(point.batch, point.heads, point.seqlen,
                                                 point.head_dim, point.causal)


def tflops(point, pass_name, ms):
    return flops(point, pass_name) / (ms * 1e-3) / 1e12


def speedup(other_ms, ours_ms):
    """t_other / t_ours: above 1, ours is faster."""
    return other_ms / ours_ms


def summarize(ratios):
    """min, median, max of a list of ratios and how many reach AHEAD; None for an empty list."""
    if not ratios:
        return None
    return {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios),
            "points": len(ratios), "ahead": sum(r >= AHEAD for r in ratios)}


def seqlen_label(n):
    """512, 1k, 2k, ..., 16k."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def point_label(record):
    causal = "causal" if record["causal"] else "non-causal"
    heads = (f"H {record['heads']}" if record["heads"] == record["kv_heads"]
             else f"H {record['heads']}/{record['kv_heads']}")
    return (f"{record['dtype']} d {record['head_dim']} {causal} N {seqlen_label(record['seqlen'])}"
            f" ({heads})")


def _ok(record):
    return record is not None and not record.get("error") and record.get("ms")


def _key(record):
    return (record["kind"], record["dtype"], record["head_dim"], record["causal"],
            record["seqlen"], record["heads"], record["kv_heads"], record["pass"])


def index(records):
    """{(point key, pass): {implementation: record}}."""
    found = {}
    for record in records:
        found.setdefault(_key(record), {})[record["implementation"]] = record
    return found


def cell(ours, other):
    """A table cell: "ours / other" TFLOP/s and the ratio t_other / t_ours, "err" for a side that
    failed, "—" for one not run; "†" when the other ran with a note (K/V expanded)."""
    def side(record):
        if record is None:
            return "—"
        return "err" if not _ok(record) else f"{record['tflops']:.0f}"

    text = f"{side(ours)} / {side(other)}"
    if _ok(ours) and _ok(other):
        text += f" ({speedup(other['ms'], ours['ms']):.2f})"
    if other is not None and other.get("note"):
        text += " †"
    return text


def ratios(records, baseline, pass_name=None):
    """Every t_baseline / t_ours where both ran, in record order (of one pass, or all)."""
    found = []
    for key, by_impl in index(records).items():
        if pass_name is not None and key[-1] != pass_name:
            continue
        ours, other = by_impl.get("ours"), by_impl.get(baseline)
        if _ok(ours) and _ok(other):
            found.append(speedup(other["ms"], ours["ms"]))
    return found


def summary_line(records, baseline, pass_name):
    """"forward vs cuDNN: 0.75–1.15× (median 0.96) over 120 points; 18 at ≥ 1.05×"."""
    s = summarize(ratios(records, baseline, pass_name))
    what = f"{pass_name.replace('_', ' + ')} vs {LABELS[baseline]}"
    if s is None:
        return f"{what}: no point with both timed"
    return (f"{what}: {s['min']:.2f}–{s['max']:.2f}× (median {s['median']:.2f}) over "
            f"{s['points']} points; {s['ahead']} at ≥ {AHEAD:.2f}×")


def _ordered(values):
    return sorted(set(values))


def _table(header, rows, seqlens):
    lines = ["| " + " | ".join(header) + " | " + " | ".join(
        [f"N = {seqlen_label(seqlens[0])}"] + [seqlen_label(n) for n in seqlens[1:]]) + " |",
        "|" + "---|" * (len(header) + len(seqlens))]
    for label, cells in rows:
        lines.append("| " + " | ".join(label + cells) + " |")
    return lines


def markdown(records, environment=None, baselines=("cudnn", "flash")):
    """The report: a header (device, versions, method), the summary per baseline and pass, then
    per baseline one table per (dtype, pass) of the dense points (rows d × causal, columns N),
    one of the grouped-heads points, and the notes and errors."""
    env = environment or {}
    by_key = index(records)
    passes = [p for p in PASSES if any(r["pass"] == p for r in records)]
    dense = [r for r in records if r["kind"] == "dense"]
    gqa = [r for r in records if r["kind"] == "gqa"]
    rounds = env.get("rounds", "R")
    out = [
        "# flash_attn_rs against PyTorch's SDPA, one process, one timer",
        "",
        f"{env.get('gpu', '?')}, driver {env.get('driver', '?')}; torch {env.get('torch', '?')}"
        f" (CUDA {env.get('cuda', '?')}, cuDNN {env.get('cudnn', '?')}), triton "
        f"{env.get('triton', '?')}, flash_attn_rs {env.get('flash_attn_rs', '?')}; "
        f"{env.get('date', '?')}.",
        "",
        f"Ours (`flash_attn_func`, algorithm {env.get('algorithm') or 'auto'}) and SDPA's "
        "backends on the same tensors "
        "(flash-attn's layout; SDPA reads its transposed views), each timed by "
        "`triton.testing.do_bench` (L2 cleared before each repetition, median), alternated over "
        f"{rounds} rounds and the rounds' median taken. TFLOP/s: forward 4·B·H·N²·d "
        "(halved when causal), backward 2.5×, forward + backward 3.5×. Cells: ours / theirs "
        "TFLOP/s (their time / ours: > 1, ours is faster). B·N = "
        f"{env.get('tokens', '?')} tokens, H = round({env.get('hidden', '?')} / d) heads.",
        "",
        "## Summary",
        "",
    ]
    for baseline in baselines:
        out += [f"- {summary_line(records, baseline, p)}" for p in passes]
    for baseline in baselines:
        label = LABELS[baseline]
        out += ["", f"## Against {label}", ""]
        for dtype in _ordered(r["dtype"] for r in dense):
            for pass_name in passes:
                chosen = [r for r in dense if r["dtype"] == dtype and r["pass"] == pass_name]
                if not chosen:
                    continue
                seqlens = _ordered(r["seqlen"] for r in chosen)
                rows = []
                for d, causal in _ordered((r["head_dim"], r["causal"]) for r in chosen):
                    cells = []
                    for n in seqlens:
                        match = [r for r in chosen if (r["head_dim"], r["causal"], r["seqlen"])
                                 == (d, causal, n)]
                        by_impl = by_key.get(_key(match[0]), {}) if match else {}
                        cells.append(cell(by_impl.get("ours"), by_impl.get(baseline))
                                     if match else "—")
                    rows.append(([str(d), "yes" if causal else "no"], cells))
                out += [f"### {pass_name.replace('_', ' + ')}, {dtype}: ours / {label}, "
                        "TFLOP/s (ratio)", ""]
                out += _table(["d", "causal"], rows, seqlens) + [""]
        if gqa:
            seqlens = _ordered(r["seqlen"] for r in gqa)
            shapes = _ordered((r["heads"], r["kv_heads"], r["head_dim"]) for r in gqa)
            rows = []
            for dtype, pass_index, causal in _ordered(
                    (r["dtype"], PASSES.index(r["pass"]), r["causal"]) for r in gqa):
                pass_name = PASSES[pass_index]
                cells = []
                for n in seqlens:
                    match = [r for r in gqa if (r["dtype"], r["pass"], r["causal"], r["seqlen"])
                             == (dtype, pass_name, causal, n)]
                    by_impl = by_key.get(_key(match[0]), {}) if match else {}
                    cells.append(cell(by_impl.get("ours"), by_impl.get(baseline))
                                 if match else "—")
                rows.append(([dtype, pass_name.replace("_", " + "), "yes" if causal else "no"],
                             cells))
            heads = ", ".join(f"{h} query heads on {kv} K/V heads, d = {d}" for h, kv, d in shapes)
            out += [f"### Grouped heads ({heads}): ours / {label}, TFLOP/s (ratio)", ""]
            out += _table(["dtype", "pass", "causal"], rows, seqlens) + [""]
    notes, errors, plans = {}, {}, {}
    for record in records:
        if record["implementation"] == "ours":
            for kind in ("plan", "backward_plan"):
                if record.get(kind):  # the family ("fa3 backward"); the JSON has it all
                    family = record[kind].split(":")[0]
                    plans.setdefault((kind.replace("_", " "), family), []).append(record)
        if record.get("note"):
            notes.setdefault((record["implementation"], record["note"]), []).append(record)
        if record.get("error"):
            errors.setdefault((record["implementation"], record["error"]), []).append(record)
    if notes:
        out += ["## Notes (†)", ""]
        for (impl, note), where in notes.items():
            out.append(f"- {impl}: {note} ({_where(where)})")
        out.append("")
    if errors:
        out += ["## Not measured", ""]
        for (impl, error), where in errors.items():
            out.append(f"- {impl}: {error} ({_where(where)})")
        out.append("")
    if plans:
        out += ["## Ours' kernels (the plans' families; the JSON has each plan)", ""]
        for (kind, family), where in plans.items():
            out.append(f"- {kind}: {family} ({_where(where)})")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _where(records, most=6):
    """The points of these records, each once."""
    labels = list(dict.fromkeys(point_label(r) for r in records))
    more = f", and {len(labels) - most} more" if len(labels) > most else ""
    return "; ".join(labels[:most]) + more


# -- on the GPU ---------------------------------------------------------------------------


def _short(error, limit=300):
    lines = [line for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return text[:limit]


def _is_oom(error):
    return torch is not None and isinstance(error, torch.OutOfMemoryError)


class Tensors:
    """One point's tensors, flash-attn's layout (batch, seqlen, heads, head_dim), allocated once:
    Q, K, V (leaves that require grad) and dO."""

    def __init__(self, point, device, generator=None):
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[point.dtype]
        b, n, d = point.batch, point.seqlen, point.head_dim

        def randn(heads, grad):
            t = torch.randn(b, n, heads, d, device=device, dtype=dtype, generator=generator)
            return t.requires_grad_(grad)

        self.point = point
        self.causal = point.causal
        self.groups = point.heads // point.kv_heads
        self.q = randn(point.heads, True)
        self.k = randn(point.kv_heads, True)
        self.v = randn(point.kv_heads, True)
        self.d_o = randn(point.heads, False)


class Ours:
    """flash_attn_rs.flash_attn_func on the tensors as they are, with `algorithm` (None: auto)."""

    name = "ours"
    note = None

    def __init__(self, func, plans=lambda: (None, None), algorithm=None):
        self.func, self.plans, self.algorithm = func, plans, algorithm

    def bind(self, t, expand=False):
        self.t = t

    def context(self):
        return contextlib.nullcontext()

    def call(self):
        if self.algorithm is None:
            return self.func(self.t.q, self.t.k, self.t.v, causal=self.t.causal)
        return self.func(self.t.q, self.t.k, self.t.v, causal=self.t.causal,
                         algorithm=self.algorithm)

    def inputs(self):
        return (self.t.q, self.t.k, self.t.v)

    def grad_output(self):
        return self.t.d_o

    def to_flash(self, o):
        return o

    def grads_to_flash(self, dq, dk, dv):
        return dq, dk, dv


class Sdpa:
    """torch's SDPA under one backend, on the transposed views; grouped heads through
    enable_gqa, or (bind(expand=True)) K and V repeated per query head, outside the timed region,
    as leaves of their own whose gradients are summed back per group for the check."""

    def __init__(self, name, backend):
        self.name, self.backend = name, backend
        self.note = None

    def bind(self, t, expand=False):
        self.t, self.expanded = t, expand and t.groups > 1
        if self.expanded:
            self.k, self.v = (x.detach().repeat_interleave(t.groups, dim=2).requires_grad_()
                              for x in (t.k, t.v))
        else:
            self.k, self.v = t.k, t.v
        self.views = tuple(x.transpose(1, 2) for x in (t.q, self.k, self.v))
        self.d_o = t.d_o.transpose(1, 2)
        self.gqa = {"enable_gqa": True} if t.groups > 1 and not self.expanded else {}

    def context(self):
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel(self.backend)

    def call(self):
        return torch.nn.functional.scaled_dot_product_attention(
            *self.views, is_causal=self.t.causal, **self.gqa)

    def inputs(self):
        return (self.t.q, self.k, self.v)

    def grad_output(self):
        return self.d_o

    def to_flash(self, o):
        return o.transpose(1, 2)

    def grads_to_flash(self, dq, dk, dv):
        if self.expanded:
            dk, dv = (x.unflatten(2, (self.t.point.kv_heads, self.t.groups)).sum(3)
                      for x in (dk, dv))
        return dq, dk, dv


def implementations(names, algorithm=None):
    """The implementations by name, in the order they alternate; ours with `algorithm`."""
    found = []
    for name in names:
        if name == "ours":
            import flash_attn_rs

            found.append(Ours(flash_attn_rs.flash_attn_func,
                              lambda: (flash_attn_rs.last_plan(),
                                       flash_attn_rs.last_backward_plan()), algorithm))
        else:
            from torch.nn.attention import SDPBackend

            backend = {"cudnn": SDPBackend.CUDNN_ATTENTION,
                       "flash": SDPBackend.FLASH_ATTENTION}[name]
            found.append(Sdpa(name, backend))
    return found


def reference(t, need_grads):
    """O (and dQ, dK, dV) in float32 by an explicit softmax on a slice: batch 0, the first two
    heads (grouped: the first K/V head and its query heads), in flash-attn's layout. Returns
    ({name: tensor}, query heads, K/V heads) of the slice."""
    point = t.point
    kv = min(point.kv_heads, 2 if t.groups == 1 else 1)
    nq = kv * t.groups
    with torch.enable_grad():
        q = t.q[:1, :, :nq].detach().float().requires_grad_(need_grads)
        k = t.k[:1, :, :kv].detach().float().requires_grad_(need_grads)
        v = t.v[:1, :, :kv].detach().float().requires_grad_(need_grads)
        qs, ks, vs = (x.transpose(1, 2) for x in (q, k, v))
        ks, vs = (x.repeat_interleave(t.groups, dim=1) for x in (ks, vs))
        # In place: only the softmax's output is kept for the gradient (S and P of 4 heads at
        # N = 16k are 4 GiB each).
        s = (qs @ ks.transpose(-1, -2)).mul_(1.0 / math.sqrt(point.head_dim))
        if t.causal:
            n = point.seqlen
            s.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1),
                           float("-inf"))
        o = (torch.softmax(s, dim=-1) @ vs).transpose(1, 2)
        out = {"o": o.detach()}
        if need_grads:
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), t.d_o[:1, :, :nq].float())
            out.update(dq=dq, dk=dk, dv=dv)
    return out, nq, kv


def results(impl, need_grads):
    """One call of impl (and its gradients): {name: tensor} in flash-attn's layout, K/V heads as
    the inputs'."""
    with impl.context(), torch.set_grad_enabled(need_grads):
        o = impl.call()
        grads = (torch.autograd.grad(o, impl.inputs(), impl.grad_output())
                 if need_grads else None)
    out = {"o": impl.to_flash(o).detach()}
    if grads is not None:
        out.update(zip(("dq", "dk", "dv"), impl.grads_to_flash(*grads)))
    return out


def relative_error(x, ref):
    """max |x - ref| / max |ref| in float32 (NaN stays NaN, and fails every bound)."""
    x, ref = x.float(), ref.float()
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def check(impl, t, ref, ref_heads, ours_results, need_grads):
    """Runs impl once and compares it with the reference slice and with ours. Returns (results,
    {tensor: {"ref": e, "ours": e}}, error string or None)."""
    got = results(impl, need_grads)
    nq, kv = ref_heads
    bound = TOLERANCE[t.point.dtype]
    errors, failed = {}, []
    for name, value in got.items():
        heads = nq if name in ("o", "dq") else kv
        e = {"ref": relative_error(value[:1, :, :heads], ref[name])}
        if ours_results is not None and impl.name != "ours":
            e["ours"] = relative_error(value, ours_results[name])
        errors[name] = e
        if not e["ref"] <= bound:
            failed.append(f"{name} {e['ref']:.2e}")
    error = None
    if failed:
        error = (f"wrong result: max |x - ref| / max |ref| = {', '.join(failed)} > "
                 f"{bound} (float32 reference, batch 0, {nq} heads)")
    return got, errors, error


def do_bench_timer(warmup, rep):
    """triton's do_bench as the one timer: median milliseconds."""
    from triton.testing import do_bench

    def timer(fn, grad_to_none=None):
        return do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none,
                        return_mode="median")

    return timer


def pass_function(impl, pass_name):
    """The timed function of one pass. For the backward the forward runs here, once (under the
    implementation's context), and the function is the gradient alone, graph retained."""
    if pass_name == "forward":
        return impl.call
    inputs, d_o = impl.inputs(), impl.grad_output()
    if pass_name == "backward":
        with impl.context(), torch.enable_grad():
            o = impl.call()
        return lambda: torch.autograd.grad(o, inputs, d_o, retain_graph=True)

    def forward_backward():
        o = impl.call()
        return torch.autograd.grad(o, inputs, d_o)

    return forward_backward


def record_for(point, pass_name, impl_name):
    return {**point._asdict(), "pass": pass_name, "implementation": impl_name, "ms": None,
            "round_ms": [], "tflops": None, "error": None, "note": None, "check": None,
            "plan": None, "backward_plan": None, "speedup": None}


def run_point(point, impls, passes, rounds, timer, device="cuda", seed=0, log=print):
    """Allocates the point's tensors, checks every implementation, then times each pass over the
    rounds, alternating implementations. Returns the point's records, one per (pass,
    implementation); an implementation that raised or failed its check has its error instead of
    a time."""
    need_grads = any(p != "forward" for p in passes)
    records = {(p, impl.name): record_for(point, p, impl.name) for p in passes for impl in impls}

    def fail(impl_name, error):
        for p in passes:
            records[(p, impl_name)]["error"] = error

    try:
        generator = torch.Generator(device=device).manual_seed(seed)
        t = Tensors(point, device, generator)
        ref, nq, kv = reference(t, need_grads)
    except Exception as e:  # out of memory, mostly: the whole point is not measured
        error = _short(e)
        for impl in impls:
            fail(impl.name, error)
        log(f"{point_label(records[(passes[0], impls[0].name)])}: {error}")
        _free(device)
        return list(records.values())

    def checked(impl):
        """impl's check; a backend that refuses enable_gqa is checked again with K and V
        expanded (and keeps them for the timings, with a note)."""
        try:
            return check(impl, t, ref, (nq, kv), ours_results, need_grads)
        except RuntimeError as e:
            if not (isinstance(impl, Sdpa) and t.groups > 1) or _is_oom(e):
                raise
            refused = _short(e, 160)
        _free(device)
        impl.bind(t, expand=True)
        try:
            found = check(impl, t, ref, (nq, kv), ours_results, need_grads)
        except Exception as e:
            raise RuntimeError(f"with enable_gqa: {refused}; with K and V expanded: "
                               f"{_short(e, 160)}") from e
        impl.note = (f"enable_gqa refused ({refused}): K and V expanded to {point.heads} heads "
                     "with repeat_interleave outside the timed region")
        return found

    alive, ours_results, checks = [], None, []
    for impl in impls:
        impl.note = None
        impl.bind(t)
        caught = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got, errors, error = checked(impl)
        except Exception as e:
            error = _short(e, 400)
            _free(device)
            why = [str(w.message).splitlines()[0] for w in caught][:2]
            if why:
                error += " (" + "; ".join(why)[:300] + ")"
            errors, got = None, None
        for p in passes:
            r = records[(p, impl.name)]
            r["check"], r["note"] = errors, impl.note
        if impl.name == "ours" and got is not None:
            plan, backward_plan = impl.plans()
            for p in passes:
                records[(p, "ours")]["plan"] = plan
                if p != "forward":
                    records[(p, "ours")]["backward_plan"] = backward_plan if need_grads else None
            if error is None:
                ours_results = got
        if error is not None:
            fail(impl.name, error)
            checks.append(f"{impl.name} FAILED: {error}")
        else:
            alive.append(impl)
            worst = max(e["ref"] for e in errors.values())
            vs = [e["ours"] for e in errors.values() if "ours" in e]
            checks.append(f"{impl.name} {worst:.1e}" + (f" (vs ours {max(vs):.1e})" if vs else "")
                          + (" [K/V expanded]" if impl.note else ""))
        del got
    log(f"{point_label(records[(passes[0], impls[0].name)])} B {point.batch}: check "
        f"(max |Δ| / max |ref| ≤ {TOLERANCE[point.dtype]}): " + " | ".join(checks))
    ref = ours_results = None  # freed before the timings

    for pass_name in passes:
        functions = {}
        for impl in alive:
            try:
                functions[impl.name] = pass_function(impl, pass_name)
            except Exception as e:
                records[(pass_name, impl.name)]["error"] = _short(e)
                _free(device)
        for _ in range(rounds):
            for impl in alive:
                fn = functions.get(impl.name)
                r = records[(pass_name, impl.name)]
                if fn is None or r["error"]:
                    continue
                try:
                    grad_context = torch.no_grad() if pass_name == "forward" else \
                        contextlib.nullcontext()
                    with impl.context(), grad_context:
                        ms = timer(fn, grad_to_none=None if pass_name == "forward"
                                   else list(impl.inputs()))
                    r["round_ms"].append(ms)
                except Exception as e:
                    r["error"], r["round_ms"] = _short(e), []
                    functions.pop(impl.name, None)
                    _free(device)
        del functions
        line = []
        for impl in impls:
            r = records[(pass_name, impl.name)]
            if r["round_ms"] and not r["error"]:
                r["ms"] = statistics.median(r["round_ms"])
                r["tflops"] = tflops(point, pass_name, r["ms"])
                line.append(f"{impl.name} {r['tflops']:.0f}")
            else:
                line.append(f"{impl.name} err")
        ours = records.get((pass_name, "ours"))
        if _ok(ours):
            ours["speedup"] = {impl.name: speedup(records[(pass_name, impl.name)]["ms"],
                                                  ours["ms"])
                               for impl in impls if impl.name != "ours"
                               and _ok(records[(pass_name, impl.name)])}
            line.append(", ".join(f"ours vs {k} {v:.2f}×" for k, v in ours["speedup"].items()))
        log(f"  {pass_name:16} TFLOP/s: " + " | ".join(line))
    t = None
    _free(device)
    return list(records.values())


def _free(device):
    """Returns PyTorch's cached blocks to the device (after an out-of-memory, between points).
    A failure here (a CUDA error that poisoned the context) is left for the next call to report
    in its record."""
    if str(device).startswith("cuda"):
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass


def environment(args):
    """Versions and device, for the JSON and the markdown's header."""
    import triton

    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "triton": triton.__version__, "argv": sys.argv[1:], "rounds": args.rounds,
           "warmup_ms": args.warmup, "rep_ms": args.rep, "tokens": args.tokens,
           "hidden": args.hidden, "tolerance": TOLERANCE, "algorithm": args.algorithm}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    try:
        env["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True).stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        env["driver"] = None
    try:
        from importlib.metadata import version

        env["flash_attn_rs"] = version("flash-attn-rs")
    except Exception:
        env["flash_attn_rs"] = None
    try:
        import flash_attn_rs

        env["flash_attn_rs_path"] = flash_attn_rs.__file__
    except ImportError:
        pass
    return env


def _list(kind, allowed=None):
    def parse(text):
        values = [kind(v) for v in text.split(",") if v.strip()]
        if allowed is not None:
            bad = [v for v in values if v not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"{bad}: allowed {', '.join(map(str, allowed))}")
        return tuple(values)

    return parse


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="bf16, d 64 and 128, N 512, 2k, 8k, causal both, one grouped point")
    p.add_argument("--dtypes", type=_list(str, DTYPES), help="default bf16,f16")
    p.add_argument("--head-dims", type=_list(int), help="default 64,96,128,192,256")
    p.add_argument("--seqlens", type=_list(int), help="default 512,1024,2048,4096,8192,16384")
    p.add_argument("--causal", choices=sorted(CAUSALS), default="both")
    p.add_argument("--passes", type=_list(str, PASSES), default=PASSES,
                   help="default forward,backward,forward_backward")
    p.add_argument("--implementations", type=_list(str, IMPLEMENTATIONS), default=IMPLEMENTATIONS,
                   help="default ours,cudnn,flash (timed in this order)")
    p.add_argument("--algorithm", help="ours' algorithm= (default: None, auto; e.g. fa2-tc)")
    p.add_argument("--gqa", action=argparse.BooleanOptionalAction, default=True,
                   help=f"the grouped-heads points ({GQA_HEADS} query heads on {GQA_KV_HEADS} "
                        f"K/V heads, d = {GQA_HEAD_DIM}); default on")
    p.add_argument("--tokens", type=int, default=16384, help="B·N (default 16384)")
    p.add_argument("--hidden", type=int, default=2048, help="H = round(hidden / d) (default 2048)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of alternation (default 3)")
    p.add_argument("--warmup", type=float, default=10, help="do_bench's warmup, ms (default 10)")
    p.add_argument("--rep", type=float, default=50, help="do_bench's rep, ms (default 50)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="JSON: every record and the environment")
    p.add_argument("--markdown", help="the tables (markdown)")
    return p


def points_from(args):
    """The sweep the arguments ask for."""
    quick = QUICK if args.quick else {}
    seqlens = args.seqlens or quick.get("seqlens", SEQLENS)
    causals = CAUSALS[args.causal]
    # --quick's one grouped point (causal, N = 2k), unless --seqlens or --causal off say otherwise.
    gqa_causals = tuple(c for c in quick.get("gqa_causals", causals) if c in causals)
    gqa_seqlens = quick["gqa_seqlens"] if args.quick and not args.seqlens else seqlens
    return sweep(dtypes=args.dtypes or quick.get("dtypes", DTYPES),
                 head_dims=args.head_dims or quick.get("head_dims", HEAD_DIMS),
                 causals=causals, seqlens=seqlens, tokens=args.tokens, hidden=args.hidden,
                 gqa_causals=gqa_causals if args.gqa else (), gqa_seqlens=gqa_seqlens)


def write(args, env, records):
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": env, "records": records}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(records, env, [i for i in args.implementations if i != "ours"]))


def main(argv=None):
    args = parser().parse_args(argv)
    if args.rounds < 1:
        sys.exit("--rounds must be at least 1")
    if torch is None:
        sys.exit("bench_vs_torch.py needs PyTorch (and triton, and the flash_attn_rs wheel)")
    if not torch.cuda.is_available():
        sys.exit("bench_vs_torch.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    points = points_from(args)
    impls = implementations(args.implementations, args.algorithm)
    env = environment(args)
    timer = do_bench_timer(args.warmup, args.rep)
    print(f"{env.get('gpu')}, driver {env['driver']}, torch {env['torch']} (CUDA {env['cuda']}, "
          f"cuDNN {env['cudnn']}), triton {env['triton']}, flash_attn_rs {env['flash_attn_rs']}",
          flush=True)
    calls = len(points) * len(args.passes) * len(impls) * args.rounds
    print(f"{len(points)} points × {len(args.passes)} passes × {len(impls)} implementations × "
          f"{args.rounds} rounds = {calls} timings (do_bench warmup {args.warmup:g} ms, rep "
          f"{args.rep:g} ms)", flush=True)
    started = time.perf_counter()
    records = []
    for i, point in enumerate(points):
        records += run_point(point, impls, args.passes, args.rounds, timer, seed=args.seed + i,
                             log=lambda line: print(line, flush=True))
        write(args, env, records)
    baselines = [i for i in args.implementations if i != "ours"]
    if "ours" in args.implementations:
        for baseline in baselines:
            for p in args.passes:
                print(summary_line(records, baseline, p), flush=True)
    print(f"{len(points)} points in {time.perf_counter() - started:.0f} s", flush=True)
    bad = [r for r in records if r["implementation"] == "ours" and r["error"]
           and not r["error"].startswith("OutOfMemoryError")]
    if bad:
        print(f"ours failed at {len(bad)} (point, pass) records: first: {point_label(bad[0])} "
              f"{bad[0]['pass']}: {bad[0]['error']}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
