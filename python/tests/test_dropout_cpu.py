"""Dropout's pieces on the CPU: the Philox generator and the mask (the same bits as the kernels'
definition, ``flash_kernels::common::dropout``), the generator state each call takes, flash-attn's
``S_dmask`` convention, and the wiring (the forward's seed and offset reach the backward; the
autograd formula through the dropped probabilities). The kernels themselves are
``test_gpu_numerics.py``'s and ``test_gpu_varlen.py``'s job."""

import math

import pytest

torch = pytest.importorskip("torch")

import reference as ref  # noqa: E402
from test_torch_wiring_cpu import cpu_launches, packed_batch  # noqa: E402,F401

import flash_attn_rs  # noqa: E402
from flash_attn_rs import _dropout  # noqa: E402


def test_philox_matches_random123s_vectors():
    cases = [
        ([0] * 4, (0, 0), [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
        ([0xFFFFFFFF] * 4, (0xFFFFFFFF, 0xFFFFFFFF),
         [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
        ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], (0xA4093822, 0x299F31D0),
         [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
    ]
    for counter, key, want in cases:
        words = _dropout.philox4x32_10(tuple(torch.tensor(c) for c in counter), key)
        assert [int(w) for w in words] == want


def test_the_mask_is_the_kernels():
    """Rows 0, 17 and 39 of the 40 x 40 mask the Rust test
    (`the_mask_is_the_one_the_python_package_computes`) pins: one definition, two languages."""
    keep = _dropout.keep_mask(0.3, 0x0123456789ABCDEF, (5 << 32) + 8, [7], 40, 40, "cpu")[0]
    rows = [sum(int(keep[i, j]) << j for j in range(40)) for i in (0, 17, 39)]
    assert rows == [1024348875339, 676384630991, 1047837794102]


def test_the_mask_keeps_one_minus_p_and_changes_with_the_state():
    keep = _dropout.keep_mask(0.17, 99, 4, range(6), 128, 96, "cpu")
    assert abs(keep.float().mean().item() - 0.83) < 0.006
    # Heads differ, and so do offsets and seeds.
    assert not torch.equal(keep[0], keep[1])
    assert not torch.equal(keep, _dropout.keep_mask(0.17, 99, 8, range(6), 128, 96, "cpu"))
    assert not torch.equal(keep, _dropout.keep_mask(0.17, 98, 4, range(6), 128, 96, "cpu"))
    # A longer sequence extends the mask: each score's bit depends on its own coordinates.
    longer = _dropout.keep_mask(0.17, 99, 4, range(6), 160, 130, "cpu")
    assert torch.equal(longer[:, :128, :96], keep)


def test_thresholds_are_the_kernels():
    assert _dropout.drop_below(0.17) == 11141
    assert _dropout.drop_below(0.5) == 32768 and _dropout.keep_scale(0.5) == 2.0
    assert _dropout.drop_below(1e-6) == 0
    assert _dropout.keep_scale(0.17) == pytest.approx(1 / (1 - 11141 / 65536))


def test_the_state_round_trips_and_a_seed_repeats():
    for seed in (0, 5, 2**63 + 7, 2**64 - 1):
        assert _dropout.from_state_tensor(_dropout.state_tensor(seed, 12)) == (seed, 12)
    torch.manual_seed(1)
    first = _dropout.generator_state(torch.device("cpu"))
    torch.manual_seed(1)
    assert _dropout.generator_state(torch.device("cpu")) == first


def flash_attn_normalize(s_dmask, q, k, causal, block):
    """flash-attn's tests' ``normalize_flash_attn_S`` (no padding, no bias): each block of keys
    times exp(m_j - lse), m_j the largest score of the block and those after it."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(q.shape[-1])
    seqlen_q, seqlen_k = scores.shape[-2:]
    if causal:
        mask = ref.window_mask(seqlen_q, seqlen_k, True, None, q.device)
        scores = scores.masked_fill(~mask, -math.inf)
    blocks = scores.split(block, dim=-1)
    lse = torch.logsumexp(torch.stack([torch.logsumexp(s, -1) for s in blocks], -1), -1)
    lse[lse == -math.inf] = math.inf
    block_max = torch.stack([s.amax(-1) for s in blocks], -1)
    later = torch.cummax(block_max.flip(-1), -1).values.flip(-1).unbind(-1)
    return torch.cat([a * torch.exp(m - lse)[..., None]
                      for a, m in zip(s_dmask.double().split(block, dim=-1), later)], -1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_s_dmask_is_flash_attns(causal, head_dim):
    """flash-attn's tests read S_dmask so: crop, sign = the dropout mask, abs normalized per key
    block = P. Here P is the float64 softmax, and the sign is the kernels' mask."""
    torch.manual_seed(0)
    b, h, sq, sk = 2, 3, 70, 150
    q, k = torch.randn(b, sq, h, head_dim), torch.randn(b, sk, h, head_dim)
    s_dmask = _dropout.attention_probs(q, k, None, causal, None, 0.0, None, 0.2, 11, 4)
    assert s_dmask.shape == (b, h, 128, 256) and s_dmask.dtype == q.dtype
    assert torch.all(s_dmask[:, :, sq:] == 0) and torch.all(s_dmask[:, :, :, sk:] == 0)
    s = s_dmask[:, :, :sq, :sk]
    keep = _dropout.keep_mask(0.2, 11, 4, range(b * h), sq, sk, "cpu").reshape(b, h, sq, sk)
    visible = ref.window_mask(sq, sk, causal, None, "cpu")
    assert torch.equal((s > 0) & visible, keep & visible & (s != 0))
    assert torch.all(s[..., ~visible] == 0)
    block = _dropout.block_size_n(q.device, head_dim, causal)
    attn = flash_attn_normalize(s.abs(), q, k, causal, block)
    p, _ = ref._probabilities(q.transpose(1, 2).double(), k.transpose(1, 2).double(), causal,
                              head_dim**-0.5)
    assert (attn - p).abs().max().item() < 2e-6


def test_varlen_s_dmask_puts_each_sequence_at_its_rows_top_left():
    torch.manual_seed(1)
    cu_q, cu_k, h, d = [0, 5, 5, 19], [0, 9, 12, 30], 2, 16
    q, k = torch.randn(cu_q[-1], h, d), torch.randn(cu_k[-1], h, d)
    s_dmask = _dropout.attention_probs(q, k, None, True, None, 0.0, None, 0.3, 3, 0,
                                       sequences=(cu_q, cu_k))
    assert s_dmask.shape == (3, h, 128, 128)
    for b in range(3):
        n_q, n_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        alone = _dropout.attention_probs(q[None, cu_q[b]:cu_q[b + 1]],
                                         k[None, cu_k[b]:cu_k[b + 1]], None, True, None, 0.0,
                                         None, 0.3, 3, 0) if n_q else None
        if alone is None:
            assert torch.all(s_dmask[b] == 0)
            continue
        # Sequence b's mask is drawn for global heads b * h + head.
        keep = _dropout.keep_mask(0.3, 3, 0, [b * h + i for i in range(h)], n_q, n_k, "cpu")
        got = s_dmask[b, :, :n_q, :n_k]
        assert torch.equal(got.abs(), alone[0, :, :n_q, :n_k].abs())
        assert torch.equal((got < 0), (~keep) & (got != 0))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan")])
def test_a_bad_dropout_p_is_named(cpu_launches, p):
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_rs.flash_attn_func(q, q, q, p)
    with pytest.raises(TypeError, match="dropout_p"):
        flash_attn_rs.flash_attn_func(q, q, q, "0.1")


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_reaches_the_forward_and_the_backward_with_one_state(cpu_launches, causal):
    """The fake launches compute with the kernels' mask for the (p, seed, offset) they are given
    (``test_torch_wiring_cpu.dropout_of``): O is the reference with the mask S_dmask's sign
    gives, and the gradients are autograd's through that mask, so the backward got the
    forward's seed and offset."""
    torch.manual_seed(5)
    b, h, sq, sk, d, p = 2, 2, 9, 13, 8, 0.3
    q = torch.randn(b, sq, h, d, requires_grad=True)
    k, v = (torch.randn(b, sk, h, d, requires_grad=True) for _ in range(2))
    out, lse, s_dmask = flash_attn_rs.flash_attn_func(q, k, v, p, causal=causal,
                                                      return_attn_probs=True)
    keep = s_dmask[:, :, :sq, :sk] >= 0
    q64, k64, v64 = (t.detach().transpose(1, 2).double().requires_grad_(True) for t in (q, k, v))
    want, want_lse = ref.attention64(q64, k64, v64, causal, d**-0.5, dropout=(keep,
                                     _dropout.keep_scale(p)))
    assert torch.allclose(out.transpose(1, 2).double(), want, atol=1e-5)
    assert torch.allclose(lse.double(), want_lse, atol=1e-5)  # L is undropped
    d_o = torch.randn_like(out)
    out.backward(d_o)
    want.backward(d_o.transpose(1, 2).double())
    for got, exact in zip((q, k, v), (q64, k64, v64)):
        assert torch.allclose(got.grad.transpose(1, 2).double(), exact.grad, atol=1e-4)
    # Without dropout the output differs (the test has power), and the next call draws anew.
    plain = flash_attn_rs.flash_attn_func(q, k, v, causal=causal)
    assert not torch.allclose(plain, out, atol=1e-3)
    _, _, again = flash_attn_rs.flash_attn_func(q, k, v, p, causal=causal,
                                                return_attn_probs=True)
    assert not torch.equal(again >= 0, s_dmask >= 0)


def test_a_seed_repeats_the_dropout(cpu_launches):
    q = torch.randn(1, 16, 2, 8)
    torch.manual_seed(3)
    first = flash_attn_rs.flash_attn_func(q, q, q, 0.4)
    torch.manual_seed(3)
    assert torch.equal(flash_attn_rs.flash_attn_func(q, q, q, 0.4), first)


def test_varlen_dropout_is_each_sequences_own_mask(cpu_launches):
    """Sequence b's mask is drawn for its own rows and keys and global heads b * heads + h, in
    the forward and the backward alike."""
    q, k, v, cu_q, cu_k, max_q, max_k = packed_batch(heads=2, heads_kv=2)
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))  # bf16: packed runs on tensor cores
    out, _, s_dmask = flash_attn_rs.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                                           0.25, causal=True,
                                                           return_attn_probs=True)
    cu_q_list, cu_k_list = cu_q.tolist(), cu_k.tolist()
    scale = q.shape[-1] ** -0.5
    d_o = torch.randn_like(out)
    out.backward(d_o)
    d_o = d_o.double()
    for b, (q0, q1, k0, k1) in enumerate(zip(cu_q_list, cu_q_list[1:], cu_k_list,
                                             cu_k_list[1:])):
        if q1 == q0:
            continue
        keep = (s_dmask[b, :, :q1 - q0, :k1 - k0] >= 0)[None]
        parts = [t.detach()[a:e].double().transpose(0, 1)[None].requires_grad_(True)
                 for t, (a, e) in zip((q, k, v), ((q0, q1), (k0, k1), (k0, k1)))]
        want, _ = ref.attention64(*parts, True, scale, dropout=(keep, _dropout.keep_scale(0.25)))
        got = out[q0:q1].transpose(0, 1)[None].double()
        assert torch.allclose(got, want, rtol=1e-2, atol=1e-2), b
        want.backward(d_o[q0:q1].transpose(0, 1)[None].double())
        for grad, part, (a, e) in zip((q.grad, k.grad, v.grad), parts,
                                      ((q0, q1), (k0, k1), (k0, k1))):
            assert torch.allclose(grad[a:e].transpose(0, 1)[None].double(), part.grad,
                                  rtol=1e-2, atol=1e-2), b


def test_transformers_dropout_reaches_the_call(cpu_launches, monkeypatch):
    transformers_attention = pytest.importorskip("flash_attn_rs.transformers_attention")
    seen = {}

    def spy(q, k, v, dropout_p=0.0, **options):
        seen["dropout_p"] = dropout_p
        return q

    monkeypatch.setattr(transformers_attention, "flash_attn_func", spy)
    forward = transformers_attention.make_attention_forward()
    x = torch.randn(1, 2, 4, 8)
    forward(torch.nn.Module(), x, x, x, None, dropout=0.1)
    assert seen["dropout_p"] == 0.1


def test_torch_compile_traces_dropout_and_keeps_each_calls_mask(cpu_launches):
    """fullgraph=True through the custom operators with dropout: the forward operator draws its
    seed and offset when it runs (tagged nondeterministic_seeded where PyTorch takes tags), so two
    identical calls in one compiled function are not merged and draw different masks, and the
    gradients come back."""
    q = torch.randn(1, 16, 2, 8, requires_grad=True)

    def twice(q):
        a = flash_attn_rs.flash_attn_func(q, q, q, 0.5)
        b = flash_attn_rs.flash_attn_func(q, q, q, 0.5)
        return a, b

    a, b = torch.compile(twice, backend="aot_eager", fullgraph=True)(q)
    assert not torch.equal(a, b)
    (a.sum() + b.sum()).backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
