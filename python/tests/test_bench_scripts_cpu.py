"""The benchmark scripts' pure parts, without a GPU or PyTorch: bench_vs_torch.py's sweep, FLOP
counts, ratios, summary and markdown tables, and train_step_bench.py's batch sizes and table. With
PyTorch installed, also a small sweep of bench_vs_torch.py on the CPU (SDPA's CPU kernels, a
stand-in for ours, a wall-clock timer): its correctness check, the grouped-heads fallback, and
the records of a wrong result and of an error.

The scripts are found in the checkout (lab/scripts/) or in the bundle (scripts/, beside
python/tests/)."""

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(name):
    for folder in (ROOT / "lab" / "scripts", ROOT / "scripts"):
        path = folder / f"{name}.py"
        if path.exists():
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            return module
    pytest.fail(f"{name}.py is neither in {ROOT / 'lab' / 'scripts'} nor in {ROOT / 'scripts'}")


@pytest.fixture(scope="module")
def bench():
    return load("bench_vs_torch")


@pytest.fixture(scope="module")
def train():
    return load("train_step_bench")


def test_forward_flops_are_the_papers_count(bench):
    # 4·B·H·N²·d: B = 8, H = 16, N = 2048, d = 128.
    assert bench.forward_flops(8, 16, 2048, 128, False) == 4 * 8 * 16 * 2048**2 * 128
    assert bench.forward_flops(8, 16, 2048, 128, True) == 2 * 8 * 16 * 2048**2 * 128
    point = bench.Point("dense", "bf16", 128, False, 2048, 8, 16, 16)
    forward = bench.flops(point, "forward")
    assert bench.flops(point, "backward") == 2.5 * forward
    assert bench.flops(point, "forward_backward") == 3.5 * forward
    # 0.275 TFLOP in 0.5 ms: 549.8 TFLOP/s.
    assert bench.tflops(point, "forward", 0.5) == pytest.approx(forward / 0.5e-3 / 1e12)
    assert bench.tflops(point, "forward", 0.5) == pytest.approx(549.76, abs=0.01)


def test_the_default_sweep_is_the_papers(bench):
    points = bench.points_from(bench.parser().parse_args([]))
    dense = [p for p in points if p.kind == "dense"]
    gqa = [p for p in points if p.kind == "gqa"]
    assert len(dense) == 2 * 5 * 2 * 6 and len(gqa) == 2 * 2 * 6
    assert {p.dtype for p in points} == {"bf16", "f16"}
    assert sorted({p.head_dim for p in dense}) == [64, 96, 128, 192, 256]
    assert sorted({p.seqlen for p in points}) == [512, 1024, 2048, 4096, 8192, 16384]
    assert {p.causal for p in points} == {False, True}
    assert all(p.batch * p.seqlen == 16384 for p in points)
    assert {p.head_dim: p.heads for p in dense} == {64: 32, 96: 21, 128: 16, 192: 11, 256: 8}
    assert all(p.kv_heads == p.heads for p in dense)
    assert {(p.heads, p.kv_heads, p.head_dim) for p in gqa} == {(32, 8, 128)}
    # Each dtype's dense points, then its grouped ones.
    assert [p.kind for p in points[:60]] == ["dense"] * 60 and points[60].kind == "gqa"


def test_quick_and_the_options(bench):
    quick = bench.points_from(bench.parser().parse_args(["--quick"]))
    assert [(p.kind, p.head_dim, p.causal, p.seqlen) for p in quick] == [
        ("dense", d, c, n) for d in (64, 128) for c in (False, True) for n in (512, 2048, 8192)
    ] + [("gqa", 128, True, 2048)]
    assert {p.dtype for p in quick} == {"bf16"}
    args = bench.parser().parse_args(["--dtypes", "f16", "--head-dims", "64", "--seqlens",
                                      "1024", "--causal", "on", "--no-gqa", "--tokens", "4096"])
    assert bench.points_from(args) == [bench.Point("dense", "f16", 64, True, 1024, 4, 32, 32)]
    args = bench.parser().parse_args(["--quick", "--causal", "off"])
    assert all(p.kind == "dense" and not p.causal for p in bench.points_from(args))
    assert bench.parser().parse_args([]).passes == ("forward", "backward", "forward_backward")
    with pytest.raises(SystemExit):
        bench.parser().parse_args(["--dtypes", "f32"])
    with pytest.raises(SystemExit):
        bench.parser().parse_args(["--passes", "sideways"])


def test_ratio_and_summary(bench):
    assert bench.speedup(2.0, 1.0) == 2.0  # theirs takes twice ours: ours is 2x faster
    s = bench.summarize([0.8, 1.2, 1.0, 1.1])
    assert s == {"min": 0.8, "median": pytest.approx(1.05), "max": 1.2, "points": 4, "ahead": 2}
    assert bench.summarize([]) is None
    assert [bench.seqlen_label(n) for n in (512, 1024, 16384, 1536)] == ["512", "1k", "16k", "1536"]


