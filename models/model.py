"""A LLaMA-style decoder: pre-norm RMSNorm, RoPE, grouped-query SDPA attention, SwiGLU MLP.

Shapes and init follow HuggingFace ``LlamaForCausalLM`` (rotate_half RoPE, N(0, 0.02) weights); an
optional QK-norm (per-head RMSNorm of q and k before RoPE) is the Qwen3 variant. ``forward`` returns
the final-normed hidden states: the training step applies ``lm_head`` and the loss, so that fused
LM-head + cross-entropy kernels can take the hidden states and ``lm_head.weight``.

Kernel choices are constructor switches ('eager' is the reference, kept beside each kernel in
kernels/); Liger-Kernel is imported lazily, so that without it only the switches that need it fail.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from kernels.rmsnorm import RMSNorm
from kernels.rope import qkv_rope, rope_eager, rope_tables
from kernels.swiglu import swiglu, swiglu_eager, swiglu_packed
from models.config import ModelConfig

ATTN_MASKS = ("is_causal", "cached", "rebuilt")


def rms_norm(dim: int, eps: float, impl: str) -> nn.Module:
    """An RMSNorm layer with a ``weight`` of size dim: 'eager' | 'triton' (kernels.rmsnorm) or
    'liger'."""
    if impl == "liger":
        from kernels.liger import liger

        return liger("transformers").LigerRMSNorm(dim, eps=eps)
    return RMSNorm(dim, eps=eps, impl=impl)


def swiglu_fn(impl: str) -> Callable[[Tensor, Tensor], Tensor]:
    """silu(a) * b: 'eager' | 'triton' (kernels.swiglu) or 'liger'."""
    if impl == "liger":
        from kernels.liger import liger

        return liger("ops.swiglu").LigerSiLUMulFunction.apply
    fns = {"eager": swiglu_eager, "triton": swiglu}
    if impl not in fns:
        raise ValueError(f"mlp impl must be 'eager', 'triton' or 'liger', got {impl!r}")
    return fns[impl]


class FusedLinear(nn.Linear):
    """Bias-free Linear layers that share one input, as one: their weights stacked by rows, so one
    GEMM computes all of their outputs and one their input gradient. Its output holds the parts'
    side by side."""

    def __init__(self, parts: dict[str, nn.Linear]):
        first = next(iter(parts.values()))
        super().__init__(
            first.in_features,
            sum(p.out_features for p in parts.values()),
            bias=False,
            device="meta",
        )
        self.weight = nn.Parameter(torch.cat([p.weight.detach() for p in parts.values()]))
        self.parts = {name: p.out_features for name, p in parts.items()}  # part name -> its rows

    def split(self, y: Tensor) -> tuple[Tensor, ...]:
        """This layer's output y cut into the parts' outputs."""
        return y.split(list(self.parts.values()), dim=-1)


def _attends_in_half(q: Tensor) -> bool:
    """Whether SDPA computes attention of ``q`` in half precision: ``q`` is fp16 or bf16, or
    autocast to one of them is on for its device (which casts SDPA's inputs)."""
    half, kind = (torch.float16, torch.bfloat16), q.device.type
    return q.dtype in half or (
        torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) in half
    )


