"""Rotary position embedding (HF rotate_half convention) of a packed q/k/v projection, in Triton.

``qkv_rope`` takes the output of one fused q/k/v GEMM, (B, S, Hq + 2 Hkv, D), and returns q and k
rotated by position and v, each (B, S, heads, D) and contiguous, in one launch. Backward it reads
the three incoming gradients through their strides (SDPA's may come transposed) and writes the
packed gradient of the GEMM's output in one launch: with the eager rotation, autograd rotates dq and
dk back and then concatenates dq, dk and dv in a pass of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import unit_last_stride

# Sources: rotary embeddings are Su et al., "RoFormer: Enhanced Transformer with Rotary Position
# Embedding" (2021, https://arxiv.org/abs/2104.09864), in the layout of Hugging Face's Llama
# (rotate_half over the two halves of head_dim, cos and sin repeated over both halves). Liger's RoPE
# (https://github.com/linkedin/Liger-Kernel/blob/main/src/liger_kernel/ops/rope.py) also runs its
# backward as the forward with sin negated; reading the packed projection and writing its gradient
# in one launch is ours.

TOKENS = 32  # tokens per program; a program handles one head of them
WARPS = 4


def rope_tables(
    max_seq: int, head_dim: int, theta: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (max_seq, 1, head_dim) in fp32, HF layout: each frequency repeated over both
    halves."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv_freq)
    emb = torch.cat([angles, angles], dim=-1)[:, None, :]
    return emb.cos(), emb.sin()


def rope_eager(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Eager reference: x (B, S, H, D) rotated by position; cos, sin (S, 1, D) with both halves
    equal."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def qkv_rope_eager(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eager reference of :func:`qkv_rope`: split qkv (B, S, Hq + 2 Hkv, D) into heads, rotate q and
    k."""
    q, k, v = qkv.split([n_heads, n_kv_heads, n_kv_heads], dim=2)
    return rope_eager(q, cos, sin), rope_eager(k, cos, sin), v


@triton.jit
def _qkv_rope_kernel(
    P,
    p_sb,
    p_ss,
    Q,
    q_sb,
    q_ss,
    q_sh,
    K,
    k_sb,
    k_ss,
    k_sh,
    V,
    v_sb,
    v_ss,
    v_sh,
    COS,
    SIN,
    n_tokens,
    seq,
    n_heads,
    n_kv,
    half,
    TO_PACKED: tl.constexpr,
    TOKENS: tl.constexpr,
    HALF: tl.constexpr,
):
    """Head j = program_id(1) of tokens [pid0 * TOKENS, +TOKENS) between the packed P (B, S, Hq + 2
    Hkv, D; heads q, then k, then v) and Q, K or V (B, S, heads, D), all addressed by strides with a
    unit last one. Forward (not TO_PACKED): Q, K = P's q, k heads rotated by position, V = P's v
    heads. Backward (TO_PACKED): P = the gradients in Q and K rotated back, and V's. Math in fp32; a
    copy is a rotation by cos 1, sin 0.
    """
    # Memory per call (T tokens, s bytes per element): reads and writes T(Hq + 2Hkv)Ds each way,
    # and reads the fp32 cos and sin of the S positions (the first D/2 columns of each table row,
    # both halves being equal: 4SD bytes, L2-resident after the first heads). Over the floor of
    # kernels/README.md: the forward's copy of v (2T*Hkv*D*s).
    # At position p, frequency i < D/2 turns the pair (x1, x2) = (x[i], x[i + D/2]) by the angle
    # phi = p * theta^(-2i/D) (cos phi, sin phi tabled in COS, SIN at offset p*D + i):
    #   out1 = x1 cos - x2 sin,  out2 = x2 cos + x1 sin   (x * cos + rotate_half(x) * sin)
    # a 2x2 rotation R(phi), linear, so its Jacobian is R(phi) itself. The backward multiplies the
    # incoming gradient by R(phi)^T = R(-phi): dx1 = d1 cos + d2 sin, dx2 = d2 cos - d1 sin, the
    # same two lines with sin negated, all that TO_PACKED changes besides the copy's direction.
    # head j of the packed row: q heads first, then k heads, then v heads (copied, not rotated)
    j = tl.program_id(1)
    T, t_sb, t_ss, t_sh, h = V, v_sb, v_ss, v_sh, j - n_heads - n_kv
    if j < n_heads:
        T, t_sb, t_ss, t_sh, h = Q, q_sb, q_ss, q_sh, j
    elif j < n_heads + n_kv:
        T, t_sb, t_ss, t_sh, h = K, k_sb, k_ss, k_sh, j - n_heads
    tok = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    pos = tok % seq
    b = (tok // seq).to(tl.int64)
    d = tl.arange(0, HALF)
    mask = (tok < n_tokens)[:, None] & (d < half)[None, :]
    p_ptr = P + (b * p_sb + pos.to(tl.int64) * p_ss + j * 2 * half)[:, None] + d[None, :]
    t_ptr = T + (b * t_sb + pos.to(tl.int64) * t_ss + h * t_sh)[:, None] + d[None, :]
    # v's heads take cos 1, sin 0 (rotate = 0): one code path, no branch on the head kind
    rotate = (j < n_heads + n_kv).to(tl.float32)
    angle = pos[:, None] * (2 * half) + d[None, :]
    c = 1.0 + rotate * (tl.load(COS + angle, mask=mask, other=1.0) - 1.0)
    s = rotate * tl.load(SIN + angle, mask=mask, other=0.0)
    if TO_PACKED:
        src, dst, s = t_ptr, p_ptr, -s
    else:
        src, dst = p_ptr, t_ptr
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst, (x1 * c - x2 * s).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + half, (x2 * c + x1 * s).to(dst.dtype.element_ty), mask=mask)


