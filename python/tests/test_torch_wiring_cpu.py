"""The PyTorch-facing wiring on the CPU, with the launches replaced by float64 math: the autograd
Function (what it saves, what backward returns, which layout each tensor is in), the varlen call
(the native checks on what reaches its launch, each sequence's result, its refused backward), the
transformers registration (layouts, grouped-query heads, scaling, the mask and dropout refusals),
the tolerance rule's slack, and the example's agreement check. The kernels themselves are the GPU
tests' job (test_gpu_*.py). Skipped where PyTorch (or transformers) is not installed."""

import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch")

import reference as ref  # noqa: E402

import flash_attn_rs  # noqa: E402
from flash_attn_rs import _checks, _dropout, _launch, _native  # noqa: E402

EXAMPLE = pathlib.Path(__file__).parent.parent / "examples" / "01_train_tiny_llama.py"


def to_sdpa(t, layout):
    return t.transpose(1, 2) if layout == _checks.FLASH_ATTN else t


def dropout_of(dropout, batch, heads, seqlen_q, seqlen_k, first_sequence=0):
    """The reference's ``(keep, scale)`` of a launch's dropout (p, seed, offset), None without:
    the kernels' mask (``_dropout.keep_mask``) for ``batch`` sequences from ``first_sequence``."""
    if dropout is None:
        return None
    p, seed, offset = dropout
    heads_global = range(first_sequence * heads, (first_sequence + batch) * heads)
    keep = _dropout.keep_mask(p, seed, offset, heads_global, seqlen_q, seqlen_k, "cpu")
    return keep.reshape(batch, heads, seqlen_q, seqlen_k), _dropout.keep_scale(p)


def fake_forward(q, k, v, layout, dtype, softmax_scale, causal, algorithm, window=None,
                 softcap=0.0, packed=None, alibi_slopes=None, dropout=None):
    """The forward launch's contract, in float64 math: O in q's shape and dtype, L f32."""
    assert dtype == _checks.DTYPES[str(q.dtype)]
    if packed is not None:
        assert layout == _checks.PACKED
        return fake_forward_packed(q, k, v, *packed, dtype, softmax_scale, causal, algorithm,
                                   window, softcap, alibi_slopes, dropout)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    q64, k64, v64 = (to_sdpa(t, layout).detach().double() for t in (q, k, v))
    (b, h, sq, _), sk = q64.shape, k64.shape[2]
    o, lse = ref.attention64(q64, k64, v64, causal, scale, window, softcap, alibi_slopes,
                             dropout_of(dropout, b, h, sq, sk))
    _launch.plans["forward"] = f"fake {algorithm}"
    return to_sdpa(o, layout).to(q.dtype).contiguous(), lse.float()


def fake_backward(q, k, v, o, lse, d_o, layout, dtype, softmax_scale, causal, window=None,
                  softcap=0.0, deterministic=False, alibi_slopes=None, dropout=None):
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    q64, k64, v64, d_o64 = (to_sdpa(t, layout).double() for t in (q, k, v, d_o))
    (b, h, sq, _), sk = q64.shape, k64.shape[2]
    dropout = dropout_of(dropout, b, h, sq, sk)
    o64, lse64 = ref.attention64(q64, k64, v64, causal, scale, window, softcap, alibi_slopes,
                                 dropout)
    assert torch.allclose(to_sdpa(o, layout).double(), o64, atol=1e-2), "saved O is not O"
    finite = torch.isfinite(lse64)
    assert torch.equal(torch.isfinite(lse), finite), "saved L is not L"
    assert torch.allclose(lse.double()[finite], lse64[finite], atol=1e-4), "saved L is not L"
    # By formula: this runs inside the backward operator, where autograd records nothing.
    grads = ref.gradients64_by_formula(q64, k64, v64, d_o64, causal, scale, window, softcap,
                                       alibi_slopes, dropout)
    _launch.plans["backward"] = "fake deterministic backward" if deterministic else \
        "fake backward"
    # Into tensors allocated as the launch allocates them (`empty_like` its input), so the
    # strides are the real operator's.
    return [torch.empty_like(t).copy_(to_sdpa(g, layout)) for g, t in zip(grads, (q, k, v))]


def fake_forward_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlens, dtype, softmax_scale,
                        causal, algorithm, window, softcap, alibi_slopes=None, dropout=None):
    """The packed launch's contract: the native forward's real checks on what the real launch
    passes it (the same keywords and statistics; without a device nothing launches), then float64
    math sequence by sequence: O in q's shape and dtype, L f32 (heads, total_q)."""
    total_q, heads, d = q.shape
    o = torch.empty(q.shape, dtype=q.dtype)
    stats = _launch.statistics(torch, q, _checks.PACKED, algorithm)
    assert [s.shape for s in stats] == [(1, heads, total_q)]
    packed = (cu_seqlens_q, cu_seqlens_k, max_seqlens)
    arguments = _launch.forward_arguments(q, k, v, o, stats, _checks.PACKED, dtype, softmax_scale,
                                          causal, algorithm, window, softcap, packed,
                                          alibi_slopes, dropout)
    assert _native.forward(**arguments) is None
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    o64, lse64 = ref.packed_attention64(
        *(t.detach().double() for t in (q, k, v)), arguments["cu_seqlens_q"],
        arguments["cu_seqlens_k"], causal, scale, window, softcap, alibi_slopes,
        dropout=lambda b, sq, sk: dropout_of(dropout, 1, heads, sq, sk, first_sequence=b),
    )
    _launch.plans["forward"] = f"fake packed {algorithm}"
    return o64.to(q.dtype), lse64.float()


def fake_varlen_backward(q, k, v, o, lse, d_o, cu_seqlens_q, cu_seqlens_k, max_seqlens, dtype,
                         softmax_scale, causal, window=None, softcap=0.0, deterministic=False,
                         alibi_slopes=None, dropout=None):
    """The packed backward launch's contract: the native backward's real checks on what the real
    launch passes it (without a device nothing launches), then float64 gradients by formula
    sequence by sequence into tensors allocated as the launch allocates them; zeros for a
    sequence without queries or keys."""
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    arguments = _launch.varlen_backward_arguments(
        q, k, v, o, lse, d_o, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlens, dtype,
        softmax_scale, causal, window, softcap, deterministic, alibi_slopes, dropout)
    assert _native.backward(**arguments) is None
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    for grad in (dq, dk, dv):
        grad.zero_()
    cu_q, cu_k = arguments["cu_seqlens_q"], arguments["cu_seqlens_k"]
    for sequence, (q0, q1, k0, k1) in enumerate(zip(cu_q, cu_q[1:], cu_k, cu_k[1:])):
        if q1 == q0 or k1 == k0:
            continue
        parts = [t.detach()[a:b].double().transpose(0, 1)[None] for t, (a, b) in
                 zip((q, k, v, d_o), ((q0, q1), (k0, k1), (k0, k1), (q0, q1)))]
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 \
            else alibi_slopes[sequence]
        grads = ref.gradients64_by_formula(
            *parts, causal, scale, window, softcap, slopes,
            dropout_of(dropout, 1, q.shape[1], q1 - q0, k1 - k0, first_sequence=sequence))
        for whole, part, (a, b) in zip((dq, dk, dv), grads, ((q0, q1), (k0, k1), (k0, k1))):
            whole[a:b] = part[0].transpose(0, 1).to(whole.dtype)
    _launch.plans["backward"] = "fake packed deterministic backward" if deterministic else \
        "fake packed backward"
    return dq, dk, dv


