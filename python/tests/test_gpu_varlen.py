"""flash_attn_varlen_func (packed batches of sequences of different lengths) against the float64
reference built sequence by sequence (``reference.packed_attention64``), with the tolerance rule
of test_gpu_numerics.py: auto (the default: fa3, fa2-tc off compute capability 9.0) and fa2-tc,
float16 and bfloat16, causal and not, grouped K/V heads, a window and soft-capping, uneven
lengths with empty sequences, more sequences than one launch's table, sliced inputs, and L;
offsets on the GPU (read by the kernels, no synchronization: timed against a busy stream) and on
the CPU (read and checked on the host).
The backward: the packed backward kernels (fa3's; fa2-tc's in deterministic mode and at head
dims past 128), checked against each sequence's float64 gradients.

FLASH_ATTN_PY_RESULTS=path appends one line per checked tensor, as test_gpu_numerics.py does."""

import itertools
import random
import time

from gpu_support import DEVICE, generator, randn, torch

import pytest
import reference as ref
from test_gpu_numerics import DTYPES, assert_within, record, seed_of

import flash_attn_rs

# (query, key) lengths of each sequence. SELF: packed prompts (equal lengths), uneven, block
# tails, an empty sequence and a one-token one. CROSS: different query and key lengths, a
# sequence without queries, one without keys (O = 0, L = -inf), seqlen_q > seqlen_k (with causal
# its first rows see no key), and lengths past one block.
SELF = [(1, 1), (130, 130), (0, 0), (77, 77), (300, 300), (64, 64)]
CROSS = [(17, 40), (0, 5), (200, 150), (64, 0), (1, 1), (129, 257)]
LENGTHS = {"self": SELF, "cross": CROSS}

# (window_size, softcap, causal), as test_gpu_numerics.SCORES: a causal window, a two-sided
# window with Gemma 2's capping, capping alone.
SCORES = [((64, 0), 0.0, True), ((32, 16), 30.0, False), ((-1, -1), 20.0, True)]

ALGORITHMS = [None, "fa2-tc"]


def offsets(lengths):
    """cu_seqlens_q and cu_seqlens_k, as lists, of (query, key) lengths."""
    return ([0, *itertools.accumulate(n)] for n in zip(*lengths))


def packed_inputs(test, lengths, heads, heads_kv, d, dtype):
    """Q (total_q, heads, d), K and V (total_k, heads_kv, d) drawn N(0, 1), and the offsets."""
    cu_q, cu_k = offsets(lengths)
    g = generator(seed_of(test))
    q = randn((cu_q[-1], heads, d), dtype, g)
    k, v = (randn((cu_k[-1], heads_kv, d), dtype, g) for _ in range(2))
    return q, k, v, cu_q, cu_k


def run(q, k, v, cu_q, cu_k, offsets_dtype=torch.int32, offsets_device=DEVICE, **kwargs):
    """flash_attn_varlen_func with the offsets as tensors and the true longest lengths."""
    cu_seqlens = [torch.tensor(c, dtype=offsets_dtype, device=offsets_device) for c in (cu_q, cu_k)]
    longest = [max(b - a for a, b in zip(c, c[1:])) for c in (cu_q, cu_k)]
    return flash_attn_rs.flash_attn_varlen_func(q, k, v, *cu_seqlens, *longest, return_lse=True,
                                                **kwargs)


def check_packed(test, q, k, v, cu_q, cu_k, o, lse, causal, window=None, softcap=0.0,
                 alibi=None):
    """O and L of a packed call against the float64 reference, sequence by sequence."""
    plan = flash_attn_rs.last_plan()
    assert "_varlen" in plan, plan
    dtype, scale = q.dtype, q.shape[-1] ** -0.5
    assert o.shape == q.shape and o.dtype == dtype
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
    q64, k64, v64 = (t.detach().to(torch.float64) for t in (q, k, v))
    o_ref, lse_ref = ref.packed_attention64(q64, k64, v64, cu_q, cu_k, causal, scale, window,
                                            softcap, alibi)
    o_dtype = ref.packed_attention_in_dtype(q64, k64, v64, cu_q, cu_k, causal, scale, dtype,
                                            window, softcap, alibi)
    assert_within(test, "o", o, o_ref, ref.forward_bound(o_ref, o_dtype, dtype), plan)
    lse_error = ref.logsumexp_error(lse, lse_ref)
    record(test, "lse", lse_error, ref.LOGSUMEXP_TOLERANCE, plan)
    assert lse_error <= ref.LOGSUMEXP_TOLERANCE, f"{test}: L error {lse_error:.3e} ({plan})"


