"""The bridge's contract with PyTorch on a GPU: launches go to PyTorch's current stream (work
queued on a side stream is waited for, and results can be read on it without a synchronize); CUDA
graph capture is refused with a clear RuntimeError, leaving the capture and the GPU usable; bad
arguments raise ValueError or TypeError naming the argument, and nothing is launched."""

from gpu_support import generator, randn, torch

import pytest
import reference as ref

import flash_attn_rs
from flash_attn_rs import _launch, _native, flash_attn_func

# About 25-50 ms of GPU time at H200 clocks: long enough that work not ordered after it on the
# side stream (a launch to another stream) would read the inputs before they are written.
SLEEP_CYCLES = 50_000_000


def expected(q, k, v, causal=False):
    """The f64 reference of flash-attn-layout q, k, v, and its bf16 bound."""
    q64, k64, v64 = (t.to(torch.float64).transpose(1, 2) for t in (q, k, v))
    scale = q.shape[-1] ** -0.5
    o_ref, _ = ref.attention64(q64, k64, v64, causal, scale)
    o_dtype = ref.attention_in_dtype(q64, k64, v64, causal, scale, q.dtype)
    return o_ref.transpose(1, 2), ref.forward_bound(o_ref, o_dtype, q.dtype)


def test_forward_runs_on_the_current_side_stream():
    g = generator(11)
    q0, k0, v0 = (randn((2, 512, 4, 64), torch.bfloat16, g) for _ in range(3))
    o_ref, bound = expected(q0, k0, v0, causal=True)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()  # PyTorch's streams do not wait for the legacy default stream
    with torch.cuda.stream(side):
        q, k, v = (torch.empty_like(t) for t in (q0, k0, v0))
        side.wait_stream(torch.cuda.default_stream())  # q0, k0, v0 are ready
        torch.cuda._sleep(SLEEP_CYCLES)  # the side stream is busy...
        for dst, src in ((q, q0), (k, k0), (v, v0)):
            dst.copy_(src)  # ...and only then writes the inputs
        o = flash_attn_func(q, k, v, causal=True)
        result = o.to(torch.float64)  # read on the side stream, no synchronize
    side.synchronize()
    error, finite = ref.max_error(result, o_ref)
    assert finite and error <= bound, (
        f"error {error:.3e} > {bound:.3e}: the launch did not follow the side stream's work"
    )


def test_backward_runs_on_the_forwards_side_stream():
    g = generator(12)
    q0, k0, v0 = (randn((1, 384, 2, 64), torch.float32, g) for _ in range(3))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        side.wait_stream(torch.cuda.default_stream())
        q, k, v = (t.clone().requires_grad_(True) for t in (q0, k0, v0))
        o = flash_attn_func(q, k, v)
        torch.cuda._sleep(SLEEP_CYCLES)
        d_o = torch.ones_like(o) * 0.5  # written after the sleep
        o.backward(d_o)
        grads = [t.grad.to(torch.float64) for t in (q, k, v)]
    side.synchronize()
    q64, k64, v64 = (t.to(torch.float64).transpose(1, 2) for t in (q0, k0, v0))
    half = torch.full_like(q64, 0.5)
    exact = ref.gradients64(q64, k64, v64, half, False, 64**-0.5)
    for name, got, want in zip(("dq", "dk", "dv"), grads, exact):
        error, finite = ref.max_error(got.transpose(1, 2), want)
        bound = ref.BACKWARD_F32_RELATIVE_TOLERANCE * max(want.abs().max().item(), 1.0)
        assert finite and error <= bound, f"{name}: error {error:.3e} > {bound:.3e}"