@pytest.fixture
def cpu_launches(monkeypatch):
    monkeypatch.setattr(_checks, "DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(_launch, "forward", fake_forward)
    monkeypatch.setattr(_launch, "backward", fake_backward)
    monkeypatch.setattr(_launch, "varlen_backward", fake_varlen_backward)


@pytest.mark.parametrize("layout", ["flash", "sdpa"])
def test_autograd_function_gradients(cpu_launches, layout):
    torch.manual_seed(0)
    b, h, sq, sk, d = 2, 3, 7, 11, 8
    shape_q, shape_kv = ((b, sq, h, d), (b, sk, h, d)) if layout == "flash" else \
        ((b, h, sq, d), (b, h, sk, d))
    q, k, v = (torch.randn(s, dtype=torch.float64, requires_grad=True)
               for s in (shape_q, shape_kv, shape_kv))
    # float64 is no kernel dtype: the fake accepts the call only through the wiring's own checks.
    with pytest.raises(TypeError, match="float64"):
        flash_attn_rs.flash_attn_func(q, k, v)
    q, k, v = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    if layout == "flash":
        o, lse = flash_attn_rs.flash_attn_func(q, k, v, causal=True, return_lse=True,
                                               softmax_scale=0.5)
        assert lse.shape == (b, h, sq) and not lse.requires_grad
        scale, view = 0.5, (lambda t: t.transpose(1, 2))
    else:
        o = flash_attn_rs.scaled_dot_product_attention(q, k, v, is_causal=True)
        scale, view = d**-0.5, (lambda t: t)
    assert o.requires_grad and o.shape == q.shape
    d_o = torch.randn_like(o)
    o.backward(d_o)
    assert flash_attn_rs.last_backward_plan() == "fake backward"
    q64, k64, v64, d_o64 = (view(t).detach().double() for t in (q, k, v, d_o))
    exact = ref.gradients64(q64, k64, v64, d_o64, True, scale)
    for t, want in zip((q, k, v), exact):
        assert torch.allclose(view(t.grad).double(), want, atol=1e-5)


def llama(attention, heads=4, kv_heads=2):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=heads * 16, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.set_attn_implementation(attention)
    return model


def test_transformers_registration_matches_sdpa(cpu_launches):
    """Grouped-query Llama: our attention's logits and gradients equal SDPA's (f32 math here)."""
    from flash_attn_rs.transformers_attention import register

    ours = llama(register())
    sdpa = llama("sdpa")
    ids = torch.randint(0, 97, (2, 19), generator=torch.Generator().manual_seed(1))
    out_ours, out_sdpa = ours(input_ids=ids, labels=ids), sdpa(input_ids=ids, labels=ids)
    assert flash_attn_rs.last_plan() == "fake None"
    assert torch.allclose(out_ours.logits, out_sdpa.logits, atol=1e-5)
    out_ours.loss.backward()
    out_sdpa.loss.backward()
    for (name, p), q in zip(ours.named_parameters(), sdpa.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), name


def test_transformers_padding_mask_is_refused(cpu_launches):
    from flash_attn_rs.transformers_attention import register

    model = llama(register(algorithm="fa2"))
    ids = torch.randint(0, 97, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    model(input_ids=ids, attention_mask=mask)  # no padding: fine
    assert flash_attn_rs.last_plan() == "fake fa2"
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="attention_mask.*no mask"):
        model(input_ids=ids, attention_mask=mask)


def gemma2(attention):
    """A Gemma 2 with random weights: sliding-window layers (window 6) between full ones, logit
    soft-capping (5.0), grouped K/V heads."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma2Config(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        sliding_window=6, attn_logit_softcapping=5.0, query_pre_attn_scalar=16,
    )
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config)
    model.set_attn_implementation(attention)
    return model


def test_transformers_gemma2_window_and_softcap_match_eager(cpu_launches):
    """Gemma 2 through the registration: each sliding layer's window and the logit soft-cap
    reach the kernels, and the logits and every gradient equal transformers' eager attention's
    (the reference implementation for Gemma 2; SDPA takes no soft-cap)."""
    from flash_attn_rs.transformers_attention import register

    ours, eager = gemma2(register()), gemma2("eager")
    ids = torch.randint(0, 97, (2, 19), generator=torch.Generator().manual_seed(3))
    out_ours, out_eager = ours(input_ids=ids, labels=ids), eager(input_ids=ids, labels=ids)
    assert torch.allclose(out_ours.logits, out_eager.logits, atol=1e-5)
    out_ours.loss.backward()
    out_eager.loss.backward()
    for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), name
    # Without the window and the cap the logits differ: both were taken.
    plain = gemma2(register())
    for layer in plain.model.layers:
        layer.self_attn.sliding_window, layer.self_attn.attn_logit_softcapping = None, None
    logits = plain(input_ids=ids, use_cache=False).logits
    assert not torch.allclose(logits, out_eager.logits, atol=1e-3)


# A row of three packed documents (5, 9 and 5 tokens).
DOCUMENTS = [5, 9, 5]


@pytest.mark.parametrize("how", ["position_ids", "flash_kwargs"])
def test_transformers_packed_documents_attend_within_each(cpu_launches, how):
    """Packed documents in one row (DataCollatorWithFlattening's batch; bf16, as packed batches
    run on the tensor cores): with position_ids that restart at 0, or with transformers' four
    flash-attention kwargs, each document's logits are the model's on that document alone, and
    the gradients of the packed row's sum are the sum of theirs."""
    from flash_attn_rs.transformers_attention import register

    ours, alone_model = (llama(register()).to(torch.bfloat16) for _ in range(2))
    ids = torch.randint(0, 97, (1, sum(DOCUMENTS)), generator=torch.Generator().manual_seed(4))
    positions = torch.cat([torch.arange(n) for n in DOCUMENTS])[None]
    kwargs = {"position_ids": positions}
    if how == "flash_kwargs":
        cu = torch.tensor([0, *torch.tensor(DOCUMENTS).cumsum(0).tolist()], dtype=torch.int32)
        kwargs |= dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(DOCUMENTS),
                       max_length_k=max(DOCUMENTS))
    logits = ours(input_ids=ids, **kwargs).logits
    assert flash_attn_rs.last_plan() == "fake packed None"
    start = 0
    for n in DOCUMENTS:
        alone = alone_model(input_ids=ids[:, start:start + n]).logits
        assert flash_attn_rs.last_plan() == "fake None"
        assert torch.allclose(logits[:, start:start + n].float(), alone.float(), atol=2e-2)
        alone.float().sum().backward()
        start += n
    logits.float().sum().backward()
    for (name, p), q in zip(ours.named_parameters(), alone_model.parameters()):
        scale = q.grad.float().abs().max().item()
        assert torch.allclose(p.grad.float(), q.grad.float(), atol=2e-2 * scale), name