def assert_algorithm(algorithm):
    plan = flash_attn_rs.last_plan()
    if algorithm is not None:
        assert plan.startswith(f"{algorithm}:"), plan


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=["default", "fa2-tc"])
def test_varlen_matches_the_reference(algorithm, dtype, causal, lengths, head_dim):
    test = f"varlen {algorithm} {dtype} causal={causal} {lengths} d={head_dim}"
    q, k, v, cu_q, cu_k = packed_inputs(test, LENGTHS[lengths], 3, 3, head_dim, DTYPES[dtype])
    o, lse = run(q, k, v, cu_q, cu_k, causal=causal, algorithm=algorithm)
    assert_algorithm(algorithm)
    check_packed(test, q, k, v, cu_q, cu_k, o, lse, causal)


@pytest.mark.parametrize("heads", [(4, 2), (4, 1)], ids=lambda h: f"{h[0]}on{h[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=["default", "fa2-tc"])
def test_varlen_grouped_kv_heads(algorithm, causal, heads):
    """K and V with fewer heads than Q (groups of 2, MQA), read in place."""
    test = f"varlen gqa {algorithm} {heads} causal={causal}"
    q, k, v, cu_q, cu_k = packed_inputs(test, CROSS, *heads, 64, torch.bfloat16)
    o, lse = run(q, k, v, cu_q, cu_k, causal=causal, algorithm=algorithm)
    assert_algorithm(algorithm)
    check_packed(test, q, k, v, cu_q, cu_k, o, lse, causal)


@pytest.mark.parametrize("scores", SCORES, ids=lambda s: f"w{s[0][0]}_{s[0][1]}c{s[1]}")
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=["default", "fa2-tc"])
def test_varlen_windows_and_softcap(algorithm, dtype, scores):
    """window_size and softcap on each sequence alone (the `_varlen_local` kernels), each window
    at its own sequence's bottom-right corner."""
    window, softcap, causal = scores
    test = f"varlen scores {algorithm} {dtype} {scores}"
    q, k, v, cu_q, cu_k = packed_inputs(test, CROSS, 4, 2, 64, DTYPES[dtype])
    o, lse = run(q, k, v, cu_q, cu_k, causal=causal, window_size=window, softcap=softcap,
                 algorithm=algorithm)
    assert "_local" in flash_attn_rs.last_plan(), flash_attn_rs.last_plan()
    check_packed(test, q, k, v, cu_q, cu_k, o, lse, causal,
                 None if window == (-1, -1) else window, softcap)


def sequence_slopes(sequences, heads):
    """ALiBi slopes per sequence and head, (sequences, heads) float32 on the GPU: ALiBi's
    2^(-8 (h + 1) / heads), each sequence's row scaled differently."""
    base = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=DEVICE)
    return base[None] * torch.linspace(0.5, 2.0, sequences, device=DEVICE)[:, None]


@pytest.mark.parametrize("per_sequence", [False, True], ids=["heads", "sequence_heads"])
@pytest.mark.parametrize("scores", [((-1, -1), 0.0, True), ((32, 16), 30.0, False)],
                         ids=["causal", "w32_16c30"])
@pytest.mark.parametrize("offsets_on", ["cuda", "cpu"])
@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=["default", "fa2-tc"])
def test_varlen_alibi(algorithm, offsets_on, scores, per_sequence):
    """alibi_slopes on packed sequences, (heads,) or one row per sequence: each sequence's bias
    at its own bottom-right diagonal with its own slopes, forward and backward."""
    window, softcap, causal = scores
    test = f"varlen alibi {algorithm} {offsets_on} {scores} per_sequence={per_sequence}"
    q, k, v, cu_q, cu_k = packed_inputs(test, CROSS, 4, 2, 64, torch.bfloat16)
    slopes = sequence_slopes(len(CROSS), 4)
    slopes = slopes if per_sequence else slopes[1]
    o, lse = run(q, k, v, cu_q, cu_k, causal=causal, window_size=window, softcap=softcap,
                 alibi_slopes=slopes, algorithm=algorithm, offsets_device=offsets_on)
    assert "_local" in flash_attn_rs.last_plan(), flash_attn_rs.last_plan()
    win = None if window == (-1, -1) else window
    check_packed(test, q, k, v, cu_q, cu_k, o, lse, causal, win, softcap, slopes)
    check_varlen_backward(test + " backward", torch.bfloat16, CROSS, causal, (window, softcap),
                          heads=4, offsets_on=offsets_on, alibi=slopes)


