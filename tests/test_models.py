"""The decoder and its configs: parameter and FLOP counts, shapes, causality, RoPE,
checkpointing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.rope import rope_eager, rope_tables
from models.config import CONFIGS, ModelConfig, flops_per_token, param_count
from models.model import ATTN_MASKS, Decoder

TINY = CONFIGS["tiny"]
# HF LlamaForCausalLM at the anchors' shapes: sum(p.numel() for p in model.parameters()), in
# millions.
HF_PARAMS_M = {"100M": 124.7, "500M": 494.7, "1B": 1100.0}


def _meta_model(cfg: ModelConfig) -> Decoder:
    with torch.device("meta"):
        return Decoder(cfg)


@pytest.mark.parametrize("size", list(HF_PARAMS_M))
def test_param_count_matches_hf(size):
    assert abs(param_count(CONFIGS[size]) / 1e6 - HF_PARAMS_M[size]) < 0.1


@pytest.mark.parametrize(
    "cfg",
    [
        *CONFIGS.values(),
        dataclasses.replace(TINY, qk_norm=True),
        dataclasses.replace(TINY, tie_embeddings=True),
    ],
)
def test_param_count_matches_built_model(cfg):
    model = _meta_model(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert param_count(cfg) == n
    table = 0 if cfg.tie_embeddings else model.embed.weight.numel()
    assert param_count(cfg, include_embedding=False) == n - table


@pytest.mark.parametrize("size", ["100M", "1B"])
def test_flops_per_token_is_the_anchors_formula(size):
    cfg, seq = CONFIGS[size], 1024
    model = _meta_model(cfg)
    n = sum(p.numel() for p in model.parameters())
    n_emb = model.embed.weight.numel()
    assert flops_per_token(cfg, seq) == 6 * (n - n_emb) + 12 * cfg.n_layers * cfg.d_model * seq


@pytest.mark.parametrize("attn_mask", ATTN_MASKS)
@pytest.mark.parametrize("qk_norm", [False, True])
def test_forward_is_causal_with_the_right_shape(attn_mask, qk_norm):
    torch.manual_seed(0)
    model = Decoder(dataclasses.replace(TINY, qk_norm=qk_norm), attn_mask=attn_mask)
    idx = torch.randint(0, TINY.vocab_size, (2, 32))
    changed = idx.clone()
    changed[:, 20] = (changed[:, 20] + 1) % TINY.vocab_size
    with torch.no_grad():
        out, out_changed = model(idx), model(changed)
    assert out.shape == (2, 32, TINY.d_model)
    torch.testing.assert_close(out[:, :20], out_changed[:, :20])
    assert not torch.allclose(out[:, 20:], out_changed[:, 20:])


def test_causal_attention_expands_kv_heads_unless_it_attends_in_half(monkeypatch):
    """Mutation: fp32 attention through SDPA's GQA path (enable_gqa) falls back to the math kernel
    on a GPU, whose B x H x S x S scores outgrew an 80 GB GPU in the 1B check's fp32 reference.
    fp32 expands the kv heads and computes what the GQA path computes; under bf16 autocast the
    GQA path stays."""
    import torch.nn.functional as F

    sdpa, calls = F.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("enable_gqa", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    model = Decoder(TINY, attn_mask="is_causal")
    idx = torch.randint(0, TINY.vocab_size, (2, 32))
    with torch.no_grad():
        expanded = model(idx)
        assert calls == [False] * TINY.n_layers
        monkeypatch.setattr("models.model._attends_in_half", lambda q: True)
        torch.testing.assert_close(model(idx), expanded)
        monkeypatch.undo()
        monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
        calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(idx)
    assert calls == [True] * TINY.n_layers


def test_rope_is_a_relative_rotation():
    torch.manual_seed(0)
    cos, sin = rope_tables(TINY.max_seq_len, TINY.head_dim, TINY.rope_theta)
    # one vector at every position
    q, k = (torch.randn(TINY.head_dim).expand(1, 40, 1, -1) for _ in range(2))
    rq, rk = rope_eager(q, cos[:40], sin[:40]), rope_eager(k, cos[:40], sin[:40])
    torch.testing.assert_close(rq[:, 0], q[:, 0])  # position 0 is not rotated
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    scores = rq[0, :, 0] @ rk[0, :, 0].T  # <q at m, k at n> depends on m - n only
    torch.testing.assert_close(
        scores.diagonal(3)[:-1], scores.diagonal(3)[1:], atol=1e-5, rtol=1e-5
    )


def test_init_follows_hf():
    torch.manual_seed(0)
    model = Decoder(CONFIGS["tiny"])
    assert abs(model.blocks[0].mlp.up_proj.weight.std().item() - 0.02) < 2e-3
    assert torch.equal(model.norm.weight, torch.ones(TINY.d_model))


@pytest.mark.parametrize("qk_norm", [False, True])
def test_fused_projections_compute_the_unfused_model(qk_norm):
    """One GEMM for q, k, v and one for gate, up: the same init, parameter count, output and
    gradients, and its gradients named and split as the unfused model's."""
    cfg = dataclasses.replace(TINY, qk_norm=qk_norm)
    torch.manual_seed(0)
    plain = Decoder(cfg).double()
    torch.manual_seed(0)
    fused = Decoder(cfg, fused_proj=True).double()
    assert {type(m).__name__ for m in fused.modules()} >= {"FusedLinear"}
    assert not any(
        name.endswith(("q_proj.weight", "gate_proj.weight")) for name, _ in fused.named_parameters()
    )
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in plain.parameters())
    idx = torch.randint(0, cfg.vocab_size, (2, 24))
    for model in (plain, fused):
        model(idx).pow(2).sum().backward()
    torch.testing.assert_close(fused(idx), plain(idx), rtol=1e-12, atol=1e-12)
    grads = fused.unfused({name: p.grad for name, p in fused.named_parameters()})
    weights = fused.unfused(dict(fused.named_parameters()))
    assert grads.keys() == dict(plain.named_parameters()).keys()
    for name, p in plain.named_parameters():
        torch.testing.assert_close(weights[name], p, rtol=0, atol=0)
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-10, atol=1e-12)


def _saved_tensors(model: Decoder, idx: torch.Tensor) -> int:
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx).sum()
    return count


def test_checkpoint_every_saves_fewer_activations():
    torch.manual_seed(0)
    model = Decoder(dataclasses.replace(TINY, n_layers=4))
    idx = torch.randint(0, TINY.vocab_size, (2, 32))
    counts = []
    for every in (0, 2, 1):
        model.checkpoint_every = every
        counts.append(_saved_tensors(model, idx))
    assert counts[0] > counts[1] > counts[2]