def test_transformers_one_run_of_positions_is_one_sequence(cpu_launches):
    """position_ids of one run (a whole sequence, or a prefill that starts past 0) are the dense
    call, not packed documents; only three of the four flash kwargs is refused by name."""
    from flash_attn_rs.transformers_attention import register

    model = llama(register())
    ids = torch.randint(0, 97, (1, 12))
    model(input_ids=ids, position_ids=torch.arange(12)[None])
    assert flash_attn_rs.last_plan() == "fake None"
    model(input_ids=ids, position_ids=torch.arange(7, 19)[None])
    assert flash_attn_rs.last_plan() == "fake None"
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    with pytest.raises(ValueError, match="max_length_k"):
        model(input_ids=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=7)


def test_example_agreement_runs(cpu_launches):
    """The example's agreement step on a tiny model (its own CLI defaults otherwise)."""
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from flash_attn_rs.transformers_attention import register

    args = example.argparse.Namespace(
        vocab=61, heads=2, head_dim=16, layers=2, seqlen=24, max_seqlen=64, batch=2, seed=0,
        lr=1e-2,
    )
    lines, passed = example.agreement(args, "cpu", register())
    text = "\n".join(lines)
    assert passed, text
    assert "loss after one SGD step" in text and "FAIL" not in text


def test_backward_slack_is_one_unit_in_the_last_place_of_the_largest_gradient():
    """The reference's absolute slack matches the Rust rule (`DType::unit_in_last_place`)."""
    assert ref.unit_in_last_place(torch.float16, 1.0) == 2.0**-10
    assert ref.unit_in_last_place(torch.float16, 1.999) == 2.0**-10
    assert ref.unit_in_last_place(torch.bfloat16, 3.0) == 2.0**-6
    assert ref.unit_in_last_place(torch.float32, 0.5) == 2.0**-24
    assert ref.unit_in_last_place(torch.bfloat16, 0.0) == 2.0**-7
    g = torch.tensor([0.25, -3.0], dtype=torch.float64)
    assert ref.backward_bound(g, g.clone(), torch.bfloat16) == 2.0**-6


def test_window_and_softcap_reach_the_forward_and_the_backward(cpu_launches):
    """flash_attn_func's window_size and softcap: the forward's O is the windowed, capped one;
    the backward receives both, and its gradients are those of the windowed, capped attention
    (autograd through the float64 reference), not the plain causal one's."""
    torch.manual_seed(1)
    b, h, sq, sk, d = 1, 2, 9, 12, 8
    q = torch.randn(b, sq, h, d, requires_grad=True)
    k, v = (torch.randn(b, sk, h, d, requires_grad=True) for _ in range(2))
    o, lse = flash_attn_rs.flash_attn_func(q, k, v, causal=True, window_size=(3, 0), softcap=2.0,
                                           return_lse=True)
    q64, k64, v64 = (t.detach().transpose(1, 2).double() for t in (q, k, v))
    want, want_lse = ref.attention64(q64, k64, v64, True, d**-0.5, (3, 0), 2.0)
    assert torch.allclose(o.transpose(1, 2).double(), want, atol=1e-5)
    assert torch.allclose(lse.double(), want_lse, atol=1e-5)
    # The window hides keys: not the plain causal result.
    plain, _ = ref.attention64(q64, k64, v64, True, d**-0.5)
    assert not torch.allclose(want, plain, atol=1e-3)
    d_o = torch.randn_like(o)
    o.backward(d_o)
    d_o64 = d_o.transpose(1, 2).double()
    want = ref.gradients64(q64, k64, v64, d_o64, True, d**-0.5, (3, 0), 2.0)
    plain = ref.gradients64(q64, k64, v64, d_o64, True, d**-0.5)
    for leaf, w, p in zip((q, k, v), want, plain):
        got = leaf.grad.transpose(1, 2).double()
        assert torch.allclose(got, w, atol=1e-5)
        assert not torch.allclose(got, p, atol=1e-3)
        leaf.grad = None
    # (-1, -1) and 0 are no window and no capping: the plain call, whose backward runs.
    o = flash_attn_rs.flash_attn_func(q, k, v, causal=True, window_size=(-1, -1), softcap=0)
    o.sum().backward()
    assert q.grad is not None


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(window_size=(-2, 0)), ValueError, "window_size"),
    (dict(window_size=(1, 2, 3)), TypeError, "window_size"),
    (dict(window_size=(1.0, 2)), TypeError, "window_size"),
    (dict(window_size=(True, 2)), TypeError, "window_size"),
    (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(softcap=float("inf")), ValueError, "softcap"),
    (dict(softcap="3"), TypeError, "softcap"),
])
def test_bad_window_or_softcap_is_named(cpu_launches, kwargs, error, match):
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(error, match=match):
        flash_attn_rs.flash_attn_func(q, q, q, **kwargs)


# -- flash_attn_varlen_func ------------------------------------------------------------------

# (query, key) lengths of a packed batch: uneven, a sequence without keys, one without queries,
# and seqlen_q > seqlen_k (with causal, its first rows see no key).
LENGTHS = [(5, 9), (0, 4), (12, 12), (3, 0), (7, 2)]


def packed_batch(lengths=LENGTHS, heads=4, heads_kv=2, d=8, dtype=torch.bfloat16,
                 offsets_dtype=torch.int32):
    torch.manual_seed(2)
    cu_q, cu_k = ([0, *torch.tensor(n).cumsum(0).tolist()] for n in zip(*lengths))
    q = torch.randn(cu_q[-1], heads, d).to(dtype)
    k, v = (torch.randn(cu_k[-1], heads_kv, d).to(dtype) for _ in range(2))
    offsets = [torch.tensor(c, dtype=offsets_dtype) for c in (cu_q, cu_k)]
    maxes = [max(n) for n in zip(*lengths)]
    return q, k, v, *offsets, *maxes


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("scores", [((-1, -1), 0.0), ((2, 1), 3.0)], ids=["plain", "w2_1c3"])
def test_varlen_is_flash_attn_func_on_each_sequence(cpu_launches, causal, scores):
    """Each sequence's O and L are the dense call's on that sequence alone (its own mask corner,
    grouped K/V heads); a sequence without keys gets O = 0 and L = -inf; L is (heads, total_q)."""
    window, softcap = scores
    q, k, v, cu_q, cu_k, max_q, max_k = packed_batch()
    o, lse = flash_attn_rs.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window, softcap=softcap,
        return_lse=True,
    )
    assert flash_attn_rs.last_plan() == "fake packed None"
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]):
        if q1 == q0:
            continue
        if k1 == k0:
            assert torch.count_nonzero(o[q0:q1]) == 0
            assert torch.all(lse[:, q0:q1] == float("-inf"))
            continue
        want, want_lse = flash_attn_rs.flash_attn_func(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal, window_size=window,
            softcap=softcap, return_lse=True,
        )
        assert torch.allclose(o[q0:q1].float(), want[0].float(), atol=1e-2)
        assert ref.logsumexp_error(lse[:, q0:q1], want_lse[0].double()) <= 1e-5
    # return_lse=False returns O alone; int64 offsets (torch.cumsum's) are taken too.
    o_only = flash_attn_rs.flash_attn_varlen_func(q, k, v, torch.tensor(cu_q), torch.tensor(cu_k),
                                                  max_q, max_k, causal=causal,
                                                  window_size=window, softcap=softcap)
    assert torch.equal(o_only, o)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_backward_is_each_sequences_own(cpu_launches, causal):
    """dQ, dK, dV of a packed batch are each sequence's own gradients (grouped K/V heads summed,
    zeros for a sequence without keys or without queries); under no_grad there is no graph."""
    q, k, v, cu_q, cu_k, max_q, max_k = packed_batch()
    for t in (q, k, v):
        t.requires_grad_(True)
    o = flash_attn_rs.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                             deterministic=True)
    d_o = torch.randn_like(o)
    o.backward(d_o)
    assert flash_attn_rs.last_backward_plan() == "fake packed deterministic backward"
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]):
        if q1 == q0 or k1 == k0:
            assert torch.count_nonzero(q.grad[q0:q1]) == 0
            assert torch.count_nonzero(k.grad[k0:k1]) == 0
            continue
        parts = [t.detach()[a:b].double().transpose(0, 1)[None] for t, (a, b) in
                 zip((q, k, v, d_o), ((q0, q1), (k0, k1), (k0, k1), (q0, q1)))]
        want = ref.gradients64(*parts, causal, q.shape[-1] ** -0.5)
        for grad, span, exact in zip((q.grad, k.grad, v.grad), ((q0, q1), (k0, k1), (k0, k1)),
                                     want):
            got = grad[span[0]:span[1]].double().transpose(0, 1)[None]
            assert torch.allclose(got, exact, atol=2e-2, rtol=1e-2)  # bf16 gradients
    with torch.no_grad():
        o = flash_attn_rs.flash_attn_varlen_func(q, k, v, torch.tensor(cu_q), torch.tensor(cu_k),
                                                 max_q, max_k)
    assert o.grad_fn is None and not o.requires_grad