def test_varlen_alibi_past_one_launch():
    """300 sequences with a row of slopes each: the second launch reads its own rows."""
    rng = random.Random(301)
    lengths = [(n, n) for n in (rng.randrange(0, 40) for _ in range(300))]
    test = "varlen alibi 300 sequences"
    q, k, v, cu_q, cu_k = packed_inputs(test, lengths, 2, 2, 64, torch.bfloat16)
    slopes = sequence_slopes(300, 2)
    o, lse = run(q, k, v, cu_q, cu_k, causal=True, alibi_slopes=slopes)
    check_packed(test, q, k, v, cu_q, cu_k, o, lse, True, alibi=slopes)
    check_varlen_backward(test + " backward", torch.float16, lengths, True, ((-1, -1), 0.0),
                          heads=2, alibi=slopes)


@pytest.mark.parametrize("offsets_on", ["cuda", "cpu"])
@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=["default", "fa2-tc"])
def test_varlen_more_sequences_than_one_launch_holds(algorithm, offsets_on):
    """600 sequences of 0-40 tokens: more than one launch's table of 255, so several launches
    (offsets on the GPU: each launch's addresses at its first sequence)."""
    test = f"varlen many {algorithm} {offsets_on}"
    draw = random.Random(seed_of(test))
    lengths = [(draw.randint(0, 40), draw.randint(0, 40)) for _ in range(600)]
    q, k, v, cu_q, cu_k = packed_inputs(test, lengths, 2, 1, 64, torch.bfloat16)
    o, lse = run(q, k, v, cu_q, cu_k, causal=True, algorithm=algorithm,
                 offsets_device=offsets_on)
    check_packed(test, q, k, v, cu_q, cu_k, o, lse, True)


def test_varlen_sliced_inputs_cpu_int64_offsets_and_a_loose_bound():
    """Q, K, V sliced from one (total, 3, heads, head_dim + 8) tensor (no stride contiguous but
    the last), int64 offsets on the CPU (no synchronization), max_seqlen far above the longest
    sequence (an upper bound, as in flash-attn), and return_lse=False."""
    test = "varlen sliced"
    cu, h, d = [0, 100, 100, 357, 420], 3, 64
    qkv = randn((cu[-1], 3, h, d + 8), torch.bfloat16, generator(seed_of(test)))
    q, k, v = (qkv[:, i, :, :d] for i in range(3))
    assert not q.is_contiguous() and q.stride(-1) == 1
    cu_cpu = torch.tensor(cu, dtype=torch.int64)
    o, lse = flash_attn_rs.flash_attn_varlen_func(q, k, v, cu_cpu, cu_cpu, 4096, 4096,
                                                  causal=True, return_lse=True)
    check_packed(test, q, k, v, cu, cu, o, lse, True)
    o_only = flash_attn_rs.flash_attn_varlen_func(q, k, v, cu_cpu, cu_cpu, 4096, 4096,
                                                  causal=True)
    assert torch.equal(o_only, o)


def test_varlen_default_is_auto_running_fa3_on_hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("not a compute capability 9.0 device")
    q, k, v, cu_q, cu_k = packed_inputs("varlen fa3", SELF, 2, 2, 128, torch.bfloat16)
    run(q, k, v, cu_q, cu_k)
    plan = flash_attn_rs.last_plan()
    assert plan.startswith("auto:") and "fa3_forward_bf16_d128" in plan and "_varlen" in plan, plan


