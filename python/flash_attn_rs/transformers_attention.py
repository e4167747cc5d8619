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
``enable_gqa`` repeats them first. What the kernels do not have is refused with
a ValueError, never silently dropped: a padding or custom attention mask, dropout, a position
bias, a sliding window, attention weights (``output_attentions``).
"""

from . import flash_attn_func

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
        if dropout:
            _refuse("dropout", dropout, "the kernels have no dropout: set attention_dropout=0")
        if kwargs.get("output_attentions"):
            _refuse("output_attentions", True, "the kernels never form the attention weights")
        for name in ("position_bias", "sliding_window", "softcap", "s_aux"):
            if kwargs.get(name) is not None:
                _refuse(name, kwargs[name], "the kernels have no such term")
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        # Bottom-right alignment: also right for decoding with a cache (one query sees every key).
        output = flash_attn_func(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            softmax_scale=scaling,
            causal=bool(is_causal),
            algorithm=algorithm,
        )
        return output, None

    return attention_forward


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