@pytest.mark.parametrize("edit, error, match", [
    (lambda a: a.update(cu_seqlens_q=torch.tensor([0, 5, 4, 27, 30, 27], dtype=torch.int32)),
     ValueError, "`cu_seqlens_q`.*never decrease"),
    (lambda a: a.update(cu_seqlens_q=torch.tensor([1, 5, 5, 17, 20, 27], dtype=torch.int32)),
     ValueError, "`cu_seqlens_q`.*starting at 0"),
    (lambda a: a.update(cu_seqlens_k=torch.tensor([0, 9, 13, 25, 25, 26], dtype=torch.int32)),
     ValueError, "`cu_seqlens_k`.*last offset"),
    (lambda a: a.update(cu_seqlens_k=torch.tensor([0.0, 27.0])), TypeError,
     "^cu_seqlens_k has dtype torch.float32"),
    (lambda a: a.update(cu_seqlens_q=[0, 27]), TypeError, "^cu_seqlens_q must be a torch.Tensor"),
    (lambda a: a.update(max_seqlen_q=11), ValueError, "`max_seqlen_q`.*longest"),
    (lambda a: a.update(max_seqlen_k=12.0), TypeError, "^max_seqlen_k must be an int"),
    (lambda a: a.update(max_seqlen_k=-1), ValueError, "^max_seqlen_k is -1"),
    (lambda a: a.update(algorithm="fa2"), ValueError, "`algorithm`.*packed"),
    (lambda a: a.update(q=a["q"].float(), k=a["k"].float(), v=a["v"].float()), TypeError,
     "`dtype`.*f16 or bf16"),
    (lambda a: a.update(k=a["k"][:, :1].expand(-1, 3, -1)), ValueError, "^k .* must divide"),
    (lambda a: a.update(q=a["q"][None]), ValueError, "^q has shape .*; expected 3 dims"),
    (lambda a: a.update(window_size=(-2, 0)), ValueError, "window_size"),
])
def test_varlen_bad_arguments_are_named(cpu_launches, edit, error, match):
    q, k, v, cu_q, cu_k, max_q, max_k = packed_batch()
    arguments = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                     max_seqlen_k=max_k)
    edit(arguments)
    with pytest.raises(error, match=match):
        flash_attn_rs.flash_attn_varlen_func(**arguments)


# -- flash-attn's signatures and packed forms ----------------------------------------------


def test_flash_attn_positional_call_takes_dropout_third(cpu_launches):
    """flash-attn's own tests call ``flash_attn_func(q, k, v, dropout_p, causal=...)``: 0.0 there
    is the dropout, not the softmax scale; return_attn_probs gives (out, softmax_lse, None)."""
    torch.manual_seed(3)
    b, h, s_q, s_k, d = 2, 3, 6, 9, 8
    q = torch.randn(b, s_q, h, d)
    k, v = (torch.randn(b, s_k, h, d) for _ in range(2))
    out, lse, s_dmask = flash_attn_rs.flash_attn_func(q, k, v, 0.0, None, True,
                                                      return_attn_probs=True)
    q64, k64, v64 = (t.transpose(1, 2).double() for t in (q, k, v))
    want, want_lse = ref.attention64(q64, k64, v64, True, d**-0.5)
    assert torch.allclose(out.transpose(1, 2).double(), want, atol=1e-5)
    assert lse.shape == (b, h, s_q) and torch.allclose(lse.double(), want_lse, atol=1e-5)
    assert s_dmask is None
    # Positionally all the way: (dropout_p, softmax_scale, causal, window_size, softcap,
    # alibi_slopes, deterministic, return_attn_probs).
    out2, _, _ = flash_attn_rs.flash_attn_func(q, k, v, 0.0, 0.25, False, (-1, -1), 0.0, None,
                                               False, True)
    want2, _ = ref.attention64(q64, k64, v64, False, 0.25)
    assert torch.allclose(out2.transpose(1, 2).double(), want2, atol=1e-5)


def test_deterministic_reaches_the_backward(cpu_launches):
    q = torch.randn(1, 5, 2, 8, requires_grad=True)
    flash_attn_rs.flash_attn_func(q, q, q, causal=True, deterministic=True).sum().backward()
    assert flash_attn_rs.last_backward_plan() == "fake deterministic backward"
    flash_attn_rs.flash_attn_func(q, q, q, causal=True).sum().backward()
    assert flash_attn_rs.last_backward_plan() == "fake backward"