# (window_size, softcap) of the packed backward: none, a window with Gemma 2's capping.
BACKWARD_SCORES = [((-1, -1), 0.0), ((24, 8), 30.0)]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("lengths", ["self", "cross"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("scores", BACKWARD_SCORES, ids=lambda s: f"w{s[0][0]}_{s[0][1]}c{s[1]}")
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("offsets_on", ["cuda", "cpu"])
def test_varlen_backward(offsets_on, dtype, lengths, causal, scores, deterministic):
    """The packed backward: dQ, dK, dV of every sequence against the float64 reference of that
    sequence alone (its window at its own bottom-right corner, and its capping), with the
    project's bound; rows of sequences without keys, and keys of sequences without queries, get
    zero gradients. Offsets on the GPU (the kernels read them) and on the CPU (the host does)."""
    check_varlen_backward(f"varlen backward {dtype} {lengths} causal={causal} {scores} "
                          f"deterministic={deterministic} {offsets_on}", DTYPES[dtype],
                          LENGTHS[lengths], causal, scores, deterministic=deterministic,
                          offsets_on=offsets_on)


@pytest.mark.parametrize("d", [96, 128, 256, 59, 111])
@pytest.mark.parametrize("scores", BACKWARD_SCORES, ids=lambda s: f"w{s[0][0]}_{s[0][1]}c{s[1]}")
def test_varlen_backward_head_dims_and_grouped_heads(d, scores):
    """The packed backward at the other head dims (fa3 to 128, fa2-tc past it; 59 and 111 padded
    to 64 and 112), 8 query heads on 2 K/V heads (dK and dV summed over each group)."""
    check_varlen_backward(f"varlen backward d={d} {scores}", torch.bfloat16, CROSS, True,
                          scores, d=d, heads=8)


def test_varlen_backward_of_more_sequences_than_one_launch_takes():
    """300 sequences (one launch takes 255): each sequence's gradients, in both launches."""
    rng = random.Random(300)
    lengths = [(n, n) for n in (rng.randrange(0, 40) for _ in range(300))]
    check_varlen_backward("varlen backward 300 sequences", torch.bfloat16, lengths, True,
                          ((-1, -1), 0.0))
    check_varlen_backward("varlen backward 300 sequences deterministic", torch.float16, lengths,
                          False, ((-1, -1), 0.0), deterministic=True)


def check_varlen_backward(test, torch_dtype, lengths, causal, scores, d=64, heads=4,
                          deterministic=False, offsets_on=DEVICE, alibi=None):
    window, softcap = scores
    q, k, v, cu_q, cu_k = packed_inputs(test, lengths, heads, 2, d, torch_dtype)
    for t in (q, k, v):
        t.requires_grad_(True)
    o, _ = run(q, k, v, cu_q, cu_k, causal=causal, window_size=window, softcap=softcap,
               deterministic=deterministic, offsets_device=offsets_on, alibi_slopes=alibi)
    win = None if window == (-1, -1) else window
    d_o = randn(o.shape, torch_dtype, generator(seed_of(test) + 1))
    o.backward(d_o)
    plan = flash_attn_rs.last_backward_plan()
    assert "_varlen" in plan, plan
    if deterministic or d > 128:
        assert plan.startswith("fa2-tc backward"), plan
    elif torch.cuda.get_device_capability(DEVICE) == (9, 0):
        assert plan.startswith("fa3 backward"), plan

    def sdpa(t):
        return t.detach().to(torch.float64).transpose(0, 1)[None]

    scale = d**-0.5
    for sequence, (q0, q1, k0, k1) in enumerate(zip(cu_q, cu_q[1:], cu_k, cu_k[1:])):
        slopes = alibi if alibi is None or alibi.dim() == 1 else alibi[sequence]
        if q1 == q0 or k1 == k0:
            assert torch.count_nonzero(q.grad[q0:q1]) == 0
            assert torch.count_nonzero(k.grad[k0:k1]) == 0 and torch.count_nonzero(v.grad[k0:k1]) == 0
            continue
        parts = [sdpa(t[a:b]) for t, (a, b) in zip((q, k, v, d_o), ((q0, q1), (k0, k1), (k0, k1),
                                                                      (q0, q1)))]
        exact = ref.gradients64(*parts, causal, scale, win, softcap, slopes)
        in_dtype = ref.backward_in_dtype(*parts, causal, scale, torch_dtype, win, softcap,
                                         slopes)
        for name, grad, span, want, base in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad),
                                                ((q0, q1), (k0, k1), (k0, k1)), exact, in_dtype):
            got = grad[span[0]:span[1]].to(torch.float64).transpose(0, 1)[None]
            assert_within(f"{test} [{q0}:{q1}]", name, got, want,
                          ref.backward_bound(want, base, torch_dtype), plan)
    if deterministic:
        # The same bits on a second run.
        first = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        o, _ = run(q, k, v, cu_q, cu_k, causal=causal, window_size=window, softcap=softcap,
                   deterministic=True, offsets_device=offsets_on, alibi_slopes=alibi)
        o.backward(d_o)
        for before, t in zip(first, (q, k, v)):
            assert torch.equal(before, t.grad)