def fake_record(bench, point, pass_name, impl, ms=None, error=None, note=None):
    record = bench.record_for(point, pass_name, impl)
    if ms is not None:
        record.update(ms=ms, round_ms=[ms], tflops=bench.tflops(point, pass_name, ms))
    record.update(error=error, note=note)
    return record


def test_markdown_tables_cells_and_summary(bench):
    a = bench.Point("dense", "bf16", 64, False, 512, 32, 32, 32)
    b = bench.Point("dense", "bf16", 64, False, 1024, 16, 32, 32)
    c = bench.Point("dense", "bf16", 64, True, 512, 32, 32, 32)
    g = bench.Point("gqa", "bf16", 128, True, 2048, 8, 32, 8)
    records = [
        # a: ours 0.5 ms, cuDNN 0.6 ms (1.20: ours faster), flash 0.4 ms (0.80).
        fake_record(bench, a, "forward", "ours", 0.5),
        fake_record(bench, a, "forward", "cudnn", 0.6),
        fake_record(bench, a, "forward", "flash", 0.4),
        # b: cuDNN refused.
        fake_record(bench, b, "forward", "ours", 1.0),
        fake_record(bench, b, "forward", "cudnn", error="RuntimeError: refused"),
        fake_record(bench, b, "forward", "flash", 1.0),
        # c: only ours ran the backward.
        fake_record(bench, c, "backward", "ours", 1.0),
        fake_record(bench, c, "backward", "cudnn", error="OutOfMemoryError: oom"),
        fake_record(bench, g, "forward", "ours", 1.0),
        fake_record(bench, g, "forward", "cudnn", 1.1, note="enable_gqa refused (x)"),
    ]
    text = bench.markdown(records, {"gpu": "H200", "rounds": 3, "tokens": 16384,
                                    "hidden": 2048})
    lines = text.splitlines()
    assert "H200" in text and "3 rounds" in text
    header = lines.index("### forward, bf16: ours / cuDNN, TFLOP/s (ratio)")
    assert lines[header + 2] == "| d | causal | N = 512 | 1k |"
    assert lines[header + 3] == "|---|---|---|---|"
    ours_a, ours_b = bench.tflops(a, "forward", 0.5), bench.tflops(b, "forward", 1.0)
    assert lines[header + 4] == (f"| 64 | no | {ours_a:.0f} / {ours_a / 1.2:.0f} (1.20) | "
                                 f"{ours_b:.0f} / err |")
    # The causal row has no forward record: no row for it in the forward table.
    assert lines[header + 5] == ""
    backward = lines.index("### backward, bf16: ours / cuDNN, TFLOP/s (ratio)")
    assert lines[backward + 2] == "| d | causal | N = 512 |"
    assert lines[backward + 4] == f"| 64 | yes | {bench.tflops(c, 'backward', 1.0):.0f} / err |"
    assert "- forward vs cuDNN: 1.10–1.20× (median 1.15) over 2 points; 2 at ≥ 1.05×" in lines
    assert ("- forward vs PyTorch flash: 0.80–1.00× (median 0.90) over 2 points; 0 at ≥ 1.05×"
            in lines)
    assert "- backward vs cuDNN: no point with both timed" in lines
    gqa = lines.index("### Grouped heads (32 query heads on 8 K/V heads, d = 128): ours / cuDNN, "
                      "TFLOP/s (ratio)")
    assert lines[gqa + 2] == "| dtype | pass | causal | N = 2k |"
    assert lines[gqa + 4].startswith("| bf16 | forward | yes | ") and lines[gqa + 4].endswith(
        " (1.10) † |")
    assert any(line.startswith("- cudnn: enable_gqa refused (x)") for line in lines)
    assert any(line.startswith("- cudnn: RuntimeError: refused (bf16 d 64 non-causal N 1k")
               for line in lines)
    assert bench.ratios(records, "cudnn", "forward") == [pytest.approx(1.2), pytest.approx(1.1)]


def test_the_scripts_run_without_torch_only_as_far_as_their_options(bench, train):
    # main() needs PyTorch and a GPU; the options and the plain functions do not.
    assert "one process" in bench.__doc__ and "do_bench" in bench.__doc__
    args = train.resolve(train.parser().parse_args([]))
    assert args.seqlens == (4096, 16384, 65536) and args.tokens == 65536
    assert [train.batch_for(args.tokens, n) for n in args.seqlens] == [16, 4, 1]
    quick = train.resolve(train.parser().parse_args(["--quick"]))
    assert quick.seqlens == (4096, 16384) and quick.tokens == 32768 and quick.rounds == 2
    with pytest.raises(SystemExit):
        train.resolve(train.parser().parse_args(["--backends", "ours,math"]))