def test_qkvpacked_and_kvpacked_are_flash_attn_func_on_views(cpu_launches):
    """The packed forms read Q, K, V as views of the packed tensor and put the gradients in its
    own: the same O and the same gradients as flash_attn_func on the unpacked tensors."""
    torch.manual_seed(4)
    b, s, h, d = 2, 7, 3, 8
    qkv = torch.randn(b, s, 3, h, d, requires_grad=True)
    out = flash_attn_rs.flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = (t.detach().clone().requires_grad_(True) for t in qkv.unbind(2))
    want = flash_attn_rs.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, want)
    d_o = torch.randn_like(out)
    out.backward(d_o)
    want.backward(d_o)
    assert torch.allclose(qkv.grad, torch.stack([q.grad, k.grad, v.grad], dim=2))

    q = torch.randn(b, 4, h, d, requires_grad=True)
    kv = torch.randn(b, s, 2, h, d, requires_grad=True)
    out, lse = flash_attn_rs.flash_attn_kvpacked_func(q, kv, softmax_scale=0.3, return_lse=True)
    k, v = kv.detach().unbind(2)
    want, want_lse = flash_attn_rs.flash_attn_func(q.detach(), k, v, softmax_scale=0.3,
                                                   return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    out.sum().backward()
    assert kv.grad.shape == kv.shape and q.grad.shape == q.shape


def test_packed_forms_name_a_wrong_stack(cpu_launches):
    with pytest.raises(ValueError, match=r"qkv has shape \(1, 4, 2, 2, 8\); allowed: 3"):
        flash_attn_rs.flash_attn_qkvpacked_func(torch.randn(1, 4, 2, 2, 8))
    with pytest.raises(ValueError, match=r"kv has shape \(1, 4, 3, 2, 8\); allowed: 2"):
        flash_attn_rs.flash_attn_kvpacked_func(torch.randn(1, 4, 2, 8), torch.randn(1, 4, 3, 2, 8))
    with pytest.raises(ValueError, match=r"qkv has shape \(4, 2, 8\); allowed: 3"):
        flash_attn_rs.flash_attn_varlen_qkvpacked_func(torch.randn(4, 2, 8), torch.tensor([0, 4]),
                                                       4)


def test_varlen_packed_forms_are_flash_attn_varlen_func_on_views(cpu_launches):
    q, k, v, cu_q, cu_k, max_q, max_k = packed_batch(heads=2, heads_kv=2)
    kv = torch.stack([k, v], dim=1)
    out = flash_attn_rs.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max_q, max_k, 0.0,
                                                        causal=True)
    want = flash_attn_rs.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    assert torch.equal(out, want)
    # One table for both: Q and K of the same lengths.
    lengths = [(5, 5), (0, 0), (12, 12), (3, 3)]
    q, k, v, cu, _, longest, _ = packed_batch(lengths, heads=2, heads_kv=2)
    qkv = torch.stack([q, k, v], dim=1)
    out, lse, s_dmask = flash_attn_rs.flash_attn_varlen_qkvpacked_func(
        qkv, cu, longest, causal=True, return_attn_probs=True)
    want, want_lse = flash_attn_rs.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest,
                                                          causal=True, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse) and s_dmask is None


def test_autocast_runs_float32_inputs_in_its_dtype(cpu_launches):
    """As SDPA under torch.autocast: float32 Q, K, V reach the launch in the autocast dtype, O comes
    back in it, and the float32 leaves get float32 gradients; outside autocast, float32 stays."""
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 6, 2, 8, requires_grad=True) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = flash_attn_rs.flash_attn_func(q, k, v, causal=True)
        o_sdpa = flash_attn_rs.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    assert o.dtype == torch.bfloat16 and o_sdpa.dtype == torch.bfloat16
    q64, k64, v64 = (t.detach().to(torch.bfloat16).transpose(1, 2).double() for t in (q, k, v))
    want, _ = ref.attention64(q64, k64, v64, True, 8**-0.5)
    assert torch.allclose(o.transpose(1, 2).double(), want, atol=1e-2)
    o.float().sum().backward()
    assert q.grad.dtype == torch.float32 and k.grad.dtype == torch.float32
    assert flash_attn_rs.flash_attn_func(q, k, v).dtype == torch.float32
    # Half-precision inputs are left as they are.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert flash_attn_rs.flash_attn_func(q.half(), k.half(), v.half()).dtype == torch.float16
    # The varlen call too.
    packed = [t.detach()[0] for t in (q, k, v)]
    offsets = torch.tensor([0, 2, 6], dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = flash_attn_rs.flash_attn_varlen_func(*packed, offsets, offsets, 4, 4)
    assert o.dtype == torch.bfloat16


@pytest.mark.parametrize("causal", [False, True])
def test_reference_gradients_by_formula_are_autograds(causal):
    """The fake backward's reference (formulas, grouped heads) against autograd's."""
    torch.manual_seed(6)
    q = torch.randn(2, 4, 5, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 7, 8, dtype=torch.float64) for _ in range(2))
    d_o = torch.randn_like(q)
    for got, want in zip(ref.gradients64_by_formula(q, k, v, d_o, causal, 0.3),
                         ref.gradients64(q, k, v, d_o, causal, 0.3)):
        assert torch.allclose(got, want, atol=1e-12)


# -- ALiBi -----------------------------------------------------------------------------------

def alibi_slopes(*shape):
    """Slopes as ALiBi's geometric sequence draws them, in (0, 1), float32."""
    torch.manual_seed(8)
    return torch.rand(*shape) * 0.5 + 0.05


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("per_batch", [False, True], ids=["heads", "batch_heads"])
def test_alibi_reaches_the_forward_and_the_backward(cpu_launches, causal, per_batch):
    """flash_attn_func's alibi_slopes, (heads,) or (batch, heads), with grouped K/V heads and
    soft-capping: O and L are the biased attention's, and the gradients too (the bias moves P, so
    every gradient moves), not the unbiased call's."""
    torch.manual_seed(7)
    b, h, h_kv, sq, sk, d = 2, 4, 2, 9, 12, 8
    q = torch.randn(b, sq, h, d, requires_grad=True)
    k, v = (torch.randn(b, sk, h_kv, d, requires_grad=True) for _ in range(2))
    slopes = alibi_slopes(b, h) if per_batch else alibi_slopes(h)
    o, lse = flash_attn_rs.flash_attn_func(q, k, v, causal=causal, softcap=3.0,
                                           alibi_slopes=slopes, return_lse=True)
    q64, k64, v64 = (t.detach().transpose(1, 2).double() for t in (q, k, v))
    want, want_lse = ref.attention64(q64, k64, v64, causal, d**-0.5, None, 3.0, slopes)
    assert torch.allclose(o.transpose(1, 2).double(), want, atol=1e-5)
    assert torch.allclose(lse.double(), want_lse, atol=1e-5)
    plain, _ = ref.attention64(q64, k64, v64, causal, d**-0.5, None, 3.0)
    assert not torch.allclose(want, plain, atol=1e-3)
    d_o = torch.randn_like(o)
    o.backward(d_o)
    d_o64 = d_o.transpose(1, 2).double()
    want = ref.gradients64(q64, k64, v64, d_o64, causal, d**-0.5, None, 3.0, slopes)
    plain = ref.gradients64(q64, k64, v64, d_o64, causal, d**-0.5, None, 3.0)
    for leaf, w, p in zip((q, k, v), want, plain):
        got = leaf.grad.transpose(1, 2).double()
        assert torch.allclose(got, w, atol=1e-5)
        assert not torch.allclose(got, p, atol=1e-3)


