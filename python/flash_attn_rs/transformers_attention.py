"""Routes a ``transformers`` model's attention to flash_attn_rs, through transformers' own
registration (``AttentionInterface.register``)::

    from flash_attn_rs.transformers_attention import register
    name = register()                          # "rust_fa"
    model = LlamaForCausalLM(config).cuda()    # or any model that dispatches on
    model.set_attn_implementation(name)        # config._attn_implementation

Q, K and V are read in place (the model's (batch, heads, seqlen, head_dim) views of its
projections); the output comes back in the (batch, seqlen, heads, head_dim) layout the model
reshapes next, so the call adds no copy. Grouped-query attention passes K and V with their own
(fewer) heads: the kernels read K/V head h // groups for query head h in place, forward and
backward (dK and dV summed over each group), where transformers' SDPA path without
``enable_gqa`` repeats them first.

Taken as transformers' flash-attention integration takes them: a layer's ``sliding_window``
(Mistral, Gemma 2's sliding layers: each query sees itself and the ``sliding_window - 1`` keys
before it, flash-attn's ``window_size = (sliding_window - 1, sliding_window - 1)`` under the causal
mask) and ``softcap`` (Gemma 2's ``attn_logit_softcapping``), forward and backward; packed
documents without padding (``DataCollatorWithFlattening``): with ``cu_seq_lens_q``,
``cu_seq_lens_k``, ``max_length_q`` and ``max_length_k`` the call is ``flash_attn_varlen_func``
over the batch's rows, each document attending to itself only, with no host synchronization;
with ``position_ids`` alone that restart at 0 inside a batch of one row, the documents' offsets
are found from them on the GPU, as transformers' flash-attention path finds them (its test for
packing and the longest document's length: two synchronizations, once per forward, as every
layer gets the same position_ids; pass the four kwargs to avoid them).

A layer's ``dropout`` (transformers passes ``attention_dropout`` in training, 0 in evaluation)
is flash-attn's ``dropout_p``. What the kernels do not have is refused with a ValueError, never
silently dropped: a padding or custom attention mask, a position bias, attention sinks (``s_aux``), attention weights
(``output_attentions``).
"""

import weakref

from . import flash_attn_func, flash_attn_varlen_func

#: The name ``register`` uses unless told otherwise. Not "flash…": transformers takes any
#: implementation whose name contains "flash" for a flash-attention kernel to import.
NAME = "rust_fa"


def _refuse(name, value, why):
    raise ValueError(f"flash_attn_rs attention: {name} is {value!r}; {why}")


def make_attention_forward(algorithm=None):
    """An attention function with transformers' signature
    ``(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
    **kwargs) -> (output, None)`` that runs ``flash_attn_func`` with ``algorithm``."""

    def attention_forward(
        module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
        **kwargs,
    ):
        if attention_mask is not None:
            _refuse(
                "attention_mask",
                f"a tensor of shape {tuple(attention_mask.shape)}",
                "the kernels take no mask: pass unpadded batches (no padding token), or use "
                "attn_implementation='sdpa' for padded ones",
            )
        if kwargs.get("output_attentions"):
            _refuse("output_attentions", True, "the kernels never form the attention weights")
        for name in ("position_bias", "s_aux"):
            if kwargs.get(name) is not None:
                _refuse(name, kwargs[name], "the kernels have no such term")
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        sliding_window = kwargs.get("sliding_window")
        # transformers' rule for flash-attn (`_process_flash_attention_kwargs`): the query and
        # the sliding_window - 1 keys before it (and after it, without the causal mask).
        window = (-1, -1) if sliding_window is None else (sliding_window - 1, sliding_window - 1)
        options = dict(dropout_p=float(dropout or 0.0), softmax_scale=scaling,
                       causal=bool(is_causal), window_size=window,
                       softcap=kwargs.get("softcap") or 0.0, algorithm=algorithm)
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        packed = _packed_documents(q, kwargs)
        if packed is not None:
            # Bottom-right alignment inside each document: its own queries against its own keys.
            rows = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
            output = flash_attn_varlen_func(*rows, *packed, **options)
            return output.view(q.shape), None
        # Bottom-right alignment: also right for decoding with a cache (one query sees every key).
        return flash_attn_func(q, k, v, **options), None

    return attention_forward


def _packed_documents(q, kwargs):
    """The offsets and bounds of packed documents, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k), or None for a batch of whole sequences: transformers' flash-attention kwargs
    as given, or found from ``position_ids`` that restart at 0 inside one row (q: (batch, seqlen,
    heads, d))."""
    names = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    given = [kwargs.get(name) for name in names]
    if all(value is not None for value in given):
        cu_q, cu_k, max_q, max_k = given
        return cu_q, cu_k, int(max_q), int(max_k)
    if any(value is not None for value in given):
        missing = [name for name, value in zip(names, given) if value is None]
        _refuse(", ".join(missing), None, "packed documents take all four of " + ", ".join(names))
    position_ids = kwargs.get("position_ids")
    if position_ids is None or q.shape[0] != 1 or q.shape[1] < 2:
        return None
    if position_ids.numel() != q.shape[1]:
        return None
    # Every layer of a forward gets the same position_ids: read them once per forward.
    cached_ref, version, documents = _last_positions
    if cached_ref is not None and cached_ref() is position_ids and version == position_ids._version:
        return documents
    documents = _documents_from_positions(position_ids.reshape(-1), q.shape[1])
    _last_positions[:] = [weakref.ref(position_ids), position_ids._version, documents]
    return documents


#: (weak reference to the last position_ids read, their version, the documents found in them).
_last_positions = [None, None, None]


def _documents_from_positions(positions, rows):
    """The packed documents of one row of ``positions`` (``_packed_documents``' tuple), or None
    for one run of consecutive positions."""
    import torch

    # transformers' test (`_is_packed_sequence`): one row of positions that is not one run of
    # consecutive ones (a prefill after a cache starts past 0 and is one run).
    consecutive = torch.arange(positions.numel(), device=positions.device) + positions.min()
    if not bool((consecutive - positions).abs().sum()):
        return None
    # Each document starts where its positions restart at 0; rows before the first 0 are one
    # more document, so that every row is attended.
    starts = torch.nonzero(positions == 0).reshape(-1)
    ends = torch.tensor([0, rows], device=starts.device)
    cu_seqlens = torch.cat([ends[:1], starts, ends[1:]]).unique_consecutive().to(torch.int32)
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return cu_seqlens, cu_seqlens, longest, longest


def register(name=NAME, algorithm=None):
    """Registers ``name`` with transformers' ``AttentionInterface`` (the attention function) and
    ``AttentionMaskInterface`` (transformers' flash-attention mask rule: None unless there is
    padding, so a padded batch reaches the function and is refused instead of being silently
    attended over). Returns ``name`` for ``model.set_attn_implementation``; a name containing
    "flash" is refused (transformers would try to import it as a flash-attention kernel)."""
    if "flash" in name:
        raise ValueError(f"name is {name!r}; transformers imports any attention named "
                         "'*flash*' as a flash-attention kernel: choose another")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, make_attention_forward(algorithm))
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