def _launch(
    p: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    to_packed: bool,
) -> None:
    """One launch over every head of p (B, S, Hq + 2 Hkv, D) and q, k, v (B, S, heads, D)."""
    # The tables' first seq rows in fp32, contiguous (S, D): 8SD bytes (0.5 MB at S = 1024,
    # D = 64), read by every head, so they stay in L2. Grid: token blocks x heads, each program
    # one head of TOKENS tokens, HALF >= D/2 lanes per token.
    batch, seq, heads, dim = p.shape
    n_tokens, half = batch * seq, dim // 2
    cos, sin = (
        cos.reshape(-1, dim)[:seq].float().contiguous(),
        sin.reshape(-1, dim)[:seq].float().contiguous(),
    )
    grid = (triton.cdiv(n_tokens, TOKENS), heads)
    _qkv_rope_kernel[grid](
        p,
        p.stride(0),
        p.stride(1),
        q,
        *q.stride()[:3],
        k,
        *k.stride()[:3],
        v,
        *v.stride()[:3],
        cos,
        sin,
        n_tokens,
        seq,
        q.shape[2],
        k.shape[2],
        half,
        TO_PACKED=to_packed,
        TOKENS=TOKENS,
        HALF=triton.next_power_of_2(half),
        num_warps=WARPS,
    )


@torch.library.custom_op("optbench::qkv_rope_fwd", mutates_args=())
def qkv_rope_fwd(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v), contiguous (B, S, heads, D) in qkv's dtype: q, k rotated by position."""
    qkv = unit_last_stride(qkv)
    batch, seq, _, dim = qkv.shape
    q, k, v = (
        torch.empty((batch, seq, h, dim), dtype=qkv.dtype, device=qkv.device)
        for h in (n_heads, n_kv_heads, n_kv_heads)
    )
    _launch(qkv, q, k, v, cos, sin, to_packed=False)
    return q, k, v


@qkv_rope_fwd.register_fake
def _(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, seq, _, dim = qkv.shape
    return tuple(qkv.new_empty((batch, seq, h, dim)) for h in (n_heads, n_kv_heads, n_kv_heads))


@torch.library.custom_op("optbench::qkv_rope_bwd", mutates_args=())
def qkv_rope_bwd(
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The packed gradient (B, S, Hq + 2 Hkv, D) in `dtype`, contiguous: dq, dk rotated back, and
    dv."""
    # SDPA's backward may hand dq, dk, dv transposed: read through their strides, copied only
    # where the last one is not 1
    dq, dk, dv = (unit_last_stride(g) for g in (dq, dk, dv))
    batch, seq, n_heads, dim = dq.shape
    dqkv = torch.empty((batch, seq, n_heads + 2 * dk.shape[2], dim), dtype=dtype, device=dq.device)
    _launch(dqkv, dq, dk, dv, cos, sin, to_packed=True)
    return dqkv


@qkv_rope_bwd.register_fake
def _(
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    batch, seq, n_heads, dim = dq.shape
    return dq.new_empty((batch, seq, n_heads + 2 * dk.shape[2], dim), dtype=dtype)


class QKVRopeFunction(torch.autograd.Function):
    """qkv (B, S, Hq + 2 Hkv, D) -> (rope(q), rope(k), v) in qkv's dtype; cos, sin (S', 1, D), S' >=
    S, are constants. Saves nothing but the tables; backward writes d qkv in one pass."""

    @staticmethod
    def forward(
        ctx, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv_heads: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if qkv.dim() != 4 or qkv.shape[2] != n_heads + 2 * n_kv_heads or qkv.shape[3] % 2:
            raise ValueError(
                f"qkv must be (B, S, {n_heads} + 2 x {n_kv_heads}, even D), got {tuple(qkv.shape)}"
            )
        ctx.save_for_backward(cos, sin)
        ctx.dtype = qkv.dtype
        return qkv_rope_fwd(qkv, cos, sin, n_heads, n_kv_heads)

    @staticmethod
    def backward(
        ctx, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors
        return qkv_rope_bwd(dq, dk, dv, cos, sin, ctx.dtype), None, None, None, None


def qkv_rope(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton (rope(q), rope(k), v) of a packed qkv (B, S, Hq + 2 Hkv, D); cos, sin (S', 1, D), S'
    >= S."""
    return QKVRopeFunction.apply(qkv, cos, sin, n_heads, n_kv_heads)