def test_training_table(train):
    records = [
        {"backend": "ours", "seqlen": 4096, "batch": 16, "tokens": 65536, "step_ms": 400.0,
         "tokens_per_s": 163840.0, "peak_bytes": 40 * 2**30, "error": None},
        {"backend": "cudnn", "seqlen": 4096, "batch": 16, "tokens": 65536, "step_ms": 440.0,
         "tokens_per_s": 148945.5, "peak_bytes": 41 * 2**30, "error": None},
        {"backend": "flash", "seqlen": 4096, "batch": 16, "tokens": 65536, "step_ms": None,
         "tokens_per_s": None, "peak_bytes": None, "error": "OutOfMemoryError: x"},
    ]
    lines = train.markdown(records, {"gpu": "H200"}, {"ours": "131072"}).splitlines()
    assert "| 4k | 16 | flash_attn_rs | 400.0 | 163,840 | 40.0 | 1.00 |" in lines
    assert "| 4k | 16 | SDPA cuDNN | 440.0 | 148,946 | 41.0 | 1.10 |" in lines
    assert "| 4k | 16 | SDPA flash | error: OutOfMemoryError: x |  |  |  |" in lines
    assert "| flash_attn_rs | 131072 |" in lines


# -- with PyTorch: a small sweep on the CPU ------------------------------------------------


def test_a_cpu_sweep_checks_falls_back_and_records_errors(bench):
    pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend
    import torch.nn.functional as F

    if bench.torch is None:
        pytest.skip("bench_vs_torch.py was imported before PyTorch was")

    def stand_in(q, k, v, causal=False):
        groups = q.shape[2] // k.shape[2]
        o = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                           is_causal=causal, enable_gqa=groups > 1)
        return o.transpose(1, 2)

    class RefusesGqa(bench.Sdpa):
        def call(self):
            if self.gqa:
                raise RuntimeError("no grouped heads here")
            return super().call()

    class Wrong(bench.Sdpa):  # the other mask
        def call(self):
            return F.scaled_dot_product_attention(*self.views, is_causal=not self.t.causal,
                                                  **self.gqa)

    class Raises(bench.Sdpa):
        def call(self):
            raise RuntimeError("no kernel")

    calls = []

    def timer(fn, grad_to_none=None):
        calls.append(grad_to_none is not None)
        fn()
        return 1.0

    flash = SDPBackend.FLASH_ATTENTION
    impls = [bench.Ours(stand_in, lambda: ("plan", "backward plan")),
             RefusesGqa("cudnn", flash), Wrong("flash", flash), Raises("raises", flash)]
    lines = []
    records = []
    for point in (bench.Point("gqa", "bf16", 64, True, 96, 2, 4, 2),
                  bench.Point("dense", "f16", 32, False, 64, 2, 2, 2)):
        records += bench.run_point(point, impls, ("forward", "backward"), 2, timer,
                                   device="cpu", log=lines.append)
    assert len(records) == 2 * 2 * 4
    by = {(r["kind"], r["pass"], r["implementation"]): r for r in records}
    ours = by[("gqa", "backward", "ours")]
    assert ours["error"] is None and ours["round_ms"] == [1.0, 1.0] and ours["ms"] == 1.0
    assert ours["plan"] == "plan" and ours["backward_plan"] == "backward plan"
    assert ours["check"]["dk"]["ref"] < bench.TOLERANCE["bf16"]
    assert by[("gqa", "forward", "ours")]["backward_plan"] is None
    refused = by[("gqa", "backward", "cudnn")]
    assert refused["error"] is None and refused["note"].startswith("enable_gqa refused")
    assert refused["check"]["dk"]["ours"] < 0.05  # dK summed back per group
    assert by[("dense", "forward", "cudnn")]["note"] is None
    assert ours["speedup"] == {"cudnn": 1.0}
    for kind in ("gqa", "dense"):
        assert by[(kind, "forward", "flash")]["error"].startswith("wrong result: ")
    assert by[("dense", "backward", "raises")]["error"] == "RuntimeError: no kernel"
    assert by[("gqa", "backward", "raises")]["error"] == (
        "RuntimeError: with enable_gqa: RuntimeError: no kernel; with K and V expanded: "
        "RuntimeError: no kernel")
    # Per pass: 2 rounds × the 2 implementations that passed, the backward with grad_to_none.
    assert calls == [False] * 4 + [True] * 4 + [False] * 4 + [True] * 4
    assert any("flash FAILED: wrong result" in line for line in lines)
    assert "†" in bench.markdown(records)