def test_alibi_bias_is_flash_attns_rule():
    """-slope * |i + seqlen_k - seqlen_q - j|, per head, bottom-right aligned."""
    bias = ref.alibi_bias(torch.tensor([0.5, 2.0]), 2, 4, "cpu")
    assert bias.shape == (1, 2, 2, 4)
    assert bias[0, 0].tolist() == [[-1.0, -0.5, 0.0, -0.5], [-1.5, -1.0, -0.5, 0.0]]
    assert torch.equal(bias[0, 1], 4 * bias[0, 0])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_alibi_is_each_sequences_own(cpu_launches, causal):
    """Packed sequences with (sequences, heads) slopes: each sequence's O and gradients are the
    dense call's on it alone with its own row of slopes, aligned to its own corner."""
    q, k, v, cu_q, cu_k, max_q, max_k = packed_batch()
    for t in (q, k, v):
        t.requires_grad_(True)
    slopes = alibi_slopes(len(cu_q) - 1, q.shape[1])
    o = flash_attn_rs.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                             alibi_slopes=slopes)
    d_o = torch.randn_like(o)
    o.backward(d_o)
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for sequence, (q0, q1, k0, k1) in enumerate(zip(cu_q, cu_q[1:], cu_k, cu_k[1:])):
        if q1 == q0 or k1 == k0:
            continue
        parts = [t.detach()[None, a:b].clone().requires_grad_(True)
                 for t, (a, b) in zip((q, k, v), ((q0, q1), (k0, k1), (k0, k1)))]
        want = flash_attn_rs.flash_attn_func(*parts, causal=causal,
                                             alibi_slopes=slopes[sequence])
        assert torch.allclose(o[q0:q1].float(), want[0].float(), atol=1e-2)
        want.backward(d_o[None, q0:q1])
        assert torch.allclose(q.grad[q0:q1].float(), parts[0].grad[0].float(), atol=2e-2)


@pytest.mark.parametrize("slopes, error, match", [
    ("0.5", TypeError, "alibi_slopes must be a torch.Tensor"),
    (torch.ones(2, dtype=torch.float64), TypeError, "torch.float32"),
    (torch.ones(3), ValueError, r"\(heads,\) = \(2,\)"),
    (torch.ones(3, 2), ValueError, r"\(batch, heads\) = \(1, 2\)"),
    (torch.ones(1, 1, 2), ValueError, "alibi_slopes has shape"),
])
def test_bad_alibi_slopes_are_named(cpu_launches, slopes, error, match):
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(error, match=match):
        flash_attn_rs.flash_attn_func(q, q, q, alibi_slopes=slopes)


def test_varlen_alibi_slopes_have_a_row_per_sequence(cpu_launches):
    q, k, v, cu_q, cu_k, max_q, max_k = packed_batch()
    with pytest.raises(ValueError, match=r"\(batch, heads\) = \(5, 4\)"):
        flash_attn_rs.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                             alibi_slopes=torch.ones(1, 4))


def test_softcap_and_alibi_gradients_match_finite_differences():
    """The backward's formulas (dS = P ∘ (dP − D) times the cap's slope 1 − tanh², the bias
    constant in Q and K) against central differences of the float64 forward, on a tiny problem
    with soft-capping, ALiBi, a window and grouped heads: independent of autograd."""
    torch.manual_seed(9)
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    k, v = (torch.randn(1, 1, 5, 4, dtype=torch.float64) for _ in range(2))
    d_o = torch.randn_like(q)
    slopes = torch.tensor([0.3, 0.7])
    options = (True, 0.6, (3, -1), 1.5, slopes)

    def loss(q, k, v):
        return (ref.attention64(q, k, v, *options)[0] * d_o).sum()

    step = 1e-6
    for index, grad in enumerate(ref.gradients64_by_formula(q, k, v, d_o, *options)):
        tensors = [q, k, v]
        numeric = torch.zeros_like(tensors[index])
        for position in range(numeric.numel()):
            shifted = [[t.clone() for t in tensors] for _ in range(2)]
            for sign, inputs in zip((1, -1), shifted):
                inputs[index].view(-1)[position] += sign * step
            numeric.view(-1)[position] = (loss(*shifted[0]) - loss(*shifted[1])) / (2 * step)
        assert torch.allclose(grad, numeric, atol=1e-7), (index, (grad - numeric).abs().max())


# -- custom operators: torch.compile ---------------------------------------------------------


def test_torch_compile_traces_the_calls_without_a_graph_break(cpu_launches):
    """fullgraph=True fails on any graph break: the checks trace, the launches are operators with
    fake implementations; forward and backward equal eager's."""
    torch.manual_seed(7)

    def step(q, k, v, qkv):
        o = flash_attn_rs.flash_attn_func(q, k, v, causal=True)
        o_packed = flash_attn_rs.flash_attn_qkvpacked_func(qkv, 0.0, 0.5)
        o_sdpa = flash_attn_rs.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                            v.transpose(1, 2))
        return o.square().sum() + o_packed.sum() + o_sdpa.sum()

    inputs = [torch.randn(2, 6, 2, 8, requires_grad=True) for _ in range(3)]
    inputs.append(torch.randn(2, 6, 3, 2, 8, requires_grad=True))
    twins = [t.detach().clone().requires_grad_(True) for t in inputs]
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    loss = compiled(*inputs)
    loss.backward()
    want = step(*twins)
    want.backward()
    assert torch.allclose(loss, want)
    for got, exact in zip(inputs, twins):
        assert torch.allclose(got.grad, exact.grad, atol=1e-6)


def test_operators_pass_opcheck(cpu_launches):
    """torch.library.opcheck: schema, fake implementation against the real one, autograd
    registration, and tracing by AOT dispatch."""
    forward, varlen_forward, backward, varlen_backward, _ = flash_attn_rs._ops.ops()
    q, k, v = (torch.randn(1, 5, 2, 8, requires_grad=True) for _ in range(3))
    flash = _checks.FLASH_ATTN
    slopes = alibi_slopes(2)
    for alibi in (None, slopes):
        torch.library.opcheck(forward, (q, k, v, flash, "f32", None, True, None, None, 0.0,
                                        alibi, 0.0, False))
    # With dropout each run draws a new mask: the schema and the fake implementation only.
    torch.library.opcheck(forward, (q, k, v, flash, "f32", None, True, None, None, 0.0, slopes,
                                    0.25, False), test_utils=("test_schema", "test_faketensor"))
    o, lse, rng_state = forward(q, k, v, flash, "f32", None, True, None, None, 0.0, slopes, 0.25,
                                False)
    assert rng_state.shape == (2,) and rng_state.device.type == "cpu"
    torch.library.opcheck(backward, (q.detach(), k.detach(), v.detach(), o.detach(), lse,
                                     torch.randn_like(o), flash, "f32", None, True, None, 0.0,
                                     slopes, False, 0.25, rng_state))
    pq, pk, pv, cu_q, cu_k, max_q, max_k = packed_batch(heads=2, heads_kv=2)
    torch.library.opcheck(varlen_forward, (pq, pk, pv, cu_q, cu_k, max_q, max_k, "bf16", None,
                                           True, None, None, 0.0, slopes, 0.0, False),
                          test_utils=("test_schema", "test_faketensor"))
    po, plse, prng = varlen_forward(pq, pk, pv, cu_q, cu_k, max_q, max_k, "bf16", None, True,
                                    None, None, 0.0, None, 0.1, False)
    torch.library.opcheck(varlen_backward, (pq, pk, pv, po, plse, torch.randn_like(po), cu_q,
                                            cu_k, max_q, max_k, "bf16", None, True, None, 0.0,
                                            None, False, 0.1, prng),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_traces_the_varlen_call_and_its_backward(cpu_launches):
    q, k, v, cu_q, cu_k, max_q, max_k = packed_batch(heads=2, heads_kv=2)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    twins = [t.clone().requires_grad_(True) for t in (q, k, v)]

    def step(q, k, v):
        return flash_attn_rs.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                                    causal=True).float().sum()

    loss = torch.compile(step, backend="aot_eager", fullgraph=True)(*leaves)
    loss.backward()
    want = step(*twins)
    want.backward()
    assert torch.equal(loss, want)
    for got, exact in zip(leaves, twins):
        assert torch.equal(got.grad, exact.grad)


