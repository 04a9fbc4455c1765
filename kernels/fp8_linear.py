"""A Linear layer whose three GEMMs run in FP8, one dynamic scale per tensor, its casts in Triton.

The recipe is torchao's tensorwise float8 training (``Float8LinearConfig()``): the input and the
weight in e4m3, the output gradient in e5m2; each tensor scaled by ``max / amax`` (its largest
magnitude mapped to the format's largest finite value), the product clamped to +-max and rounded to
nearest even; each GEMM a ``torch._scaled_mm`` with the inverse scales. What is ours is the cast.
cuBLAS's FP8 GEMMs on Hopper take only the "TN" layout (the first operand row-major, the second
column-major), so every operand a linear layer uses twice is needed in both layouts:

    forward        y  = x @ W^T   a = x  (M, K)   b = W^T as (K, N) column-major: W itself
    grad input     dx = g @ W     a = g  (M, N)   b = W   as (N, K) column-major: W^T row-major
    grad weight    dW = g^T @ x   a = g^T (N, M)  b = x   as (M, K) column-major: x^T row-major

:func:`fp8_cast_both` writes a tensor's FP8 values in both layouts in one pass, the transposed tile
through shared memory, after one pass that takes the amax: 6 bytes an element from a 16-bit
tensor (read 2 for the amax, read 2, write 1 + 1), the fewest bytes a tensorwise cast can move.
Inductor, fusing torchao's casts, writes each transposed copy in passes of its own at about a third
of the copy rate (NOTES.md). The forward saves the FP8 transposes of x and W for the backward, not x
and W: the backward casts only the gradient.

Sources: Micikevicius et al., "FP8 Formats for Deep Learning" (2022, https://arxiv.org/abs/2209.05433)
for e4m3 / e5m2 and per-tensor scaling; torchao's float8 training
(https://github.com/pytorch/ao/tree/main/torchao/float8) for the recipe this reproduces: its scale
``max / clamp(amax, 1e-12)`` taken in float64, its saturated cast, its inverse scales and its
forward GEMM's fast accumulation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}
AMAX_FLOOR = 1e-12  # torchao's EPS: an all-zero tensor keeps a finite scale
AMAX_BLOCK = 8192  # elements per program of the amax pass
# The cast pass's tile (rows x columns) and warps: the fastest of four tiles at the 1B step's
# shapes on an H200 (scripts/probes/fp8_cast_probe.py), within 3% of the others.
CAST_ROWS, CAST_COLS, CAST_WARPS = 64, 128, 4


@triton.jit
def _fp8_amax_kernel(X, AMAX, n, BLOCK: tl.constexpr):
    """AMAX[0] = max(AMAX[0], max |x|) over one block of the flat x; AMAX starts at 0."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32)
    # |x| >= 0, where IEEE order and the bits' integer order agree: the atomic max is exact
    tl.atomic_max(AMAX, tl.max(tl.abs(x), axis=0))


