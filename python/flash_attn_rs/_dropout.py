"""Dropout's generator state and mask, and flash-attn's ``S_dmask``.

The kernels drop each probability by Philox4x32-10 from a seed and an offset
(``flash_kernels::common::dropout`` says which random number decides which score). The seed and
offset come from PyTorch's CUDA generator as flash-attn takes them: its seed, and its offset,
advanced by each call, so ``torch.manual_seed`` makes a run repeat, and
``torch.utils.checkpoint``, which restores the generator's state before it recomputes a forward,
recomputes the same mask. The backward gets the forward's seed and offset.

``keep_mask`` computes the same mask in PyTorch from the same definition: ``S_dmask``
(``return_attn_probs``) takes it, and the tests compare the kernels' output with a reference
that drops by it.
"""

import struct

#: Philox4x32's multipliers and key increments (Salmon et al. 2011, Table 2).
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_WORD = 0xFFFFFFFF
#: Each call advances the generator's offset by this (PyTorch's offsets are multiples of 4).
OFFSET_INCREMENT = 4


def as_float32(p):
    """``p`` rounded to float32, as the native half takes it."""
    return struct.unpack("f", struct.pack("f", p))[0]


def drop_below(p):
    """The smallest kept 16-bit value for probability ``p``: p (as float32) rounded to
    1/65536, as ``flash_kernels::common::dropout::drop_below``."""
    return min(int(as_float32(p) * 65536.0 + 0.5), 65536)


def keep_scale(p):
    """1 / (1 - p) for p as the kernels round it: what each kept probability is multiplied by."""
    threshold = drop_below(p)
    return 1.0 if threshold >= 65536 else 65536.0 / (65536 - threshold)


def generator_state(device):
    """(seed, offset) for one call's dropout on ``device``, from PyTorch's default generator of
    that device (its offset advanced past this call's). A CPU device (the wiring tests) draws
    the seed from PyTorch's CPU generator instead, offset 0."""
    import torch

    if device.type != "cuda":
        return int(torch.randint(0, 2**62, (1,)).item()), 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    generator = torch.cuda.default_generators[index]
    seed, offset = generator.initial_seed(), generator.get_offset()
    generator.set_offset(offset + OFFSET_INCREMENT)
    return seed, offset


def state_tensor(seed, offset):
    """(seed, offset) as flash-attn's ``rng_state``: an int64 CPU tensor of two (the seed's 64
    bits as they are)."""
    import torch

    signed = seed - 2**64 if seed >= 2**63 else seed
    return torch.tensor([signed, offset], dtype=torch.int64)


def from_state_tensor(rng_state):
    """``state_tensor``'s (seed, offset) back."""
    seed, offset = (int(x) for x in rng_state.tolist())
    return seed & (2**64 - 1), offset


def _mul_hi_lo(x, multiplier):
    """(high, low) 32-bit words of x * multiplier for int64 tensors of 32-bit values, in 16-bit
    pieces so nothing overflows 63 bits."""
    x_hi, x_lo = x >> 16, x & 0xFFFF
    m_hi, m_lo = multiplier >> 16, multiplier & 0xFFFF
    middle = x_hi * m_lo + x_lo * m_hi
    low = x_lo * m_lo + ((middle & 0xFFFF) << 16)
    high = x_hi * m_hi + (middle >> 16) + (low >> 32)
    return high & _WORD, low & _WORD