# -- flash_attn_with_kvcache -------------------------------------------------------------------


def fake_decode(q, k_cache, v_cache, k_new, v_new, dtype, softmax_scale, causal, cache_seqlens,
                block_table, num_splits):
    """The KV-cache launch's contract: the native half's real checks on what the real launch
    passes it (no device: nothing launches), then float64 math: K and V appended into the caches
    in place at each sequence's length, each sequence's queries against its keys."""
    batch, _, heads, d = q.shape
    o = torch.empty(q.shape, dtype=q.dtype)
    lse = torch.empty(batch, heads, q.shape[1])
    arguments = _launch.decode_arguments(q, k_cache, v_cache, o, lse, k_new, v_new, dtype,
                                         softmax_scale, causal, cache_seqlens, block_table,
                                         num_splits)
    assert _native.forward(**arguments) is None
    scale = d**-0.5 if softmax_scale is None else softmax_scale

    def position(b, p):
        """Where key p of sequence b lives: (cache row, slot) in flash-attn's layout."""
        if block_table is None:
            return b, p
        page_size = k_cache.shape[1]
        return block_table[b][p // page_size], p % page_size

    for b in range(batch):
        new = 0 if k_new is None else k_new.shape[1]
        for i in range(new):
            row, slot = position(b, cache_seqlens[b] + i)
            k_cache[row, slot], v_cache[row, slot] = k_new[b, i], v_new[b, i]
        keys = [position(b, p) for p in range(cache_seqlens[b] + new)]
        kb, vb = (torch.stack([c[r, s] for r, s in keys]) if keys else c[:1, :0].reshape(0, *c.shape[2:])
                  for c in (k_cache, v_cache))
        sdpa = lambda t: t.double().transpose(0, 1)[None]  # noqa: E731
        ob, lseb = ref.attention64(sdpa(q[b]), sdpa(kb), sdpa(vb), causal, scale)
        o[b], lse[b] = ob[0].transpose(0, 1).to(q.dtype), lseb[0].float()
    _launch.plans["forward"] = "fake decode"
    return o, lse


@pytest.fixture
def cpu_decode(cpu_launches, monkeypatch):
    monkeypatch.setattr(_launch, "decode", fake_decode)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_kvcache_appends_then_attends(cpu_decode, paged):
    """flash-attn's call: q (batch, tokens, heads, d), caches in flash-attn's layout (or pages
    and a block table), k and v appended in place; O equals attention over each sequence's
    cached and new keys, grouped K/V heads."""
    torch.manual_seed(8)
    batch, heads, heads_kv, d, tokens = 2, 4, 2, 64, 2
    lengths = [5, 17]
    q = torch.randn(batch, tokens, heads, d).to(torch.bfloat16)
    if paged:
        k_cache, v_cache = (torch.randn(5, 16, heads_kv, d).to(torch.bfloat16) for _ in range(2))
        table = torch.tensor([[3, 0], [1, 4]], dtype=torch.int32)
    else:
        k_cache, v_cache = (torch.randn(batch, 32, heads_kv, d).to(torch.bfloat16)
                            for _ in range(2))
        table = None
    k, v = (torch.randn(batch, tokens, heads_kv, d).to(torch.bfloat16) for _ in range(2))
    before = k_cache.clone()
    o, lse = flash_attn_rs.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        block_table=table, causal=True, return_softmax_lse=True)
    assert o.shape == q.shape and lse.shape == (batch, heads, tokens)
    assert flash_attn_rs.last_plan() == "fake decode"
    for b in range(batch):
        # The new keys sit right after each sequence's cached ones.
        for i in range(tokens):
            p = lengths[b] + i
            row, slot = (table[b, p // 16].item(), p % 16) if paged else (b, p)
            assert torch.equal(k_cache[row, slot], k[b, i])
        # Against the keys gathered independently of the fake.
        positions = range(lengths[b] + tokens)
        where = [((table[b, p // 16].item(), p % 16) if paged else (b, p)) for p in positions]
        kb = torch.stack([k_cache[r, s] for r, s in where]).double().transpose(0, 1)[None]
        vb = torch.stack([v_cache[r, s] for r, s in where]).double().transpose(0, 1)[None]
        want, _ = ref.attention64(q[b].double().transpose(0, 1)[None], kb, vb, True, d**-0.5)
        assert torch.allclose(o[b].double().transpose(0, 1)[None], want, atol=2e-2)
    # What was not appended to is unchanged.
    changed = (k_cache != before).any(-1).any(-1)
    assert changed.sum() > 0 and not changed.all()


def test_kvcache_lengths_as_int_none_or_tensor(cpu_decode):
    q = torch.randn(2, 1, 2, 64).half()
    k_cache, v_cache = (torch.randn(2, 16, 2, 64).half() for _ in range(2))
    full = flash_attn_rs.flash_attn_with_kvcache(q, k_cache, v_cache)
    as_int = flash_attn_rs.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=16)
    as_tensor = flash_attn_rs.flash_attn_with_kvcache(q, k_cache, v_cache,
                                                      cache_seqlens=torch.tensor([16, 16]))
    assert torch.equal(full, as_int) and torch.equal(full, as_tensor)
    with pytest.raises(TypeError, match="cache_seqlens has dtype torch.float32"):
        flash_attn_rs.flash_attn_with_kvcache(q, k_cache, v_cache,
                                              cache_seqlens=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="`cache_seqlens`"):
        flash_attn_rs.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=17)
    with pytest.raises(TypeError, match="`dtype`"):
        flash_attn_rs.flash_attn_with_kvcache(q.float(), k_cache.float(), v_cache.float())


def test_torch_compile_of_a_transformers_model_has_no_graph_break(cpu_launches):
    """A Llama with our registered attention compiles with fullgraph=True (forward and backward:
    the attention is the custom operators), and its loss and gradients equal eager's."""
    from flash_attn_rs.transformers_attention import register

    model = llama(register())
    twin = llama(register())
    ids = torch.randint(0, 97, (2, 19), generator=torch.Generator().manual_seed(2))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    loss = compiled(input_ids=ids, labels=ids).loss
    loss.backward()
    want = twin(input_ids=ids, labels=ids).loss
    want.backward()
    assert torch.allclose(loss, want, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), name


def test_torch_compile_traces_kvcache_with_its_appends(cpu_decode):
    """fullgraph=True through flash_attn_rs::kvcache: the same O and the same appended caches as
    eager; the lengths as a tensor, an int and None."""
    torch.manual_seed(9)
    q = torch.randn(2, 2, 4, 64).to(torch.bfloat16)
    caches = [torch.randn(2, 32, 2, 64).to(torch.bfloat16) for _ in range(2)]
    k, v = (torch.randn(2, 2, 2, 64).to(torch.bfloat16) for _ in range(2))
    lengths = torch.tensor([3, 30], dtype=torch.int32)

    def step(q, k_cache, v_cache, k, v, lengths):
        return flash_attn_rs.flash_attn_with_kvcache(q, k_cache, v_cache, k, v,
                                                     cache_seqlens=lengths, causal=True)

    eager_caches = [c.clone() for c in caches]
    want = step(q, *eager_caches, k, v, lengths)
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(q, *caches, k, v, lengths)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(caches, eager_caches))
    whole = torch.compile(lambda q, kc, vc: flash_attn_rs.flash_attn_with_kvcache(q, kc, vc),
                          backend="aot_eager", fullgraph=True)(q, *caches)
    assert torch.equal(whole, flash_attn_rs.flash_attn_with_kvcache(q, *caches))


def test_kvcache_operator_passes_opcheck(cpu_decode):
    """The mutating operator: schema (its caches declared mutated) and fake implementation."""
    kvcache = flash_attn_rs._ops.ops()[4]
    q = torch.randn(2, 1, 4, 64).half()
    k_cache, v_cache = (torch.randn(2, 16, 2, 64).half() for _ in range(2))
    k, v = (torch.randn(2, 1, 2, 64).half() for _ in range(2))
    torch.library.opcheck(kvcache, (q, k_cache, v_cache, k, v, "f16", None, True,
                                    torch.tensor([3, 9]), None, None),
                          test_utils=("test_schema", "test_faketensor"))


def test_offsets_off_the_cpu_stay_on_their_device_and_cpu_offsets_are_read():
    """Offsets on the CPU reach the native half as lists (read and checked there); offsets on a
    device stay there: their addresses (int32, converted there from int64) and the number of
    sequences, with the bounds as given. A meta tensor stands in for a CUDA one; its address 0
    is then refused by the native half, naming cu_seqlens_q."""
    cpu = torch.tensor([0, 5, 9], dtype=torch.int64)
    assert _launch.offsets_arguments(cpu, cpu, (5, 4)) == dict(
        cu_seqlens_q=[0, 5, 9], cu_seqlens_k=[0, 5, 9], max_seqlen_q=5, max_seqlen_k=4)
    meta = torch.tensor([0, 5, 9], dtype=torch.int64, device="meta")
    arguments = _launch.offsets_arguments(meta, meta, (5, 4))
    kept = arguments.pop("_keep")
    assert [t.dtype for t in kept] == [torch.int32] * 2 and all(t.is_contiguous() for t in kept)
    assert arguments == dict(device_offsets=(0, 0, 2), max_seqlen_q=5, max_seqlen_k=4)
    q = torch.zeros(9, 2, 64, dtype=torch.bfloat16)
    o = torch.empty_like(q)
    stats = _launch.statistics(torch, q, _checks.PACKED, None)
    native = _launch.forward_arguments(q, q, q, o, stats, _checks.PACKED, "bf16", None, False,
                                       None, packed=(meta, meta, (5, 4)))
    native.pop("_keep")
    with pytest.raises(ValueError, match="`cu_seqlens_q`.*device address 0x0"):
        _native.forward(**native)


def test_offset_counts_must_match_and_hold_a_sequence(cpu_launches):
    q = torch.zeros(9, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^cu_seqlens_k has 2 entries; expected as many as"):
        flash_attn_rs.flash_attn_varlen_func(q, q, q, torch.tensor([0, 5, 9]),
                                             torch.tensor([0, 9]), 5, 9)
    with pytest.raises(ValueError, match="^cu_seqlens_q has 1 entries"):
        flash_attn_rs.flash_attn_varlen_func(q, q, q, torch.tensor([0]), torch.tensor([0]), 5, 9)


@pytest.mark.parametrize("algorithm", [None, "fa2-tc", "fa2"])
def test_a_head_dim_off_the_multiples_of_8_is_padded_for_the_tensor_cores(cpu_launches,
                                                                          monkeypatch,
                                                                          algorithm):
    """Head dim 59 (bf16, with a window and capping, causal): the fast algorithms see q, k, v
    padded with zeros to 64 and the scale of 59 (flash-attn's rule); the caller gets O and the
    gradients at 59, the values of attention at 59. fa2 (the article's kernel) sees 59."""
    seen = []

    def recording(q, k, v, *arguments, **keywords):
        seen.append((q.shape[-1], k.shape[-1], v.shape[-1], arguments[2]))
        return fake_forward(q, k, v, *arguments, **keywords)

    monkeypatch.setattr(_launch, "forward", recording)
    torch.manual_seed(1)
    b, s, h, d = 2, 9, 3, 59
    q, k, v = (torch.randn(b, s, h, d).bfloat16().requires_grad_() for _ in range(3))
    o = flash_attn_rs.flash_attn_func(q, k, v, causal=True, window_size=(4, 0), softcap=5.0,
                                      algorithm=algorithm)
    padded = 59 if algorithm == "fa2" else 64
    assert seen == [(padded, padded, padded, None if algorithm == "fa2" else 59**-0.5)]
    assert o.shape == q.shape
    d_o = torch.randn_like(o)
    o.backward(d_o)
    q64, k64, v64, d_o64 = (t.detach().double().transpose(1, 2) for t in (q, k, v, d_o))
    o64, _ = ref.attention64(q64, k64, v64, True, d**-0.5, (4, 0), 5.0)
    assert torch.allclose(o.double(), o64.transpose(1, 2), atol=2e-2)
    want = ref.gradients64_by_formula(q64, k64, v64, d_o64, True, d**-0.5, (4, 0), 5.0)
    for got, w in zip((q.grad, k.grad, v.grad), want):
        assert got.shape == (b, s, h, d)
        error = (got.double() - w.transpose(1, 2)).abs().max()
        assert error < 5e-2, error


@pytest.mark.parametrize("head_dim, algorithm, runs_at", [
    (80, "fa2-tc", 96), (111, "fa2-tc", 128), (96, "fa2-tc", 96), (111, None, 128),
    (1, None, 32), (80, "fa2", 80)])
def test_off_the_hopper_gpus_a_head_dim_runs_at_fa2_tcs_next_compiled_one(
        cpu_launches, monkeypatch, head_dim, algorithm, runs_at):
    """Where fa2-tc runs (named, or auto off compute capability 9.0; the CPU here), a head dim it
    is not compiled for is padded to the next one it is (_native.FA2_TC_HEAD_DIMS)."""
    seen = []

    def recording(q, k, v, *arguments, **keywords):
        seen.append(q.shape[-1])
        return fake_forward(q, k, v, *arguments, **keywords)

    monkeypatch.setattr(_launch, "forward", recording)
    assert list(_native.FA2_TC_HEAD_DIMS) == sorted(_native.FA2_TC_HEAD_DIMS)
    q = torch.randn(1, 5, 2, head_dim).bfloat16()
    o = flash_attn_rs.flash_attn_func(q, q, q, algorithm=algorithm)
    assert seen == [runs_at] and o.shape == q.shape


def test_a_packed_call_at_head_dim_111_is_padded_too(cpu_launches):
    """The varlen call pads as the dense one: O at 111, each sequence's attention at 111."""
    torch.manual_seed(2)
    cu = torch.tensor([0, 5, 12])
    q, k, v = (torch.randn(12, 2, 111).bfloat16() for _ in range(3))
    o = flash_attn_rs.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True)
    assert o.shape == q.shape
    o64, _ = ref.packed_attention64(*(t.double() for t in (q, k, v)), [0, 5, 12], [0, 5, 12],
                                    True, 111**-0.5)
    assert torch.allclose(o.double(), o64, atol=2e-2)
