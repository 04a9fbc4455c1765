"""SwiGLU gate, c = silu(a) * b, with forward and backward as elementwise Triton kernels.

The kernels compute in fp32 and store in the input dtype; the backward recomputes silu(a) from a.
They walk (rows, columns) tiles with a row stride per tensor, so a and b may be the two halves of
one packed (..., 2I) gate/up projection: ``swiglu_packed`` reads them there and writes their
gradients into one packed tensor, so that a fused gate/up GEMM's backward gets its gradient without
a concatenation pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import warps_for

# Sources: the gate is Shazeer's SwiGLU, "GLU Variants Improve Transformer" (2020,
# https://arxiv.org/abs/2002.05202), with SiLU (swish, beta = 1) from Elfwing et al. (2017,
# https://arxiv.org/abs/1702.03118) as Llama's MLP uses it. Liger-Kernel's SwiGLU
# (https://github.com/linkedin/Liger-Kernel/blob/main/src/liger_kernel/ops/swiglu.py) also saves
# only a and b and recomputes the sigmoid backward; the tiling by a row stride, which reads the
# packed gate/up halves in place, is ours.

TILE = 2048  # elements per program
# columns per tile (fewer when the rows are shorter): 11 tiles span a 1B config's 5632 exactly
COLS = 512
WARPS = warps_for(TILE, per_thread=8)  # one 16-byte vector per thread and tensor for 16-bit dtypes


def swiglu_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Eager reference (HF Llama MLP): silu(a) * b in the input dtype."""
    return F.silu(a) * b


def swiglu_packed_eager(gu: torch.Tensor) -> torch.Tensor:
    """Eager reference of the packed form: silu(a) * b for gu = [a, b] along the last dim."""
    return swiglu_eager(*gu.chunk(2, dim=-1))


@triton.jit
def _tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's rows, columns and mask: tiles laid out row-block-major over (n_rows,
    n_cols)."""
    col_blocks = tl.cdiv(n_cols, BLOCK_N)
    pid = tl.program_id(0)
    rows = (pid // col_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    return (
        rows.to(tl.int64)[:, None],
        cols[None, :],
        (rows < n_rows)[:, None] & (cols < n_cols)[None, :],
    )


@triton.jit
def _swiglu_fwd_kernel(
    A, B, s_in, C, s_out, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """c = silu(a) * b = a * sigmoid(a) * b over one (BLOCK_M, BLOCK_N) tile, in fp32, stored in
    C's dtype. A and B share the row stride s_in (two halves of one packed row, or two tensors
    of their own); C has row stride s_out.
    """
    # Memory per call (M = n_rows * n_cols elements, s bytes each): reads 2Ms, writes Ms, the floor
    # of kernels/README.md; nothing is saved for the backward but a and b themselves.
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    a = tl.load(A + rows * s_in + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + rows * s_in + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(C + rows * s_out + cols, (a * tl.sigmoid(a) * b).to(C.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    DC,
    s_dc,
    A,
    B,
    s_in,
    DA,
    DB,
    s_out,
    n_rows,
    n_cols,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """da, db of c = silu(a) * b for the incoming gradient dc, over one tile, in fp32; DA and DB
    share the row stride s_out (the halves of one packed gradient, or two tensors).
    """
    # Memory per call: reads 3Ms (dc, a, b), writes 2Ms (da, db), the floor of kernels/README.md.
    # With s = sigmoid(a) and silu(a) = a * s:
    #   ds/da = s * (1 - s), so silu'(a) = s + a * s * (1 - s) = s + silu(a) * (1 - s)
    #   dc/db = silu(a)      -> db = dc * silu(a)
    #   dc/da = b * silu'(a) -> da = dc * b * (s + silu(a) * (1 - s))
    # s is recomputed from a (3 FLOPs an element) rather than saved: saving it would cost a write
    # forward and a read backward of M elements each.
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    dc = tl.load(DC + rows * s_dc + cols, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + rows * s_in + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + rows * s_in + cols, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    silu = a * sig
    tl.store(DB + rows * s_out + cols, (dc * silu).to(DB.dtype.element_ty), mask=mask)
    tl.store(
        DA + rows * s_out + cols,
        (dc * b * (sig + silu * (1.0 - sig))).to(DA.dtype.element_ty),
        mask=mask,
    )


def _grid(n_rows: int, n_cols: int) -> tuple[tuple[int], dict]:
    # tiles of TILE elements, at most COLS wide: short rows (I < COLS) stack several rows a tile,
    # long ones split into column blocks; one program a tile, no reuse, so any order will do
    block_n = min(COLS, triton.next_power_of_2(n_cols))
    block_m = max(1, TILE // block_n)
    grid = (triton.cdiv(n_rows, block_m) * triton.cdiv(n_cols, block_n),)
    return grid, dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=WARPS)


def _rows(x: torch.Tensor, width: int) -> torch.Tensor:
    """x as contiguous (N, width) rows."""
    return x.contiguous().view(-1, width)


def _fwd(a: torch.Tensor, b: torch.Tensor, s_in: int, shape: torch.Size) -> torch.Tensor:
    """c (contiguous, `shape`) = silu(a) * b for (N, I) row views a, b with row stride s_in."""
    n, i = a.shape
    c = torch.empty(shape, dtype=a.dtype, device=a.device)
    grid, meta = _grid(n, i)
    _swiglu_fwd_kernel[grid](a, b, s_in, c, i, n, i, **meta)
    return c


def _bwd(
    dc: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    s_in: int,
    da: torch.Tensor,
    db: torch.Tensor,
    s_out: int,
) -> None:
    """da, db (row views with row stride s_out) of silu(a) * b for the contiguous (N, I) gradient
    dc."""
    n, i = a.shape
    grid, meta = _grid(n, i)
    _swiglu_bwd_kernel[grid](dc, i, a, b, s_in, da, db, s_out, n, i, **meta)


@torch.library.custom_op("optbench::swiglu_fwd", mutates_args=())
def swiglu_fwd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c = silu(a) * b (contiguous, a's shape and dtype). An opaque op, so torch.compile never
    traces the launch."""
    i = a.shape[-1]
    return _fwd(_rows(a, i), _rows(b, i), i, a.shape)