@pytest.mark.parametrize("cu_q, max_q, name", [
    ([0, 1, 131, 130, 207, 507, 571], 300, "cu_seqlens_q"),  # decreasing
    ([0, 1, 131, 131, 208, 508, 571], 300, "cu_seqlens_q"),  # last != q's rows (572)
    ([0, 1, 131, 131, 208, 508, 572], 299, "max_seqlen_q"),  # below the longest (300)
])
def test_varlen_bad_cpu_offsets_raise_before_anything_launches(cu_q, max_q, name):
    """Offsets on the CPU are read and checked on the host."""
    q, k, v, _, cu_k = packed_inputs("varlen bad", SELF, 2, 2, 64, torch.bfloat16)
    flash_attn_rs.flash_attn_varlen_func(q[:1], k[:1], v[:1], *[torch.tensor([0, 1])] * 2, 1, 1)
    before = flash_attn_rs.last_plan()
    cu_seqlens_q = torch.tensor(cu_q, dtype=torch.int32)
    cu_seqlens_k = torch.tensor(cu_k, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"`{name}`"):
        flash_attn_rs.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, 300)
    assert flash_attn_rs.last_plan() == before, "a plan ran"


def test_varlen_wrong_cuda_offsets_run_inside_the_tensors():
    """Offsets on the GPU are not read on the host: wrong ones (decreasing, past the rows, longer
    than the bound) run without a fault, forward and backward, and the sequences they name right
    are right (sequence 0 here; the others are clamped into the tensors and cut to the bounds)."""
    q, k, v, cu_q, cu_k = packed_inputs("varlen wrong", SELF, 2, 2, 64, torch.bfloat16)
    for t in (q, k, v):
        t.requires_grad_(True)
    wrong = [0, 1, 100_000, 120, 2**31 - 1, 5, 572]
    for deterministic in (False, True):
        offsets = [torch.tensor(c, dtype=torch.int32, device=DEVICE) for c in (wrong, wrong)]
        o = flash_attn_rs.flash_attn_varlen_func(q, k, v, *offsets, 64, 64, causal=True,
                                                 deterministic=deterministic)
        o.backward(torch.ones_like(o))
        torch.cuda.synchronize()
        assert torch.isfinite(o[:1]).all()
        # Sequence 0 is one query on one key: O is V's first row.
        assert torch.equal(o[0], v[0].detach())
        for t in (q, k, v):
            t.grad = None


def test_varlen_cuda_offsets_wait_for_nothing():
    """Offsets on the GPU stay there: a forward and a backward return while the stream is still
    busy with earlier work (a 1e9-cycle sleep kernel, ~0.5 s), where a copy of the offsets to the
    host (``tolist``) would wait for it. Both are right afterwards."""
    q, k, v, cu_q, cu_k = packed_inputs("varlen no sync", SELF, 2, 2, 64, torch.bfloat16)
    for t in (q, k, v):
        t.requires_grad_(True)
    cu_seqlens = [torch.tensor(c, dtype=torch.int32, device=DEVICE) for c in (cu_q, cu_k)]
    longest = [max(b - a for a, b in zip(c, c[1:])) for c in (cu_q, cu_k)]
    for _ in range(2):  # the first call loads the modules and makes the plans
        o = flash_attn_rs.flash_attn_varlen_func(q, k, v, *cu_seqlens, *longest)
        torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    torch.cuda.synchronize()
    busy = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    busy[0].record()
    torch.cuda._sleep(1_000_000_000)
    busy[1].record()
    start = time.perf_counter()
    o, lse = flash_attn_rs.flash_attn_varlen_func(q, k, v, *cu_seqlens, *longest,
                                                  return_lse=True)
    forward_s = time.perf_counter() - start
    start = time.perf_counter()
    grads = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    backward_s = time.perf_counter() - start
    waited = busy[1].query()
    torch.cuda.synchronize()
    sleep_s = busy[0].elapsed_time(busy[1]) / 1e3
    assert not waited, "the sleep had ended before the calls returned"
    assert forward_s + backward_s < sleep_s / 4, (forward_s, backward_s, sleep_s)
    check_packed("varlen no sync", q, k, v, cu_q, cu_k, o, lse, False)
    assert all(torch.isfinite(g).all() for g in grads)


