"""QK-norm: RMSNorm over head_dim of every head of q and of k, one Triton launch for both.

q (B, S, Hq, D) and k (B, S, Hkv, D) may have any strides with a contiguous last dim (the
leading three dims are addressed in-kernel, so e.g. slices of a fused qkv projection are read
in place); weights wq, wk are (D,). The math per row, forward and backward with its derivation,
and the dW partial-sum scheme are `kernels.rmsnorm`'s: its row bodies run here once for q's rows
and once for k's, in one launch each way, so neither pays a launch or a tail of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn

from kernels._common import persistent_programs, row_grid, unit_last_stride
from kernels.rmsnorm import (
    bwd_tile,
    fwd_tile,
    rms_bwd_stripe,
    rms_fwd_rows,
    rms_norm_eager,
    sum_partials,
)

# Sources: normalizing queries and keys before their dot product is Henry et al., "Query-Key
# Normalization for Transformers" (2020, https://arxiv.org/abs/2010.04245), and, as a LayerNorm per
# head, Dehghani et al., "Scaling Vision Transformers to 22 Billion Parameters" (2023,
# https://arxiv.org/abs/2302.05442); an RMSNorm over head_dim with one (D,) weight shared by all
# heads is what Hugging Face's Qwen3 attention does (q_norm, k_norm in models/qwen3).


def qk_norm_eager(
    q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager reference: `rms_norm_eager` over the last dim of q with wq and of k with wk."""
    return rms_norm_eager(q, wq, eps), rms_norm_eager(k, wk, eps)