@swiglu_fwd.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape)


@torch.library.custom_op("optbench::swiglu_bwd", mutates_args=())
def swiglu_bwd(
    dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) of c = silu(a) * b for the incoming gradient dc, contiguous, in a's and b's
    dtypes."""
    i = a.shape[-1]
    da = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    db = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    _bwd(_rows(dc, i), _rows(a, i), _rows(b, i), i, da.view(-1, i), db.view(-1, i), i)
    return da, db


@swiglu_bwd.register_fake
def _(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a.new_empty(a.shape), b.new_empty(b.shape)


@torch.library.custom_op("optbench::swiglu_packed_fwd", mutates_args=())
def swiglu_packed_fwd(gu: torch.Tensor) -> torch.Tensor:
    """c (..., I) = silu(a) * b for gu = [a, b] (..., 2I), contiguous, in gu's dtype."""
    i = gu.shape[-1] // 2
    g = _rows(gu, 2 * i)
    return _fwd(g[:, :i], g[:, i:], 2 * i, (*gu.shape[:-1], i))


@swiglu_packed_fwd.register_fake
def _(gu: torch.Tensor) -> torch.Tensor:
    return gu.new_empty((*gu.shape[:-1], gu.shape[-1] // 2))


@torch.library.custom_op("optbench::swiglu_packed_bwd", mutates_args=())
def swiglu_packed_bwd(dc: torch.Tensor, gu: torch.Tensor) -> torch.Tensor:
    """d gu = [da, db] (gu's shape and dtype, contiguous) of silu(a) * b for the incoming gradient
    dc."""
    # a and b are the halves of each row of gu, da and db the halves of each row of dgu: the
    # same kernels with row stride 2I, so the fused GEMM's gradient is written in one pass
    i = gu.shape[-1] // 2
    g = _rows(gu, 2 * i)
    dgu = torch.empty(gu.shape, dtype=gu.dtype, device=gu.device)
    d = dgu.view(-1, 2 * i)
    _bwd(_rows(dc, i), g[:, :i], g[:, i:], 2 * i, d[:, :i], d[:, i:], 2 * i)
    return dgu


@swiglu_packed_bwd.register_fake
def _(dc: torch.Tensor, gu: torch.Tensor) -> torch.Tensor:
    return gu.new_empty(gu.shape)


class SwiGLUFunction(torch.autograd.Function):
    """a, b of one shape and dtype (fp32/bf16/fp16) -> silu(a) * b, same shape and dtype.

    Saves a and b only. Backward: da = dc * b * silu'(a), db = dc * silu(a).
    """

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(
                f"a and b must match: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
            )
        ctx.save_for_backward(a, b)
        return swiglu_fwd(a, b)

    @staticmethod
    def backward(ctx, dc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return swiglu_bwd(dc, a, b)


class SwiGLUPackedFunction(torch.autograd.Function):
    """gu = [a, b] (..., 2I) -> silu(a) * b (..., I) in gu's dtype. Saves gu; backward writes d gu
    at once."""

    @staticmethod
    def forward(ctx, gu: torch.Tensor) -> torch.Tensor:
        if gu.shape[-1] % 2:
            raise ValueError(
                f"a packed gate/up tensor needs an even last dim, got {tuple(gu.shape)}"
            )
        ctx.save_for_backward(gu)
        return swiglu_packed_fwd(gu)

    @staticmethod
    def backward(ctx, dc: torch.Tensor) -> torch.Tensor:
        (gu,) = ctx.saved_tensors
        return swiglu_packed_bwd(dc, gu)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Triton silu(a) * b for same-shape a, b (any shape; non-contiguous inputs are copied
    first)."""
    return SwiGLUFunction.apply(a, b)


def swiglu_packed(gu: torch.Tensor) -> torch.Tensor:
    """Triton silu(a) * b for gu = [a, b] along the last dim (a fused gate/up projection's
    output)."""
    return SwiGLUPackedFunction.apply(gu)
