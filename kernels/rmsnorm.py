"""RMSNorm (HF Llama semantics) and the residual add before it, forward and backward in Triton.

y = weight * cast_to_x_dtype(x * rsqrt(mean(x^2, -1) + eps)), statistics in fp32. `add_rms_norm`
also takes the residual add before the norm (h = x + y, then its norm) and, backward, adds the
residual gradient and writes the total in both inputs' dtypes. The two ops share one forward
(`rms_fwd_rows`) and one backward (`rms_bwd_stripe`) body, whose constexpr HAS_RES switches the
residual terms on; off, they compile away. `kernels.qknorm` calls the same bodies and
`sum_partials`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn

from kernels._common import persistent_programs, row_grid, row_tile, rows_2d

# Sources. RMSNorm: Zhang and Sennrich, "Root Mean Square Layer Normalization" (2019,
# https://arxiv.org/abs/1910.07467), with the rounding of Hugging Face's LlamaRMSNorm (x_hat cast to
# the input dtype before the weight). The kernels follow the fused layer norm of the Triton
# tutorials (https://triton-lang.org/main/getting-started/tutorials/05-layer-norm.html): whole rows
# in registers, per-program partial dW sums reduced by a second kernel. Liger-Kernel's RMSNorm
# (https://github.com/linkedin/Liger-Kernel/blob/main/src/liger_kernel/ops/rms_norm.py) runs its
# backward on one program per SM, each summing dW over its rows in fp32, as ours does (here the row
# blocks are dealt round robin and the next block's loads are issued before the current one's
# math); its fused_add_rms_norm.py switches the residual gradient on by a constexpr flag, as HAS_RES
# does.

# Tiles (elements of x per program, or per backward loop step) and elements per thread, tuned on an
# H100 at 16384 x {768, 2048, 4096} bf16 and QK-norm head_dim 64/96/128: the backward runs best with
# big register tiles (about 64 bytes of x and of dy per thread, next step's loads issued before the
# current step's math) even at one resident program per SM. The residual add's backward loads 10
# bytes an element (fp32 h and residual gradient, 16-bit dout) against 4, and runs best with half
# the tile and 32 bytes of h per thread (on an H200 at 8192 rows of 768, 1536 and 2048:
# scripts/probes/rmsnorm_bwd_tiles.py; 1.18-1.57x its floor against 1.54-2.34x at the plain tile).
FWD_TILE, FWD_PER_THREAD = 4096, 16
BWD_TILE, BWD_THREAD_BYTES = 8192, 64
ADD_BWD_TILE, ADD_BWD_THREAD_BYTES = 4096, 32


def fwd_tile(n_rows: int, n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the forward."""
    return row_tile(n_rows, n_cols, FWD_TILE, FWD_PER_THREAD)


