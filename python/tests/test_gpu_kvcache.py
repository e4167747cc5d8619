"""flash_attn_with_kvcache (decoding against a KV cache, flash-attn's call) on the GPU against the
float64 reference of each sequence's keys, with the forward's bound rule (test_gpu_numerics.py):
contiguous and paged caches, appended keys and values (checked in the caches), grouped K/V heads,
1 and 16 query tokens, causal and not, lengths from 0 up to the capacity, f16 and bf16, head dims
64 and 128; and what is refused."""

from gpu_support import generator, randn, torch

import pytest
import reference as ref
from test_gpu_numerics import DTYPES, assert_within, seed_of

import flash_attn_rs

PAGE = 16


def gathered(cache, table, b, positions):
    """Keys (or values) at `positions` of sequence b, in SDPA layout (1, heads_kv, n, d)."""
    if table is None:
        rows = cache[b, list(positions)]
    else:
        rows = torch.stack([cache[table[b][p // PAGE], p % PAGE] for p in positions]) \
            if positions else cache[0, :0]
    return rows.to(torch.float64).transpose(0, 1)[None]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("tokens, causal", [(1, False), (16, True), (3, True)])
def test_kvcache_against_the_reference(dtype, d, paged, tokens, causal):
    test = f"kvcache {dtype} d={d} paged={paged} tokens={tokens} causal={causal}"
    torch_dtype = DTYPES[dtype]
    g = generator(seed_of(test))
    batch, heads, heads_kv, capacity = 3, 8, 2, 96
    lengths = [0, 37, capacity - tokens]
    q = randn((batch, tokens, heads, d), torch_dtype, g)
    k_new, v_new = (randn((batch, tokens, heads_kv, d), torch_dtype, g) for _ in range(2))
    if paged:
        pages = batch * capacity // PAGE
        k_cache, v_cache = (randn((pages, PAGE, heads_kv, d), torch_dtype, g) for _ in range(2))
        # Pages shuffled across sequences.
        order = torch.randperm(pages, generator=torch.Generator().manual_seed(seed_of(test)))
        table = order.reshape(batch, capacity // PAGE).to(torch.int32)
        table_list = table.tolist()
    else:
        k_cache, v_cache = (randn((batch, capacity, heads_kv, d), torch_dtype, g)
                            for _ in range(2))
        table, table_list = None, None
    o, lse = flash_attn_rs.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
        block_table=table, causal=causal, return_softmax_lse=True)
    plan = flash_attn_rs.last_plan()
    assert "decode" in plan, plan
    for b, length in enumerate(lengths):
        new_positions = range(length, length + tokens)
        assert torch.equal(gathered(k_cache, table_list, b, new_positions),
                           k_new[b].to(torch.float64).transpose(0, 1)[None])
        assert torch.equal(gathered(v_cache, table_list, b, new_positions),
                           v_new[b].to(torch.float64).transpose(0, 1)[None])
        keys = range(length + tokens)
        kb, vb = (gathered(c, table_list, b, keys) for c in (k_cache, v_cache))
        qb = q[b].to(torch.float64).transpose(0, 1)[None]
        o_ref, lse_ref = ref.attention64(qb, kb, vb, causal, d**-0.5)
        o_dtype = ref.attention_in_dtype(qb, kb, vb, causal, d**-0.5, torch_dtype)
        got = o[b].to(torch.float64).transpose(0, 1)[None]
        assert_within(f"{test} b={b}", "o", got, o_ref,
                      ref.forward_bound(o_ref, o_dtype, torch_dtype), plan)
        assert ref.logsumexp_error(lse[b][None], lse_ref) <= ref.LOGSUMEXP_TOLERANCE


def test_kvcache_refuses_what_it_lacks_and_bad_lengths():
    g = generator(21)
    q = randn((1, 1, 4, 64), torch.bfloat16, g)
    k_cache, v_cache = (randn((1, 32, 4, 64), torch.bfloat16, g) for _ in range(2))
    with pytest.raises(ValueError, match="rotary_cos"):
        flash_attn_rs.flash_attn_with_kvcache(q, k_cache, v_cache, rotary_cos=q, rotary_sin=q)
    with pytest.raises(ValueError, match="`cache_seqlens`"):
        flash_attn_rs.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=33)
    with pytest.raises(ValueError, match="`head_dim`: got 96"):
        flash_attn_rs.flash_attn_with_kvcache(
            randn((1, 1, 4, 96), torch.bfloat16, g), *(randn((1, 32, 4, 96), torch.bfloat16, g)
                                                       for _ in range(2)))