def test_cuda_graph_capture_is_refused_clearly():
    q = randn((1, 256, 2, 64), torch.bfloat16, generator(13))
    flash_attn_func(q, q, q)  # the device is open: only the capture can be refused now
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="capturing a CUDA graph") as error:
        with torch.cuda.graph(graph):
            flash_attn_func(q, q, q)
    assert "tensor maps" in str(error.value), error.value  # the message says why
    # The native half refuses too (the host's check on the stream), before sending anything.
    o = torch.empty_like(q)
    lse = torch.empty((1, 2, 256), dtype=torch.float32, device=q.device)
    operand = lambda t: _launch._operand(t, flash_attn_rs.FLASH_ATTN)  # noqa: E731
    with pytest.raises(RuntimeError, match="capturing a CUDA graph"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            _native.forward(
                dtype="bf16", device=q.device.index,
                stream=torch.cuda.current_stream().cuda_stream,
                q=operand(q), k=operand(q), v=operand(q), o=operand(o),
                stats=[lse.data_ptr()],
            )
    # The GPU is still usable and right.
    o_ref, bound = expected(q, q, q)
    error, finite = ref.max_error(flash_attn_func(q, q, q), o_ref)
    assert finite and error <= bound


# -- bad arguments ----------------------------------------------------------------------------


def cuda(shape=(1, 32, 2, 64), dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype, device="cuda")


CASES = [
    # (id, q, k, v, kwargs, exception, message regex)
    ("k on the CPU", cuda(), cuda().cpu(), cuda(), {}, ValueError, "^k is on cpu"),
    ("float64", cuda(dtype=torch.float64), cuda(dtype=torch.float64),
     cuda(dtype=torch.float64), {}, TypeError, "^q has dtype torch.float64; allowed"),
    ("mixed dtypes", cuda(), cuda(dtype=torch.float16), cuda(), {}, TypeError,
     "^k has dtype torch.float16 but q has torch.bfloat16"),
    ("strided head dim", cuda(), cuda((1, 32, 2, 128))[..., ::2], cuda(), {}, ValueError,
     "^k has strides .* last dim"),
    ("heads do not divide", cuda(), cuda((1, 32, 4, 64)), cuda((1, 32, 4, 64)), {}, ValueError,
     "^k has shape .* must divide q's"),
    ("seqlen of k and v", cuda(), cuda((1, 40, 2, 64)), cuda(), {}, ValueError,
     "^v has shape .* seqlen must be equal"),
    ("3-D", cuda((32, 2, 64)), cuda(), cuda(), {}, ValueError, "^q has shape .* expected 4 dims"),
    ("head dim 300", cuda((1, 8, 1, 300)), cuda((1, 8, 1, 300)), cuda((1, 8, 1, 300)), {},
     ValueError, "`head_dim`"),
    ("negative scale", cuda(), cuda(), cuda(), {"softmax_scale": -1.0}, ValueError,
     "`softmax_scale`"),
    ("scale a string", cuda(), cuda(), cuda(), {"softmax_scale": "0.1"}, TypeError,
     "^softmax_scale must be a float"),
    ("unknown algorithm", cuda(), cuda(), cuda(), {"algorithm": "fa9"}, ValueError,
     "^algorithm is 'fa9'; allowed"),
    ("causal not a bool", cuda(), cuda(), cuda(), {"causal": "yes"}, TypeError,
     "^causal must be a bool"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_arguments_raise_before_any_launch(case):
    _, q, k, v, kwargs, exception, message = case
    flash_attn_func(cuda(), cuda(), cuda())  # a plan to compare with
    before = flash_attn_rs.last_plan()
    torch.cuda.synchronize()
    with pytest.raises(exception, match=message):
        flash_attn_func(q, k, v, **kwargs)
    assert flash_attn_rs.last_plan() is before, "a plan was made for a rejected call"
    torch.cuda.synchronize()  # and the GPU has no fault queued


def test_tensors_on_two_devices_are_a_value_error():
    if torch.cuda.device_count() < 2:
        pytest.skip("one CUDA device")
    q = cuda()
    k = q.to("cuda:1")
    with pytest.raises(ValueError, match="^k is on cuda:1 but q is on cuda:0"):
        flash_attn_func(q, k, q)


def test_gradients_allocated_by_pytorch_and_shaped_like_inputs():
    """dQ has Q's shape and strides (dense inputs), dK and dV K's; all PyTorch tensors."""
    q = randn((2, 64, 2, 64), torch.bfloat16, generator(14)).requires_grad_(True)
    kv = randn((2, 2, 96, 64), torch.bfloat16, generator(15)).transpose(1, 2)  # SDPA storage
    k = kv.detach().clone().requires_grad_(True)
    v = kv.detach().clone().requires_grad_(True)
    flash_attn_func(q, k, v, causal=True).float().square().sum().backward()
    assert q.grad.shape == q.shape and q.grad.stride() == q.stride()
    assert k.grad.shape == k.shape and v.grad.shape == v.shape
    # The default backward: FA3's on compute capability 9.0, else the mma.sync tensor-core
    # kernel (f16/bf16, head dims that are multiples of 8).
    plan = flash_attn_rs.last_backward_plan()
    assert plan.startswith(("fa3 backward:", "fa2-tc backward:")), plan


def test_flash_attn_calls_run_unchanged_on_the_gpu():
    """Calls as flash-attn's own tests write them: dropout_p third (0.0), return_attn_probs, the
    packed QKV form read in place, deterministic=True giving dQ with the same bits twice."""
    g = generator(16)
    qkv = randn((2, 300, 3, 4, 128), torch.bfloat16, g).requires_grad_(True)
    q, k, v = qkv.unbind(2)
    o_ref, bound = expected(q.detach(), k.detach(), v.detach(), causal=True)
    out, lse, s_dmask = flash_attn_func(q, k, v, 0.0, causal=True, return_attn_probs=True)
    error, finite = ref.max_error(out.to(torch.float64), o_ref)
    assert finite and error <= bound and s_dmask is None
    assert lse.shape == (2, 4, 300) and lse.dtype == torch.float32
    packed = flash_attn_rs.flash_attn_qkvpacked_func(qkv, 0.0, None, True)
    assert torch.equal(packed, out)
    d_o = randn(out.shape, torch.bfloat16, g)
    grads = []
    for _ in range(2):
        qkv.grad = None
        flash_attn_rs.flash_attn_qkvpacked_func(qkv, causal=True, deterministic=True).backward(d_o)
        grads.append(qkv.grad.clone())
    assert "deterministic" in flash_attn_rs.last_backward_plan()
    assert torch.equal(grads[0], grads[1])
    # flash-attn's tests' dropout call: (out, softmax_lse, S_dmask) with S_dmask's sign the mask.
    out, lse, s_dmask = flash_attn_func(q, k, v, 0.17, return_attn_probs=True)
    assert out.shape == q.shape and s_dmask.dtype == q.dtype
    assert abs((s_dmask[:, :, :q.shape[1], :k.shape[1]] < 0).float().mean().item() - 0.17) < 0.01
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_func(q, k, v, 1.0)


def test_torch_compile_fullgraph_on_the_gpu():
    """torch.compile (inductor) with fullgraph=True through the custom operators: the same loss
    and gradients as eager (the same kernels run; inductor may fuse the loss's reduction
    differently, hence bf16's tolerances rather than equality)."""
    g = generator(17)
    q, k, v = (randn((2, 256, 4, 64), torch.bfloat16, g).requires_grad_(True) for _ in range(3))
    twins = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

    def step(q, k, v):
        return flash_attn_func(q, k, v, causal=True).float().square().sum()

    compiled = torch.compile(step, fullgraph=True)
    loss = compiled(q, k, v)
    loss.backward()
    want = step(*twins)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=0.0)
    for got, exact in zip((q, k, v), twins):
        torch.testing.assert_close(got.grad, exact.grad)