@triton.jit
def _fp8_cast_both_kernel(
    X,
    AMAX,
    Y,
    YT,
    INV_SCALE,
    M,
    N,
    FP8_MAX: tl.constexpr,
    FLOOR: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    """One (BM, BN) tile of the (M, N) x: y = round(clamp(x * scale, +-FP8_MAX)) into Y (M, N) and
    its transpose into YT (N, M), scale = FP8_MAX / max(amax, FLOOR); program (0, 0) writes
    1 / scale, the GEMM's scale, to INV_SCALE."""
    # torchao divides in float64 and rounds the scale to float32; the inverse is float32's
    # correctly rounded reciprocal (div_rn, not the approximate division). Same bits, same GEMMs.
    amax = tl.maximum(tl.load(AMAX).to(tl.float64), FLOOR)
    scale = (FP8_MAX / amax).to(tl.float32)
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if (pid_m == 0) & (pid_n == 0):
        tl.store(INV_SCALE, tl.math.div_rn(1.0, scale))
    rm = pid_m.to(tl.int64) * BM + tl.arange(0, BM)
    rn = pid_n.to(tl.int64) * BN + tl.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    x = tl.load(X + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(tl.float32)
    y = tl.clamp(x * scale, -FP8_MAX, FP8_MAX).to(Y.dtype.element_ty)
    tl.store(Y + rm[:, None] * N + rn[None, :], y, mask=mask)
    tl.store(YT + rn[:, None] * M + rm[None, :], tl.trans(y), mask=tl.trans(mask))


def cast_both_triton(
    x: torch.Tensor, fmt: str, tile: tuple[int, int, int] = (CAST_ROWS, CAST_COLS, CAST_WARPS)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, y^T contiguous, 1 / scale) of a contiguous 2-D x cast to ``fmt`` ('e4m3' | 'e5m2') with
    one scale for the tensor, by this module's two Triton kernels; ``tile``: the cast pass's rows,
    columns and warps."""
    if x.dim() != 2 or not x.is_contiguous() or x.numel() == 0:
        raise ValueError(f"the Triton cast takes a contiguous, non-empty 2-D tensor: {x.shape}")
    m, n = x.shape
    dtype = FORMATS[fmt]
    amax = torch.zeros(1, device=x.device, dtype=torch.float32)
    _fp8_amax_kernel[(triton.cdiv(m * n, AMAX_BLOCK),)](x, amax, m * n, BLOCK=AMAX_BLOCK)
    y = torch.empty(m, n, device=x.device, dtype=dtype)
    yt = torch.empty(n, m, device=x.device, dtype=dtype)
    inv_scale = torch.empty((), device=x.device, dtype=torch.float32)
    rows, cols, warps = tile
    grid = (triton.cdiv(m, rows), triton.cdiv(n, cols))
    fp8_max = torch.finfo(dtype).max
    _fp8_cast_both_kernel[grid](
        x, amax, y, yt, inv_scale, m, n, FP8_MAX=fp8_max, FLOOR=AMAX_FLOOR, BM=rows, BN=cols,
        num_warps=warps,
    )  # fmt: skip
    return y, yt, inv_scale


def cast_both_eager(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference of :func:`cast_both_triton` in torch's ops, as torchao computes it."""
    dtype = FORMATS[fmt]
    fp8_max = torch.finfo(dtype).max
    scale = (fp8_max / x.abs().amax().double().clamp(min=AMAX_FLOOR)).float()
    y = (x.float() * scale).clamp(-fp8_max, fp8_max).to(dtype)
    return y, y.t().contiguous(), scale.reciprocal()


@torch.library.custom_op("optbench::fp8_cast_both", mutates_args=(), device_types="cuda")
def fp8_cast_both(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, y^T, 1 / scale): the 2-D x cast to FP8 ``fmt`` with one dynamic scale, in both layouts
    (module docstring). An opaque op, so torch.compile never traces the launch. A 16-bit x takes
    the Triton kernels, an fp32 one (a weight kept in fp32) torch's ops: on an H200, Triton 3.6
    wrote the transposed tile of an fp32 x wrong (a quarter to a half of its elements, whether the
    tile was transposed before or after its rounding to FP8)."""
    if x.dtype == torch.float32:
        return cast_both_eager(x, fmt)
    return cast_both_triton(x.contiguous(), fmt)


@fp8_cast_both.register_kernel("cpu")
def _(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Triton's interpreter rounds to fp8 without the carry into the exponent (127.4 becomes 64,
    # not 128), so a CPU runs torch's cast; tests check the kernels on values fp8 holds exactly.
    return cast_both_eager(x, fmt)


@fp8_cast_both.register_fake
def _(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, n = x.shape
    dtype = FORMATS[fmt]
    return (
        x.new_empty((m, n), dtype=dtype),
        x.new_empty((n, m), dtype=dtype),
        x.new_empty((), dtype=torch.float32),
    )


def _scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    inv_a: torch.Tensor,
    inv_b: torch.Tensor,
    dtype: torch.dtype,
    fast_accum: bool,
) -> torch.Tensor:
    """(a * inv_a) @ (b * inv_b) in ``dtype``: a row-major, b column-major, both FP8."""
    return torch._scaled_mm(
        a, b, scale_a=inv_a, scale_b=inv_b, out_dtype=dtype, use_fast_accum=fast_accum
    )


class FP8LinearFunction(torch.autograd.Function):
    """x (..., K), weight (N, K) -> x @ weight^T (..., N) in x's dtype (autocast's where it is on),
    through FP8 GEMMs (module docstring). The forward GEMM accumulates fast, as torchao's does; the
    two backward GEMMs too where ``fast_accum``. Saves x^T and W^T in FP8 with their inverse
    scales."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, fast_accum: bool) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):  # as torchao's Float8Linear: autocast's dtype
            x = x.to(torch.get_autocast_dtype(x.device.type))
        x2 = x.reshape(-1, x.shape[-1])
        x8, x8t, inv_x = fp8_cast_both(x2, "e4m3")
        w8, w8t, inv_w = fp8_cast_both(weight, "e4m3")
        ctx.save_for_backward(x8t, w8t, inv_x, inv_w)
        ctx.fast_accum = fast_accum
        y = _scaled_mm(x8, w8.t(), inv_x, inv_w, x.dtype, fast_accum=True)
        return y.view(*x.shape[:-1], w8.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x8t, w8t, inv_x, inv_w = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        g8, g8t, inv_g = fp8_cast_both(g2, "e5m2")
        grad_x = _scaled_mm(g8, w8t.t(), inv_g, inv_w, grad.dtype, ctx.fast_accum)
        grad_w = _scaled_mm(g8t, x8t.t(), inv_g, inv_x, grad.dtype, ctx.fast_accum)
        # grad_w in the gradient's dtype: autograd casts it to an fp32 weight's, as torchao's
        return grad_x.view(*grad.shape[:-1], w8t.shape[0]), grad_w, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, fast_accum: bool = False) -> torch.Tensor:
    """x @ weight^T through FP8 GEMMs with Triton casts (:class:`FP8LinearFunction`)."""
    return FP8LinearFunction.apply(x, weight, fast_accum)


class FP8Linear(torch.nn.Linear):
    """A bias-free Linear layer whose forward is :func:`fp8_linear`; ``fast_accum`` as there. Made
    by swapping an ``nn.Linear``'s class (``models.step.to_float8``): its weight stays the same
    Parameter."""

    fast_accum: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            raise ValueError("kernels.fp8_linear's layers have no bias")
        return fp8_linear(x, self.weight, self.fast_accum)