def test_varlen_cuda_graph_capture_is_refused_before_the_offsets_are_read():
    """Inside a capture the call raises RuntimeError before it launches anything; the capture
    stays valid and the GPU usable and right."""
    q, k, v, cu_q, cu_k = packed_inputs("varlen capture", SELF, 2, 2, 64, torch.bfloat16)
    run(q, k, v, cu_q, cu_k)  # the device is open: only the capture can be refused now
    cu_seqlens = [torch.tensor(c, dtype=torch.int32, device=DEVICE) for c in (cu_q, cu_k)]
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="capturing a CUDA graph"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            flash_attn_rs.flash_attn_varlen_func(q, k, v, *cu_seqlens, 300, 300)
    o, lse = run(q, k, v, cu_q, cu_k)
    check_packed("varlen after capture", q, k, v, cu_q, cu_k, o, lse, False)


@pytest.mark.parametrize("lengths, algorithm, deterministic, offsets_on",
                         [(CROSS, None, False, "cuda"), (SELF, "fa2-tc", False, "cpu"),
                          (CROSS, None, True, "cuda"), ("many", None, False, "cuda")],
                         ids=["cross-auto", "self-fa2-tc", "cross-deterministic",
                              "300-sequences"])
def test_varlen_dropout(lengths, algorithm, deterministic, offsets_on):
    """dropout_p on packed sequences: each sequence's mask drawn for its own rows, keys and global
    heads (sequence * heads + head; across launches too, 300 sequences), in the forward and the
    backward alike. O and each sequence's dQ, dK, dV against the float64 reference dropping by
    the mask S_dmask's sign gives."""
    if lengths == "many":
        draw = random.Random(303)
        lengths = [(n, n) for n in (draw.randrange(0, 40) for _ in range(300))]
    p, heads, heads_kv, d, dtype = 0.17, 4, 2, 64, torch.bfloat16
    test = f"varlen dropout {algorithm} det={deterministic} {len(lengths)} sequences"
    q, k, v, cu_q, cu_k = packed_inputs(test, lengths, heads, heads_kv, d, dtype)
    for t in (q, k, v):
        t.requires_grad_(True)
    cu_seqlens = [torch.tensor(c, dtype=torch.int32, device=offsets_on) for c in (cu_q, cu_k)]
    longest = [max(b - a for a, b in zip(c, c[1:])) for c in (cu_q, cu_k)]
    o, _, s_dmask = flash_attn_rs.flash_attn_varlen_func(
        q, k, v, *cu_seqlens, *longest, p, causal=True, algorithm=algorithm,
        deterministic=deterministic, return_attn_probs=True)
    plan = flash_attn_rs.last_plan()
    assert "_varlen_local" in plan, plan
    d_o = randn(o.shape, dtype, generator(seed_of(test) + 1))
    o.backward(d_o)
    backward_plan = flash_attn_rs.last_backward_plan()
    scale, keep_scale = d**-0.5, flash_attn_rs._dropout.keep_scale(p)
    kept = visible = 0
    for b, (q0, q1, k0, k1) in enumerate(zip(cu_q, cu_q[1:], cu_k, cu_k[1:])):
        if q1 == q0 or k1 == k0:
            continue
        keep = (s_dmask[b, :, :q1 - q0, :k1 - k0] >= 0)[None]
        mask = ref.window_mask(q1 - q0, k1 - k0, True, None, "cuda")
        kept, visible = kept + (keep[0] & mask).sum().item(), visible + mask.sum().item() * heads
        dropout = (keep, keep_scale)
        parts = [t.detach()[a:e].double().transpose(0, 1)[None]
                 for t, (a, e) in zip((q, k, v, d_o), ((q0, q1), (k0, k1), (k0, k1), (q0, q1)))]
        name = f"{test} sequence {b}"
        o_ref, _ = ref.attention64(*parts[:3], True, scale, dropout=dropout)
        o_dtype = ref.attention_in_dtype(*parts[:3], True, scale, dtype, dropout=dropout)
        got = o.detach()[q0:q1].transpose(0, 1)[None]
        assert_within(name, "o", got, o_ref, ref.forward_bound(o_ref, o_dtype, dtype), plan)
        exact = ref.gradients64(*parts, True, scale, dropout=dropout)
        in_dtype = ref.backward_in_dtype(*parts, True, scale, dtype, dropout=dropout)
        for grad_name, grad, (a, e), want, base in zip(
                ("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ((q0, q1), (k0, k1), (k0, k1)),
                exact, in_dtype):
            assert_within(name, grad_name, grad[a:e].transpose(0, 1)[None], want,
                          ref.backward_bound(want, base, dtype), backward_plan)
    assert abs(1 - kept / visible - p) <= 0.01, (kept, visible)