class Attention(nn.Module):
    """Grouped-query attention through F.scaled_dot_product_attention, with optional QK-norm. RoPE
    'eager' rotates q and k as HF does; 'triton' (fused projections, no QK-norm) rotates them
    straight out of the packed q/k/v output and writes its gradient in one piece (kernels.rope)."""

    def __init__(self, cfg: ModelConfig, qk_norm_impl: str, rope_impl: str = "eager"):
        super().__init__()
        if rope_impl not in ("eager", "triton"):
            raise ValueError(f"rope impl must be 'eager' or 'triton', got {rope_impl!r}")
        self.rope_impl = rope_impl
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.qk_norm = None
        if cfg.qk_norm:
            from kernels.qknorm import QKNorm

            self.qk_norm = QKNorm(cfg.head_dim, eps=cfg.norm_eps, impl=qk_norm_impl)
        self.qkv_proj: FusedLinear | None = None

    def fuse(self) -> None:
        """q, k and v projections as one GEMM (the same weights)."""
        self.qkv_proj = FusedLinear(
            {"q_proj": self.q_proj, "k_proj": self.k_proj, "v_proj": self.v_proj}
        )
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        """mask: None for causal attention through ``is_causal``, else a boolean (S, S) 'may attend'
        mask."""
        B, S, _ = x.shape
        if self.rope_impl == "triton":
            qkv = self.qkv_proj(x).view(B, S, -1, self.head_dim)
            q, k, v = qkv_rope(qkv, cos, sin, self.n_heads, self.n_kv_heads)
        else:
            projected = (
                self.qkv_proj.split(self.qkv_proj(x))
                if self.qkv_proj is not None
                else (self.q_proj(x), self.k_proj(x), self.v_proj(x))
            )
            q, k, v = (t.view(B, S, -1, self.head_dim) for t in projected)
            if self.qk_norm is not None:
                q, k = self.qk_norm(q, k)
            q, k = rope_eager(q, cos, sin), rope_eager(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if mask is None and _attends_in_half(q):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            # SDPA's kernels that take enable_gqa (flash, cuDNN) take half precision only, and
            # none takes it with a mask: otherwise SDPA falls back to the math kernel, which holds
            # the B x H x S x S scores (fp32 at 1B, B=8, S=1024: 1 GiB a layer, and the check's
            # fp32 reference step outgrows an 80 GB GPU). So expand kv heads, as HF does.
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.o_proj(y.transpose(1, 2).reshape(B, S, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, impl: str):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)
        self.impl, self.act = impl, swiglu_fn(impl)
        self.gate_up_proj: FusedLinear | None = None

    def fuse(self) -> None:
        """gate and up projections as one GEMM (the same weights)."""
        self.gate_up_proj = FusedLinear({"gate_proj": self.gate_proj, "up_proj": self.up_proj})
        del self.gate_proj, self.up_proj

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up_proj is None:
            return self.down_proj(self.act(self.gate_proj(x), self.up_proj(x)))
        gate_up = self.gate_up_proj(x)
        # reads both halves in place and writes their gradient in one piece
        if self.impl == "triton":
            return self.down_proj(swiglu_packed(gate_up))
        return self.down_proj(self.act(*self.gate_up_proj.split(gate_up)))


def add_and_norm(norm: nn.Module, x: Tensor, branch: Tensor | None) -> tuple[Tensor, Tensor]:
    """(h = x + branch, norm(h)): a residual add and the pre-norm after it (branch None: no add). A
    norm with an ``add_and_norm`` method (ours; with impl 'triton' one kernel each way) does both
    itself."""
    if branch is None:
        return x, norm(x)
    if hasattr(norm, "add_and_norm"):
        return norm.add_and_norm(x, branch)
    h = x + branch
    return h, norm(h)


class Block(nn.Module):
    """Pre-norm residual block, x + attn(norm(x)), then + mlp(norm(.)). It takes the residual stream
    and the previous block's MLP output not yet added (None for the first block) and returns the
    same pair, so that each residual add and the norm after it are one step
    (:func:`add_and_norm`)."""

    def __init__(
        self,
        cfg: ModelConfig,
        norm_impl: str,
        mlp_impl: str,
        qk_norm_impl: str,
        rope_impl: str = "eager",
    ):
        super().__init__()
        self.attn_norm = rms_norm(cfg.d_model, cfg.norm_eps, norm_impl)
        self.attn = Attention(cfg, qk_norm_impl, rope_impl)
        self.mlp_norm = rms_norm(cfg.d_model, cfg.norm_eps, norm_impl)
        self.mlp = MLP(cfg, mlp_impl)

    def forward(
        self, x: Tensor, branch: Tensor | None, cos: Tensor, sin: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        x, normed = add_and_norm(self.attn_norm, x, branch)
        x, normed = add_and_norm(self.mlp_norm, x, self.attn(normed, cos, sin, mask))
        return x, self.mlp(normed)


class Decoder(nn.Module):
    """Token ids (B, S) -> final-normed hidden states (B, S, d_model); ``lm_head`` is applied by the
    caller.

    attn_mask: 'is_causal' passes ``is_causal=True`` to SDPA; 'cached' slices a registered boolean
    causal mask; 'rebuilt' builds ``torch.triu(torch.ones(S, S), 1)`` on every forward (the seeds'
    slow path). ``checkpoint_every = k > 0`` recomputes every k-th block (blocks k-1, 2k-1, ...) in
    the backward. ``fused_proj`` computes q, k, v with one GEMM and gate, up with another
    (:class:`FusedLinear`), from the weights the separate layers were initialized with;
    :meth:`unfused` names its tensors as the separate ones'. ``rope_impl`` 'triton' (with
    fused_proj) rotates q and k straight out of the packed projection.
    """

    checkpoint_every: int = 0

    def __init__(
        self,
        cfg: ModelConfig,
        norm_impl: str = "eager",
        mlp_impl: str = "eager",
        qk_norm_impl: str = "eager",
        attn_mask: str = "is_causal",
        fused_proj: bool = False,
        rope_impl: str = "eager",
    ):
        super().__init__()
        if attn_mask not in ATTN_MASKS:
            raise ValueError(f"attn_mask must be one of {ATTN_MASKS}, got {attn_mask!r}")
        if rope_impl != "eager" and (not fused_proj or cfg.qk_norm):
            raise ValueError(
                f"rope impl {rope_impl!r} takes the packed q/k/v projection: it needs fused_proj "
                "and no QK-norm"
            )
        self.cfg, self.attn_mask = cfg, attn_mask
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(
            Block(cfg, norm_impl, mlp_impl, qk_norm_impl, rope_impl) for _ in range(cfg.n_layers)
        )
        self.norm = rms_norm(cfg.d_model, cfg.norm_eps, norm_impl)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        if attn_mask == "cached":
            causal = torch.ones(cfg.max_seq_len, cfg.max_seq_len, dtype=torch.bool).tril()
            self.register_buffer("causal_mask", causal, persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if fused_proj:  # after the init, so that the weights are those of the unfused model
            for block in self.blocks:
                block.attn.fuse()
                block.mlp.fuse()

    def unfused(self, named: dict[str, Tensor]) -> dict[str, Tensor]:
        """Tensors named by this model's parameters (e.g. gradients), a fused weight split into the
        separate layers' names and rows, so that a fused model compares with an unfused one
        parameter by parameter."""
        fused = {name: m.parts for name, m in self.named_modules() if isinstance(m, FusedLinear)}
        out = {}
        for name, tensor in named.items():
            owner, _, leaf = name.rpartition(".")
            if owner not in fused:
                out[name] = tensor
                continue
            prefix = owner.rpartition(".")[0]
            for part, piece in zip(fused[owner], tensor.split(list(fused[owner].values()))):
                out[f"{prefix}.{part}.{leaf}"] = piece
        return out

    def _mask(self, S: int, device: torch.device) -> Tensor | None:
        if self.attn_mask == "cached":
            return self.causal_mask[:S, :S]
        if self.attn_mask == "rebuilt":
            return ~torch.triu(torch.ones(S, S, device=device), diagonal=1).bool()
        return None

    def forward(self, idx: Tensor) -> Tensor:
        S = idx.shape[1]
        x, branch = self.embed(idx), None
        cos, sin, mask = self.cos[:S], self.sin[:S], self._mask(S, idx.device)
        for i, block in enumerate(self.blocks):
            if self.checkpoint_every and (i + 1) % self.checkpoint_every == 0:
                x, branch = checkpoint(block, x, branch, cos, sin, mask, use_reentrant=False)
            else:
                x, branch = block(x, branch, cos, sin, mask)
        return add_and_norm(self.norm, x, branch)[1]