def bwd_tile(
    n_rows: int, n_cols: int, x: torch.Tensor, residual: bool = False
) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the backward for inputs of x's dtype; ``residual``: the
    residual add's backward (HAS_RES)."""
    tile, thread_bytes = (
        (ADD_BWD_TILE, ADD_BWD_THREAD_BYTES) if residual else (BWD_TILE, BWD_THREAD_BYTES)
    )
    return row_tile(n_rows, n_cols, tile, thread_bytes // x.element_size())


def rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Eager reference (HF Llama): statistics in at least fp32, x_hat cast back to x.dtype, times
    weight."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@triton.jit
def _row_start(rows, n1, n2, s0, s1, s2):
    """int64 element offset of each row of a (n0, n1, n2, H) tensor with strides (s0, s1, s2, 1)."""
    i0 = (rows // (n1 * n2)).to(tl.int64)
    i1 = (rows // n2 % n1).to(tl.int64)
    i2 = (rows % n2).to(tl.int64)
    return i0 * s0 + i1 * s1 + i2 * s2


@triton.jit
def rms_fwd_rows(
    X,
    n1,
    n2,
    s0,
    s1,
    s2,
    W,
    Y,
    RSTD,
    first,
    n_rows,
    n_cols,
    eps,
    ADD,
    SUM,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
):
    """Normalize row block program_id(0) - first of X (row grid n1, n2, s0, s1, s2) into the
    contiguous (n_rows, n_cols) Y = w * round(x * rstd), rstd = (mean(x^2) + eps)^(-1/2) in fp32,
    stored in RSTD; round() casts x * rstd to X's dtype and back, as HF's LlamaRMSNorm casts
    before the weight. With HAS_RES the row normalized is h = x + ADD (ADD contiguous), rounded
    to SUM's dtype and stored in SUM, and round() casts to SUM's dtype. Launched with first = 0
    for RMSNorm and AddRMSNorm; kernels.qknorm's forward calls it for q, then for k.
    """
    # Memory per call (N rows, H = n_cols, s_t bytes per element of tensor t): reads N*H*s_x +
    # H*s_w, writes N*H*s_y + 4N (rstd); HAS_RES adds N*H*(s_add + s_sum). Over the floor that
    # kernels/README.md derives: rstd's 4N bytes (and w's H*s_w, which optbench/suite/ops.py
    # leaves out). FLOPs per element: x^2 and its row sum, x * rstd, * w (4; +1 for the add).
    # BLOCK_M rows of BLOCK_N >= n_cols columns: a whole row lives in one program's registers, so
    # the row sum needs no second pass over memory.
    rows = (tl.program_id(0) - first) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    x_ptrs = X + _row_start(rows, n1, n2, s0, s1, s2)[:, None] + cols[None, :]
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    ROUND = X  # the pointer whose element type x_hat is rounded to
    if HAS_RES:
        # the residual add: h leaves in SUM's dtype and is normalized as stored (what autograd
        # saves for the backward)
        res = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]  # ADD and SUM are contiguous
        x = (x + tl.load(ADD + res, mask=mask, other=0.0)).to(SUM.dtype.element_ty)
        tl.store(SUM + res, x, mask=mask)
        x = x.to(tl.float32)
        ROUND = SUM
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    # masked columns read 0, so the sum over BLOCK_N columns is the sum over n_cols
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    tl.store(RSTD + rows, rstd, mask=row_mask)  # 4 bytes a row that spare the backward a reduction
    x_hat = (x * rstd[:, None]).to(ROUND.dtype.element_ty).to(tl.float32)
    # Y's offsets are computed here, after the reduction, as in the separate kernels this body
    # replaced (computed beside x's, they give the same instructions in another order)
    y_ptrs = Y + rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
    tl.store(y_ptrs, (x_hat * w[None, :]).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _load_bwd_block(
    DY,
    dy_s0,
    dy_s1,
    dy_s2,
    X,
    x_s0,
    x_s1,
    x_s2,
    n1,
    n2,
    RSTD,
    DRES,
    blk,
    n_rows,
    n_cols,
    cols,
    col_mask,
    BLOCK_M: tl.constexpr,
    HAS_RES: tl.constexpr,
):
    """x, dy (input dtypes), rstd and, with HAS_RES, the residual gradient (contiguous rows) of row
    block blk; rows past n_rows read as zeros."""
    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    mask = row_mask[:, None] & col_mask[None, :]
    x_ptrs = X + _row_start(rows, n1, n2, x_s0, x_s1, x_s2)[:, None] + cols[None, :]
    dy_ptrs = DY + _row_start(rows, n1, n2, dy_s0, dy_s1, dy_s2)[:, None] + cols[None, :]
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    dy = tl.load(dy_ptrs, mask=mask, other=0.0)
    dres = 0.0
    if HAS_RES:
        dres = tl.load(
            DRES + rows.to(tl.int64)[:, None] * n_cols + cols[None, :], mask=mask, other=0.0
        )
    return x, dy, tl.load(RSTD + rows, mask=row_mask, other=0.0), dres


@triton.jit
def rms_bwd_stripe(
    DY,
    dy_s0,
    dy_s1,
    dy_s2,
    X,
    x_s0,
    x_s1,
    x_s2,
    n1,
    n2,
    W,
    RSTD,
    DX,
    DW_PART,
    start,
    n_rows,
    n_cols,
    DRES,
    DX_LOW,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
):
    """dX of X's row blocks dealt round robin over the programs, block 0 to program `start` (dY
    and X share the row grid n1, n2; dX is contiguous (n_rows, n_cols)), and each program's fp32
    sum over its rows of dY * x_hat in row program_id(0) of DW_PART (num_programs, n_cols), for
    `sum_partials`. With HAS_RES, X is a residual sum h = x + y: the gradient reaching h by the
    residual path (DRES, contiguous) is added, and the total is stored twice, in DX's dtype (for x)
    and in DX_LOW's (for y). Launched persistent (one program per resident slot, start = 0) for
    RMSNorm and AddRMSNorm; kernels.qknorm's backward calls it for q, then for k.
    """
    # Memory per call (N rows, P programs): reads N*H*(s_x + s_dy) + 4N (rstd) + H*s_w, writes
    # N*H*s_dx and 4PH of dW partials, which `sum_partials` reads back; HAS_RES adds
    # N*H*(s_dres + s_dx_low). The floor's dW write is sum_partials'.
    #
    # Per row, with H = n_cols, r = rstd, x_hat = x * r and g = dy * w (the forward's rounding of
    # x_hat taken as the identity, as autograd takes a cast):
    #   dr/dx_j = -1/2 (sum_k x_k^2 / H + eps)^(-3/2) * 2 x_j / H = -r^3 x_j / H
    #   d x_hat_i / dx_j = r delta_ij + x_i dr/dx_j = r (delta_ij - x_hat_i x_hat_j / H)
    #   dx_j = sum_i g_i d x_hat_i / dx_j = r (g_j - x_hat_j c),  c = sum_i g_i x_hat_i / H
    # i.e. dx = rstd * (dy*w - x * rstd^2 * mean(dy*w*x)), and dw = sum over rows of dy * x_hat.
    # With HAS_RES, h = x + y feeds both the norm and the residual stream, so dh is the norm's
    # dx plus DRES, and dh/dx = dh/dy = 1 hand that same total to x and to y.
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    blk = (pid + step - start) % step  # this program's first block; then blk + step, ...
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # summed over rows once, after the loop
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    x, dy, rstd, dres = _load_bwd_block(
        DY,
        dy_s0,
        dy_s1,
        dy_s2,
        X,
        x_s0,
        x_s1,
        x_s2,
        n1,
        n2,
        RSTD,
        DRES,
        blk,
        n_rows,
        n_cols,
        cols,
        col_mask,
        BLOCK_M,
        HAS_RES,
    )
    # a while loop: the interpreter (numpy >= 2.4) rejects runtime range() bounds
    while blk < n_blocks:
        # software pipelining: the next block's loads are in flight during this block's math (a
        # block past the end reads as zeros and is never stored)
        x_next, dy_next, rstd_next, dres_next = _load_bwd_block(
            DY,
            dy_s0,
            dy_s1,
            dy_s2,
            X,
            x_s0,
            x_s1,
            x_s2,
            n1,
            n2,
            RSTD,
            DRES,
            blk + step,
            n_rows,
            n_cols,
            cols,
            col_mask,
            BLOCK_M,
            HAS_RES,
        )
        # x_hat is rebuilt from x and the saved rstd (no second reduction over x), then the two
        # lines of the derivation above: c = mean(g * x_hat) per row, dx = r * (g - x_hat * c)
        x_hat = x.to(tl.float32) * rstd[:, None]
        dyf = dy.to(tl.float32)
        g = dyf * w[None, :]
        c = tl.sum(g * x_hat, axis=1) / n_cols
        dx = (g - x_hat * c[:, None]) * rstd[:, None]
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        offsets = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        if HAS_RES:
            # dh = the norm's dx + the residual path's; both summands get it, each in its dtype
            dx += dres.to(tl.float32)
            tl.store(DX_LOW + offsets, dx.to(DX_LOW.dtype.element_ty), mask=mask)
        tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)
        # dw: elementwise into a (BLOCK_M, BLOCK_N) register tile, reduced over its rows once
        dw += dyf * x_hat
        blk += step
        x, dy, rstd, dres = x_next, dy_next, rstd_next, dres_next
    tl.store(DW_PART + pid.to(tl.int64) * n_cols + cols, tl.sum(dw, axis=0), mask=col_mask)


@triton.jit
def _sum_partials_kernel(PART, OUT, n_part, n_cols, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """OUT[g, c] = sum_p PART[g, p, c] for a BLOCK_C stripe of columns of group g =
    program_id(1): the second stage of the dW reduction, the first being each backward program's
    sum over its own rows."""
    # Memory per call: reads 4GPC bytes (fp32 partials), writes G*C*s_out.
    g = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < n_cols
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    p0 = 0
    while p0 < n_part:
        p = p0 + tl.arange(0, BLOCK_P)
        mask = (p < n_part)[:, None] & col_mask[None, :]
        acc += tl.load(
            PART + (g * n_part + p)[:, None] * n_cols + cols[None, :], mask=mask, other=0.0
        )
        p0 += BLOCK_P
    tl.store(OUT + g * n_cols + cols, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=col_mask)


def sum_partials(part: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Sum a contiguous fp32 (G, P, C) buffer of partial sums over P; returns (G, C) in `dtype`."""
    g, p, c = part.shape
    # one program per stripe of up to 64 columns and group, reading 32 partial rows at a time
    # (256 contiguous bytes of each): a small pass, 4GPC bytes against the backward's 3NHs
    out = torch.empty((g, c), dtype=dtype, device=part.device)
    block_c = min(64, triton.next_power_of_2(c))
    grid = (triton.cdiv(c, block_c), g)
    _sum_partials_kernel[grid](part, out, p, c, BLOCK_P=32, BLOCK_C=block_c, num_warps=4)
    return out


def _rows_of(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A new (N, H) tensor in `dtype` for the N rows of x (..., H)."""
    return torch.empty((x.numel() // x.shape[-1], x.shape[-1]), dtype=dtype, device=x.device)


def _rstd_of(x: torch.Tensor) -> torch.Tensor:
    """A new fp32 (N,) tensor, one rstd per row of x (..., H)."""
    return torch.empty(x.numel() // x.shape[-1], dtype=torch.float32, device=x.device)


def _launch_fwd(
    x2: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    y: torch.Tensor,
    rstd: torch.Tensor,
    add: torch.Tensor | None = None,
    total: torch.Tensor | None = None,
) -> None:
    """The forward over the rows x2 (N, H) into y and rstd; with `add`, over x2 + add, the sum
    stored in `total` (add, total, y contiguous (N, H))."""
    n, h = x2.shape
    block_m, block_n, warps = fwd_tile(n, h)
    rms_fwd_rows[(triton.cdiv(n, block_m),)](
        x2,
        *row_grid(x2[:, None, None]),
        weight.contiguous(),
        y,
        rstd,
        0,
        n,
        h,
        eps,
        add,
        total,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HAS_RES=add is not None,
        num_warps=warps,
    )


@torch.library.custom_op("optbench::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y (N, H) in promote_types(x, weight), rstd (N,) fp32) for the rows of x (..., H). An opaque
    op, so torch.compile never traces the launch."""
    y, rstd = _rows_of(x, torch.promote_types(x.dtype, weight.dtype)), _rstd_of(x)
    _launch_fwd(rows_2d(x), weight, eps, y, rstd)
    return y, rstd


@rms_norm_fwd.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _rows_of(x, torch.promote_types(x.dtype, weight.dtype)), _rstd_of(x)


def _launch_bwd(
    dy: torch.Tensor,
    x2: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    dx: torch.Tensor,
    need_dw: bool,
    dres: torch.Tensor | None = None,
    dx_low: torch.Tensor | None = None,
) -> torch.Tensor:
    """The persistent backward over the rows x2 (N, H) into dx, plus (with dres) the residual
    gradient added and the total also written to dx_low; returns dweight (an empty tensor when not
    need_dw)."""
    dy2, weight = rows_2d(dy), weight.contiguous()
    n, h = x2.shape
    block_m, block_n, warps = bwd_tile(n, h, x2, residual=dres is not None)
    meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, HAS_RES=dres is not None)
    n1, n2, *x_strides = row_grid(x2[:, None, None])
    dy_strides = row_grid(dy2[:, None, None])[2:]
    residual = (None, None) if dres is None else (dres.contiguous(), dx_low)
    head = (dy2, *dy_strides, x2, *x_strides, n1, n2, weight, rstd, dx)

    def args(part: torch.Tensor) -> tuple:
        return (*head, part, 0, n, h, *residual)

    # Persistent: one program per resident slot (as many as the tile's registers let fit), each
    # walking every P-th row block, so the dW partials are P rows whatever N is. rstd stands in for
    # the fp32 partials buffer while the grid is sized.
    n_blocks = triton.cdiv(n, block_m)
    programs = persistent_programs(rms_bwd_stripe, n_blocks, args(rstd), meta, x2.device)
    part = torch.empty((1, programs, h), dtype=torch.float32, device=x2.device)
    rms_bwd_stripe[(programs,)](*args(part), **meta)
    return sum_partials(part, weight.dtype)[0] if need_dw else weight.new_empty(0)


@torch.library.custom_op("optbench::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, need_dw: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx (N, H) in x.dtype, dweight in weight.dtype; an empty tensor when not need_dw)."""
    dx = _rows_of(x, x.dtype)
    return dx, _launch_bwd(dy, rows_2d(x), weight, rstd, dx, need_dw)


@rms_norm_bwd.register_fake
def _(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, need_dw: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return _rows_of(x, x.dtype), weight.new_empty(weight.shape if need_dw else (0,))


class RMSNormFunction(torch.autograd.Function):
    """x (..., H) in fp32/bf16/fp16, weight (H,) -> y (..., H) in promote_types(x.dtype,
    weight.dtype).

    Saves x and rstd (fp32, one per row). Backward: dx in x.dtype, dweight in weight.dtype.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        y, rstd = rms_norm_fwd(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_bwd(dy, x, weight, rstd, ctx.needs_input_grad[1])
        return dx.view(x.shape), dw if ctx.needs_input_grad[1] else None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Triton RMSNorm over the last dim of x (any leading dims, any H up to 65536)."""
    return RMSNormFunction.apply(x, weight, eps)


# --- The residual add and the next pre-norm in one pass: h = x + y, out = RMSNorm(h) ------------
# In a pre-norm decoder with an fp32 residual stream under bf16 autocast, x is the stream (fp32) and
# y a branch's output (bf16). Eager code adds (one pass), normalizes (another) and, backward, casts
# the residual gradient to bf16 for the branch (a third). Here the forward reads x, y and writes h
# and out once; the backward reads dout, h and the residual gradient dh and writes the total once
# per dtype.


def add_rms_norm_eager(
    x: torch.Tensor,
    y: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager reference: (h = x + y, rms_norm_eager(h) in out_dtype; None: its own promoted
    dtype)."""
    h = x + y
    out = rms_norm_eager(h, weight, eps)
    return h, out if out_dtype is None else out.to(out_dtype)


@torch.library.custom_op("optbench::add_rms_norm_fwd", mutates_args=())
def add_rms_norm_fwd(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h = x + y (N, H) in promote_types(x, y), out (N, H) in out_dtype, rstd (N,) fp32)."""
    h, out = _rows_of(x, torch.promote_types(x.dtype, y.dtype)), _rows_of(x, out_dtype)
    rstd = _rstd_of(x)
    # x through the forward's row grid (contiguous here, so one stride), y as ADD: contiguous
    x2, y2 = (t.reshape(-1, t.shape[-1]).contiguous() for t in (x, y))
    _launch_fwd(x2, weight, eps, out, rstd, y2, h)
    return h, out, rstd


@add_rms_norm_fwd.register_fake
def _(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    h = _rows_of(x, torch.promote_types(x.dtype, y.dtype))
    return h, _rows_of(x, out_dtype), _rstd_of(x)


@torch.library.custom_op("optbench::add_rms_norm_bwd", mutates_args=())
def add_rms_norm_bwd(
    dout: torch.Tensor,
    dh: torch.Tensor,
    h: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    y_dtype: torch.dtype,
    need_dw: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx in h's dtype, dy in y_dtype, dweight or an empty tensor): dx = dy = dh + the norm's input
    gradient."""
    dx, dy = _rows_of(h, h.dtype), _rows_of(h, y_dtype)
    return dx, dy, _launch_bwd(dout, h, weight, rstd, dx, need_dw, dh.reshape(h.shape), dy)


@add_rms_norm_bwd.register_fake
def _(
    dout: torch.Tensor,
    dh: torch.Tensor,
    h: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    y_dtype: torch.dtype,
    need_dw: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dw = weight.new_empty(weight.shape if need_dw else (0,))
    return _rows_of(h, h.dtype), _rows_of(h, y_dtype), dw


class AddRMSNormFunction(torch.autograd.Function):
    """x, y (..., H), weight (H,) -> (h = x + y in promote_types(x, y), RMSNorm(h) in out_dtype).

    Saves h and rstd. Backward: dx in x.dtype and dy in y.dtype from one pass, dweight in
    weight.dtype.
    """

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        y: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        out_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, out, rstd = add_rms_norm_fwd(x, y, weight, eps, out_dtype)
        ctx.save_for_backward(h, weight, rstd)
        ctx.dtypes = x.dtype, y.dtype
        return h.view(x.shape), out.view(x.shape)

    @staticmethod
    def backward(ctx, dh: torch.Tensor, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, weight, rstd = ctx.saved_tensors
        dx, dy, dw = add_rms_norm_bwd(
            dout, dh, h, weight, rstd, ctx.dtypes[1], ctx.needs_input_grad[2]
        )
        # dx comes in h's dtype, promote_types(x, y): cast back where x was the narrower one
        shape = dout.shape
        return (
            dx.view(shape).to(ctx.dtypes[0]),
            dy.view(shape),
            dw if ctx.needs_input_grad[2] else None,
            None,
            None,
        )


def add_rms_norm(
    x: torch.Tensor,
    y: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton (h = x + y, RMSNorm(h) in out_dtype; None: promote_types(h, weight)) over the last
    dim."""
    dtype = torch.promote_types(x.dtype, y.dtype)
    return AddRMSNormFunction.apply(
        x, y, weight, eps, out_dtype or torch.promote_types(dtype, weight.dtype)
    )


class RMSNorm(nn.Module):
    """RMSNorm layer with a learnable (H,) weight; impl 'eager' (reference) or 'triton'."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        impl: str = "triton",
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if impl not in ("eager", "triton"):
            raise ValueError(f"impl must be 'eager' or 'triton', got {impl!r}")
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.eps = eps
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fn = rms_norm if self.impl == "triton" else rms_norm_eager
        return fn(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + y, its norm): a residual add and the pre-norm after it, in one pass with impl
        'triton'. Under autocast the norm comes out in the autocast dtype, which the next matmul
        would cast it to."""
        if self.impl != "triton":
            h = x + y
            return h, self(h)
        device = x.device.type
        out_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        return add_rms_norm(x, y, self.weight, self.eps, out_dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, impl={self.impl}"
