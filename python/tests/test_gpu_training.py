"""Training through the package as a transformers user does, on the GPU: a Gemma-2-style model
(sliding-window layers, logit soft-capping, grouped K/V heads) against transformers' eager
attention, and a Llama on packed documents (one row, position_ids restarting at 0: a
DataCollatorWithFlattening batch) against the same documents run one by one on SDPA. Each run
takes the same AdamW steps from the same random initialisation on the same random tokens; the
rule is the project's 2x one on the loss curve: ours (bf16) may stray from the reference
implementation run in float32 at most twice as far as that implementation run in bf16 does,
plus 1e-3."""

from gpu_support import DEVICE, torch

import copy

import pytest

import flash_attn_rs
from flash_attn_rs.transformers_attention import register

transformers = pytest.importorskip("transformers")

STEPS = 8
SLACK = 1e-3


def train(model, batches, loss_of):
    """The loss before each of STEPS AdamW steps (lr 1e-3) on ``batches`` (cycled)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        loss = loss_of(model, batches[step % len(batches)])
        losses.append(loss.item())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return losses


def assert_within_bf16_noise(name, ours, reference_bf16, reference_f32):
    ours_gap = max(abs(a - b) for a, b in zip(ours, reference_f32))
    noise = max(abs(a - b) for a, b in zip(reference_bf16, reference_f32))
    print(f"{name}: ours {ours}\n  reference bf16 {reference_bf16}\n  reference f32 "
          f"{reference_f32}\n  |ours - f32| {ours_gap:.2e}, |bf16 - f32| {noise:.2e}")
    assert ours_gap <= 2 * noise + SLACK, (name, ours_gap, noise)
    # The losses moved: the steps trained something.
    assert reference_f32[-1] < reference_f32[0] - 0.05, reference_f32


def models(config, make, attention, reference):
    """Ours (bf16), the reference implementation in bf16 and in float32, from one init."""
    torch.manual_seed(0)
    base = make(config).to(DEVICE)
    ours = copy.deepcopy(base).to(torch.bfloat16)
    ours.set_attn_implementation(attention)
    reference_bf16 = copy.deepcopy(base).to(torch.bfloat16)
    reference_bf16.set_attn_implementation(reference)
    base.set_attn_implementation(reference)
    return ours, reference_bf16, base


def causal_lm_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def test_gemma2_with_window_and_softcap_trains_as_eager():
    config = transformers.Gemma2Config(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
        sliding_window=64, attn_logit_softcapping=20.0, final_logit_softcapping=30.0,
        query_pre_attn_scalar=64, attention_dropout=0.0,
    )
    g = torch.Generator(device=DEVICE).manual_seed(1)
    batches = [torch.randint(0, 512, (4, 256), device=DEVICE, generator=g) for _ in range(2)]
    ours, eager_bf16, eager_f32 = models(config, transformers.Gemma2ForCausalLM, register(),
                                         "eager")
    curves = [train(m, batches, causal_lm_loss) for m in (ours, eager_bf16, eager_f32)]
    plan = flash_attn_rs.last_plan()
    assert "_local" in plan, plan
    assert_within_bf16_noise("gemma2", *curves)


# Document lengths of one packed row (1024 tokens): short and long, a one-token document.
DOCUMENTS = [100, 300, 1, 47, 256, 200, 120]


def packed_loss(model, ids):
    """Mean next-token loss inside each document of the packed row (no prediction across a
    boundary), computed from one call on the whole row."""
    positions = torch.cat([torch.arange(n, device=DEVICE) for n in DOCUMENTS])[None]
    logits = model(input_ids=ids, position_ids=positions).logits.float()
    return document_loss(logits, ids)


def one_by_one_loss(model, ids):
    """The same loss from each document run alone."""
    logits, start = [], 0
    for n in DOCUMENTS:
        logits.append(model(input_ids=ids[:, start:start + n]).logits.float())
        start += n
    return document_loss(torch.cat(logits, dim=1), ids)


def document_loss(logits, ids):
    losses, start = [], 0
    for n in DOCUMENTS:
        if n > 1:
            losses.append(torch.nn.functional.cross_entropy(
                logits[0, start:start + n - 1], ids[0, start + 1:start + n], reduction="sum"))
        start += n
    return torch.stack(losses).sum() / sum(n - 1 for n in DOCUMENTS if n > 1)


def test_packed_documents_train_as_one_by_one_sdpa():
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
        attention_dropout=0.0,
    )
    g = torch.Generator(device=DEVICE).manual_seed(2)
    batches = [torch.randint(0, 512, (1, sum(DOCUMENTS)), device=DEVICE, generator=g)
               for _ in range(2)]
    ours, sdpa_bf16, sdpa_f32 = models(config, transformers.LlamaForCausalLM, register(),
                                       "sdpa")
    ours_curve = train(ours, batches, packed_loss)
    plan = flash_attn_rs.last_plan()
    assert "_varlen" in plan, plan
    curves = [train(m, batches, one_by_one_loss) for m in (sdpa_bf16, sdpa_f32)]
    assert_within_bf16_noise("packed documents", ours_curve, *curves)
