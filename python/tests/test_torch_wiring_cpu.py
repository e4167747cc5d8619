"""The PyTorch-facing wiring on the CPU, with the two launches replaced by float64 math: the
autograd Function (what it saves, what backward returns, which layout each tensor is in), the
transformers registration (layouts, grouped-query heads, scaling, the mask and dropout refusals),
the tolerance rule's slack, and the example's agreement check. The kernels themselves are the GPU
tests' job (test_gpu_*.py). Skipped where PyTorch (or transformers) is not installed."""

import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch")

import reference as ref  # noqa: E402

import flash_attn_rs  # noqa: E402
from flash_attn_rs import _checks, _launch  # noqa: E402

EXAMPLE = pathlib.Path(__file__).parent.parent / "examples" / "01_train_tiny_llama.py"


def to_sdpa(t, layout):
    return t.transpose(1, 2) if layout == _checks.FLASH_ATTN else t


def fake_forward(q, k, v, layout, dtype, softmax_scale, causal, algorithm, window=None,
                 softcap=0.0):
    """The forward launch's contract, in float64 math: O in q's shape and dtype, L f32."""
    assert dtype == _checks.DTYPES[str(q.dtype)]
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    q64, k64, v64 = (to_sdpa(t, layout).detach().double() for t in (q, k, v))
    o, lse = ref.attention64(q64, k64, v64, causal, scale, window, softcap)
    _launch.plans["forward"] = f"fake {algorithm}"
    return to_sdpa(o, layout).to(q.dtype).contiguous(), lse.float()


def fake_backward(q, k, v, o, lse, d_o, layout, dtype, softmax_scale, causal, window=None,
                  softcap=0.0):
    # As the native half: the backward has no window or soft-capping, and names them.
    if window is not None:
        raise ValueError(f"`window`: got {window}; the backward pass takes neither")
    if softcap:
        raise ValueError(f"`softcap`: got {softcap}; the backward pass takes neither")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    q64, k64, v64, d_o64 = (to_sdpa(t, layout).double() for t in (q, k, v, d_o))
    o64, lse64 = ref.attention64(q64, k64, v64, causal, scale)
    assert torch.allclose(to_sdpa(o, layout).double(), o64, atol=1e-2), "saved O is not O"
    assert torch.allclose(lse.double(), lse64, atol=1e-4), "saved L is not L"
    grads = ref.gradients64(q64, k64, v64, d_o64, causal, scale)
    _launch.plans["backward"] = "fake backward"
    return [to_sdpa(g, layout).to(t.dtype) for g, t in zip(grads, (q, k, v))]


@pytest.fixture
def cpu_launches(monkeypatch):
    monkeypatch.setattr(_checks, "DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(_launch, "forward", fake_forward)
    monkeypatch.setattr(_launch, "backward", fake_backward)


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


def test_window_and_softcap_reach_the_forward_and_the_backward_refuses_them(cpu_launches):
    """flash_attn_func's window_size and softcap: the forward's O is the windowed, capped one;
    the backward receives both and refuses them (never a gradient without the mask)."""
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
    with pytest.raises(ValueError, match="window"):
        o.sum().backward()
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
