"""Decoder sizes and their parameter / FLOP counts, computed from the shapes alone (no model built).

The real sizes are HuggingFace ``LlamaForCausalLM`` at the shapes of our anchors (untied LM head,
vocabulary 32000): 124.7M, 494.7M and 1100.0M parameters, counted the way HF counts them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a LLaMA-style decoder (grouped-query attention, SwiGLU MLP, RMSNorm, RoPE)."""

    vocab_size: int = 32000
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    n_kv_heads: int = 4
    ffn_dim: int = 2048
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    qk_norm: bool = False
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads or self.head_dim % 2:
            raise ValueError(
                f"need n_heads | d_model, n_kv_heads | n_heads and an even head_dim: {self}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


CONFIGS: dict[str, ModelConfig] = {
    # Runs a training step on a CPU in well under a second (tests, smoke runs).
    "tiny": ModelConfig(
        vocab_size=1000,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=176,
        max_seq_len=128,
    ),
    "100M": ModelConfig(d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048),
    "500M": ModelConfig(d_model=1536, n_layers=16, n_heads=16, n_kv_heads=4, ffn_dim=4096),
    "1B": ModelConfig(d_model=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_dim=5632),
}


def param_count(cfg: ModelConfig, include_embedding: bool = True) -> int:
    """Parameters of ``Decoder(cfg)``: blocks, final norm and LM head, plus the embedding table if
    asked.

    A tied embedding is the LM head, so it is counted once, and always.
    """
    d, hd = cfg.d_model, cfg.head_dim
    attn = 2 * d * cfg.n_heads * hd + 2 * d * cfg.n_kv_heads * hd  # q, o and k, v projections
    mlp = 3 * d * cfg.ffn_dim  # gate, up, down
    norms = 2 * d + (2 * hd if cfg.qk_norm else 0)
    head = cfg.vocab_size * d
    embedding = head if include_embedding and not cfg.tie_embeddings else 0
    return cfg.n_layers * (attn + mlp + norms) + d + head + embedding


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token, the anchors' MFU formula: 6 N + 12 L d S.

    N counts every parameter except the embedding lookup table (the LM head is a matmul, so it is
    in); 12 L d S is the attention score and value matmuls, forward and backward, without causal
    discount.
    """
    return (
        6.0 * param_count(cfg, include_embedding=False)
        + 12.0 * cfg.n_layers * cfg.d_model * seq_len
    )