@triton.jit
def _qk_norm_fwd_kernel(
    Q,
    q_n1,
    q_n2,
    q_s0,
    q_s1,
    q_s2,
    K,
    k_n1,
    k_n2,
    k_s0,
    k_s1,
    k_s2,
    WQ,
    WK,
    YQ,
    YK,
    RSTD_Q,
    RSTD_K,
    n_q,
    n_k,
    D,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Programs [0, cdiv(n_q, BLOCK_M)) normalize row blocks of q, the rest row blocks of k
    (`rms_fwd_rows`: y = w * round(x * rstd), rstd = (mean(x^2) + eps)^(-1/2) per row of D).
    """
    # Memory per call (R = n_q + n_k rows, s bytes per element): reads R*D*s + 2D*s_w, writes
    # R*D*s and 4R of rstd: the floor of kernels/README.md plus rstd.
    # one grid over both tensors: the k programs start where q's end, so the GPU never idles
    # between a q launch's tail and a k launch
    q_blocks = tl.cdiv(n_q, BLOCK_M)
    if tl.program_id(0) < q_blocks:
        rms_fwd_rows(
            Q,
            q_n1,
            q_n2,
            q_s0,
            q_s1,
            q_s2,
            WQ,
            YQ,
            RSTD_Q,
            0,
            n_q,
            D,
            eps,
            None,
            None,
            BLOCK_M,
            BLOCK_N,
            False,
        )
    else:
        rms_fwd_rows(
            K,
            k_n1,
            k_n2,
            k_s0,
            k_s1,
            k_s2,
            WK,
            YK,
            RSTD_K,
            q_blocks,
            n_k,
            D,
            eps,
            None,
            None,
            BLOCK_M,
            BLOCK_N,
            False,
        )


@triton.jit
def _qk_norm_bwd_kernel(
    DYQ,
    dyq_s0,
    dyq_s1,
    dyq_s2,
    Q,
    q_s0,
    q_s1,
    q_s2,
    q_n1,
    q_n2,
    DYK,
    dyk_s0,
    dyk_s1,
    dyk_s2,
    K,
    k_s0,
    k_s1,
    k_s2,
    k_n1,
    k_n2,
    WQ,
    WK,
    RSTD_Q,
    RSTD_K,
    DQ,
    DK,
    DW_PART,
    n_q,
    n_k,
    D,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Persistent grid over the q row blocks followed by the k row blocks, dealt round-robin
    (`rms_bwd_stripe`: dx = rstd * (g - x_hat * mean(g * x_hat)), g = dy * w, per row; dw = the
    sum over rows of dy * x_hat).

    DW_PART is fp32 (2, num_programs, D): row pid of group 0 (q) and group 1 (k) gets this
    program's partial dW sums. Memory per call (R rows, P programs): reads 2R*D*s + 4R + 2D*s_w,
    writes R*D*s and 2*4PD of partials, which `sum_partials` reads back: 2*4PD bytes over the
    floor of kernels/README.md, besides rstd's.
    """
    # Each program walks its share of q's row blocks, then of k's: one persistent grid sized
    # for both, so programs finishing q early go on to k instead of idling for a second launch
    step = tl.num_programs(0)
    rms_bwd_stripe(
        DYQ,
        dyq_s0,
        dyq_s1,
        dyq_s2,
        Q,
        q_s0,
        q_s1,
        q_s2,
        q_n1,
        q_n2,
        WQ,
        RSTD_Q,
        DQ,
        DW_PART,
        0,
        n_q,
        D,
        None,
        None,
        BLOCK_M,
        BLOCK_N,
        False,
    )
    # k's blocks continue the deal where q's ended (k's block 0 to the program after the one
    # that took q's last), so no program walks more than one block more than another
    rms_bwd_stripe(
        DYK,
        dyk_s0,
        dyk_s1,
        dyk_s2,
        K,
        k_s0,
        k_s1,
        k_s2,
        k_n1,
        k_n2,
        WK,
        RSTD_K,
        DK,
        DW_PART + step.to(tl.int64) * D,
        tl.cdiv(n_q, BLOCK_M) % step,
        n_k,
        D,
        None,
        None,
        BLOCK_M,
        BLOCK_N,
        False,
    )


def _rows(x: torch.Tensor) -> int:
    return x.shape[0] * x.shape[1] * x.shape[2]


@torch.library.custom_op("optbench::qk_norm_fwd", mutates_args=())
def qk_norm_fwd(
    q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q_normed, k_normed, rstd_q, rstd_k) for 4-D q, k with unit last stride, in one launch. An
    opaque op, so torch.compile never traces the launch."""
    wq, wk = wq.contiguous(), wk.contiguous()
    n_q, n_k, d = _rows(q), _rows(k), q.shape[-1]
    dev = q.device
    yq = torch.empty(q.shape, dtype=torch.promote_types(q.dtype, wq.dtype), device=dev)
    yk = torch.empty(k.shape, dtype=torch.promote_types(k.dtype, wk.dtype), device=dev)
    rstd_q = torch.empty(n_q, dtype=torch.float32, device=dev)
    rstd_k = torch.empty(n_k, dtype=torch.float32, device=dev)
    # one tile for both tensors (they share head_dim): q's row blocks, then k's, in one grid
    block_m, block_n, warps = fwd_tile(max(n_q, n_k), d)
    grid = (triton.cdiv(n_q, block_m) + triton.cdiv(n_k, block_m),)
    _qk_norm_fwd_kernel[grid](
        q,
        *row_grid(q),
        k,
        *row_grid(k),
        wq,
        wk,
        yq,
        yk,
        rstd_q,
        rstd_k,
        n_q,
        n_k,
        d,
        eps,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=warps,
    )
    return yq, yk, rstd_q, rstd_k


@qk_norm_fwd.register_fake
def _(
    q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        q.new_empty(q.shape, dtype=torch.promote_types(q.dtype, wq.dtype)),
        k.new_empty(k.shape, dtype=torch.promote_types(k.dtype, wk.dtype)),
        q.new_empty(_rows(q), dtype=torch.float32),
        k.new_empty(_rows(k), dtype=torch.float32),
    )


@torch.library.custom_op("optbench::qk_norm_bwd", mutates_args=())
def qk_norm_bwd(
    dyq: torch.Tensor,
    dyk: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    rstd_q: torch.Tensor,
    rstd_k: torch.Tensor,
    need_dw: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dwq, dwk); the weight gradients are empty tensors when not need_dw."""
    # SDPA's gradients may come with any strides: only the last dim must be unit for the rows'
    # loads; the leading three are addressed in the kernel as q's and k's are
    dyq, dyk, wq, wk = (
        unit_last_stride(dyq),
        unit_last_stride(dyk),
        wq.contiguous(),
        wk.contiguous(),
    )
    n_q, n_k, d = _rows(q), _rows(k), q.shape[-1]
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    # one tile for both (they share head_dim; sized by q's element size): a single compiled
    # kernel walks q's blocks and k's
    block_m, block_n, warps = bwd_tile(max(n_q, n_k), d, q)
    meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    q_n1, q_n2, *q_strides = row_grid(q)
    k_n1, k_n2, *k_strides = row_grid(k)

    def args(part: torch.Tensor) -> tuple:
        return (
            dyq,
            *row_grid(dyq)[2:],
            q,
            *q_strides,
            q_n1,
            q_n2,
            dyk,
            *row_grid(dyk)[2:],
            k,
            *k_strides,
            k_n1,
            k_n2,
            wq,
            wk,
            rstd_q,
            rstd_k,
            dq,
            dk,
            part,
            n_q,
            n_k,
            d,
        )

    n_blocks = triton.cdiv(n_q, block_m) + triton.cdiv(n_k, block_m)
    # rstd_q stands in for the fp32 partials buffer while the grid is sized
    programs = persistent_programs(_qk_norm_bwd_kernel, n_blocks, args(rstd_q), meta, q.device)
    part = torch.empty((2, programs, d), dtype=torch.float32, device=q.device)
    _qk_norm_bwd_kernel[(programs,)](*args(part), **meta)
    if not need_dw:
        return dq, dk, wq.new_empty(0), wk.new_empty(0)
    # both weights' partials in one reduction launch (groups 0 and 1 of part)
    dw = sum_partials(part, torch.promote_types(wq.dtype, wk.dtype))
    # two outputs, not two views of one
    return dq, dk, dw[0].to(wq.dtype, copy=True), dw[1].to(wk.dtype, copy=True)


@qk_norm_bwd.register_fake
def _(
    dyq: torch.Tensor,
    dyk: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    rstd_q: torch.Tensor,
    rstd_k: torch.Tensor,
    need_dw: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        q.new_empty(q.shape),
        k.new_empty(k.shape),
        wq.new_empty(wq.shape if need_dw else (0,)),
        wk.new_empty(wk.shape if need_dw else (0,)),
    )


class QKNormFunction(torch.autograd.Function):
    """(q, k, wq, wk, eps) -> (q_normed, k_normed), contiguous, in promote_types(q/k dtype, weight
    dtype).

    Saves q, k and one fp32 rstd per row of each. Backward: dq, dk in the input dtypes,
    dwq, dwk in the weight dtypes.
    """

    @staticmethod
    def forward(
        ctx, q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if q.dim() != 4 or k.dim() != 4 or q.shape[-1] != k.shape[-1]:
            raise ValueError(
                f"expected 4-D q, k with equal head_dim, got {tuple(q.shape)}, {tuple(k.shape)}"
            )
        # slices of a fused qkv projection keep their strides (no copy); only a non-unit last
        # stride, which the kernels' row loads cannot take, is copied
        q, k = unit_last_stride(q), unit_last_stride(k)
        yq, yk, rstd_q, rstd_k = qk_norm_fwd(q, k, wq, wk, eps)
        # q, k as read (views, where they came sliced) and 4 bytes a row of rstd: the backward
        # rebuilds x_hat = x * rstd without a reduction
        ctx.save_for_backward(q, k, wq, wk, rstd_q, rstd_k)
        return yq, yk

    @staticmethod
    def backward(ctx, dyq: torch.Tensor, dyk: torch.Tensor):
        q, k, wq, wk, rstd_q, rstd_k = ctx.saved_tensors
        # one flag for both weights: their partials come from the same launch either way
        need_dw = ctx.needs_input_grad[2] or ctx.needs_input_grad[3]
        dq, dk, dwq, dwk = qk_norm_bwd(dyq, dyk, q, k, wq, wk, rstd_q, rstd_k, need_dw)
        return dq, dk, dwq if need_dw else None, dwk if need_dw else None, None


def qk_norm(
    q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton QK-norm of q (B, S, Hq, D) and k (B, S, Hkv, D); returns contiguous (q_normed,
    k_normed)."""
    return QKNormFunction.apply(q, k, wq, wk, eps)


class QKNorm(nn.Module):
    """Per-head RMSNorm of q and k with learnable (head_dim,) weights; impl 'eager' or 'triton'."""

    def __init__(
        self,
        head_dim: int,
        eps: float = 1e-6,
        impl: str = "triton",
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if impl not in ("eager", "triton"):
            raise ValueError(f"impl must be 'eager' or 'triton', got {impl!r}")
        self.q_weight = nn.Parameter(torch.ones(head_dim, device=device, dtype=dtype))
        self.k_weight = nn.Parameter(torch.ones(head_dim, device=device, dtype=dtype))
        self.eps = eps
        self.impl = impl

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fn = qk_norm if self.impl == "triton" else qk_norm_eager
        return fn(q, k, self.q_weight, self.k_weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.q_weight.shape[0]}, eps={self.eps}, impl={self.impl}"