def philox4x32_10(counter, key):
    """Philox4x32-10 of four int64 tensors of 32-bit counter words (broadcast together) and a key
    of two ints; returns the four output words as int64 tensors."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + _W0) & _WORD, (k1 + _W1) & _WORD
        hi0, lo0 = _mul_hi_lo(c0, _M0)
        hi1, lo1 = _mul_hi_lo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def keep_mask(p, seed, offset, heads, seqlen_q, seqlen_k, device):
    """The kernels' dropout mask, True where a probability is kept: bool (len(heads), seqlen_q,
    seqlen_k) for the global heads ``heads`` (sequence * query heads + head) over rows and keys
    counted from each sequence's start."""
    import torch

    threshold = drop_below(p)
    key = (seed & _WORD, ((seed >> 32) ^ (offset >> 32)) & _WORD)
    i = torch.arange(seqlen_q, device=device, dtype=torch.int64)[:, None]
    j = torch.arange(seqlen_k, device=device, dtype=torch.int64)[None, :]
    r, c = i % 16, j % 16
    draw = 4 * (r % 8) + (c % 8) // 2
    word = 2 * (r // 8) + c // 8
    half = c % 2
    c0 = 32 * (j // 16) + draw
    c1 = (i // 16).expand(seqlen_q, seqlen_k)
    masks = []
    for head in heads:
        c2 = torch.full_like(c1, int(head))
        c3 = torch.full_like(c1, offset & _WORD)
        words = philox4x32_10((c0.expand_as(c1), c1, c2, c3), key)
        chosen = torch.stack(words).gather(0, word.expand_as(c1)[None])[0]
        masks.append(((chosen >> (16 * half)) & 0xFFFF) >= threshold)
    return torch.stack(masks)


def block_size_n(device, head_dim, causal):
    """flash-attn's key block with dropout on ``device``'s compute capability, the blocks its
    ``S_dmask`` is scaled by (flash-attn's tests normalize it with the same rule)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device) if device.type == "cuda" else (9, 0)
    sm8x = major == 8 and minor > 0
    if head_dim <= 32:
        return 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        return 32
    if head_dim <= 160:
        return 64 if sm8x else 32
    return 64


def _round_up(n, m):
    return (n + m - 1) // m * m


def attention_probs(q, k, softmax_scale, causal, window, softcap, alibi_slopes, p, seed, offset,
                    sequences=None):
    """flash-attn's ``S_dmask``: (batch, heads, seqlen_q rounded up to 128, seqlen_k rounded up
    to 128) in q's dtype, each visible score's exp(s - m_j), m_j the largest score of its key
    block and those after it (flash-attn's kernel walks the blocks backwards; its tests
    normalize by the same blocks, ``block_size_n``), negated where dropout dropped it, 0 where
    the mask hides it or past the sequences. ``q`` (batch, seqlen_q, heads, d) and ``k``
    (batch, seqlen_k, heads_kv, d) are flash-attn's layout; with ``sequences`` (the offsets of a
    packed batch, as lists) they are packed (total, heads, d) and each sequence sits at the top
    left of its own batch row. For tests and inspection: float32 math over the whole matrix."""
    import torch

    if sequences is None:
        batch, seqlen_q, heads, head_dim = q.shape
        seqlen_k = k.shape[1]
        rows = [(b, q[b], k[b]) for b in range(batch)]
    else:
        cu_q, cu_k = sequences
        batch, heads, head_dim = len(cu_q) - 1, q.shape[1], q.shape[2]
        seqlen_q = max(b - a for a, b in zip(cu_q, cu_q[1:]))
        seqlen_k = max(b - a for a, b in zip(cu_k, cu_k[1:]))
        rows = [(b, q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b + 1]]) for b in range(batch)]
    scale = head_dim**-0.5 if softmax_scale is None else softmax_scale
    out = torch.zeros(batch, heads, _round_up(seqlen_q, 128), _round_up(seqlen_k, 128),
                      dtype=q.dtype, device=q.device)
    block = block_size_n(q.device, head_dim, causal)
    for b, q_b, k_b in rows:
        n_q, n_k = q_b.shape[0], k_b.shape[0]
        if n_q == 0 or n_k == 0:
            continue
        k_b = k_b.repeat_interleave(heads // k_b.shape[1], dim=1)
        s = torch.einsum("qhd,khd->hqk", q_b.float(), k_b.float()) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q)
        j = torch.arange(n_k, device=q.device)[None, :]
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
            s = s - slopes.float()[:, None, None] * (i - j).abs().float()
        left, right = window if window is not None else (-1, -1)
        visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
        if left >= 0:
            visible &= j >= i - left
        if causal or right >= 0:
            visible &= j <= i + (0 if causal else right)
        s = s.masked_fill(~visible, float("-inf"))
        padded = torch.nn.functional.pad(s, (0, _round_up(n_k, block) - n_k), value=float("-inf"))
        block_max = padded.unflatten(-1, (-1, block)).amax(-1)
        later_max = block_max.flip(-1).cummax(-1).values.flip(-1)
        m = later_max.repeat_interleave(block, dim=-1)[..., :n_k]
        probs = torch.where(visible, torch.exp(s - m), 0.0)
        kept = keep_mask(p, seed, offset, [b * heads + h for h in range(heads)], n_q, n_k,
                         q.device)
        out[b, :, :n_q, :n_k] = torch.where(kept, probs, -probs).to(q.dtype)
    return out
