"""SwiGLU gate, c = silu(a) * b, with forward and backward as flat elementwise Triton kernels.

The kernels compute in fp32 and store in the input dtype; the backward recomputes silu(a) from a.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import flat, warps_for

BLOCK = 2048  # elements per program
WARPS = warps_for(BLOCK, per_thread=8)  # one 16-byte vector per thread and tensor for 16-bit dtypes


def swiglu_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Eager reference (HF Llama MLP): silu(a) * b in the input dtype."""
    return F.silu(a) * b


@triton.jit
def _swiglu_fwd_kernel(A, B, C, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(C + offs, (a * tl.sigmoid(a) * b).to(C.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(DC, A, B, DA, DB, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dc = tl.load(DC + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    silu = a * sig
    tl.store(DB + offs, (dc * silu).to(DB.dtype.element_ty), mask=mask)
    tl.store(DA + offs, (dc * b * (sig + silu * (1.0 - sig))).to(DA.dtype.element_ty), mask=mask)


@torch.library.custom_op("optbench::swiglu_fwd", mutates_args=())
def swiglu_fwd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c = silu(a) * b (contiguous, a's shape and dtype). An opaque op, so torch.compile never traces the launch."""
    a1, b1 = flat(a), flat(b)
    c = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    n = a1.numel()
    _swiglu_fwd_kernel[(triton.cdiv(n, BLOCK),)](a1, b1, c, n, BLOCK=BLOCK, num_warps=WARPS)
    return c


@swiglu_fwd.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape)


@torch.library.custom_op("optbench::swiglu_bwd", mutates_args=())
def swiglu_bwd(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) of c = silu(a) * b for the incoming gradient dc, contiguous, in a's and b's dtypes."""
    a1, b1 = flat(a), flat(b)
    n = a1.numel()
    da = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    db = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    _swiglu_bwd_kernel[(triton.cdiv(n, BLOCK),)](flat(dc), a1, b1, da, db, n, BLOCK=BLOCK, num_warps=WARPS)
    return da, db


@swiglu_bwd.register_fake
def _(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a.new_empty(a.shape), b.new_empty(b.shape)


class SwiGLUFunction(torch.autograd.Function):
    """a, b of one shape and dtype (fp32/bf16/fp16) -> silu(a) * b, same shape and dtype.

    Saves a and b only. Backward: da = dc * b * silu'(a), db = dc * silu(a).
    """

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"a and b must match: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
        ctx.save_for_backward(a, b)
        return swiglu_fwd(a, b)

    @staticmethod
    def backward(ctx, dc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return swiglu_bwd(dc, a, b)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Triton silu(a) * b for same-shape a, b (any shape; non-contiguous inputs are copied first)."""
    return SwiGLUFunction.apply(a, b)
