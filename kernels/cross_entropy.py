"""Cross-entropy over a vocabulary: one Triton launch writes the loss and the logits-gradient.

Shapes: logits (N, V) in fp32/bf16/fp16, target (N,) int64 with values in [0, V) or
``ignore_index``. The loss is always computed and returned in fp32. Semantics follow
``F.cross_entropy`` (hard labels, ``label_smoothing``, ``ignore_index``, reduction 'mean' | 'sum' |
'none'; 'mean' divides by the number of non-ignored tokens).

The kernel runs one program per row. For V up to ``MAX_ONE_BLOCK_V`` the row is held in registers:
one read, one write. Wider rows loop over the vocabulary in ``TWO_PASS_BLOCK`` columns with an
online max / sum-exp: two reads, one write. No fp32 copy of the logits is ever made. The gradient
``(softmax - (1 - eps) * onehot - eps / V) * scale`` (scale = 1 / n_valid for 'mean', else 1) is
written during the forward, by default into the logits buffer itself; the backward only multiplies
it by ``grad_output``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.utils.checkpoint import checkpoint

# Sources: the one-pass max / sum-exp is Milakov and Gimelshein, "Online normalizer calculation for
# softmax" (2018, https://arxiv.org/abs/1805.02867); label smoothing is Szegedy et al., "Rethinking
# the Inception Architecture for Computer Vision" (2016, https://arxiv.org/abs/1512.00567), with
# ``F.cross_entropy``'s semantics. Writing the gradient during the forward, into the logits' own
# buffer, is what Liger-Kernel's cross-entropy does
# (https://github.com/linkedin/Liger-Kernel/blob/main/src/liger_kernel/ops/cross_entropy.py).

REDUCTIONS = ("mean", "sum", "none")
# Rows up to this width are processed from registers in one pass. Wider rows loop over
# TWO_PASS_BLOCK columns. 16384, not 32768: a 32000-wide row (bf16, H100) runs faster as two passes
# of 16384 (the second read mostly from L2, more programs resident) than as one register-resident
# block of 32768.
MAX_ONE_BLOCK_V = 16384
TWO_PASS_BLOCK = 16384
ELEMENTS_PER_THREAD = 32  # num_warps = BLOCK / (32 * ELEMENTS_PER_THREAD), within [4, 32]

_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _ce_fwd_kernel(
    x_ptr,
    grad_ptr,
    target_ptr,
    loss_ptr,
    n_valid_ptr,
    stride_x,
    stride_g,
    ignore_index,
    smoothing,
    V: tl.constexpr,
    MEAN: tl.constexpr,
    SMOOTH: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
):
    """One row: loss_ptr[row] = unscaled fp32 loss; grad row (may alias the logits row) =
    dloss/dlogits.

    V is a compile-time constant (one compilation per vocabulary size), so the loop bounds are
    static.
    """
    # Memory per row (s bytes per logit): reads V*s logits and the int64 target, writes the fp32
    # loss and, with WRITE_GRAD, V*s of gradient, for which the two-pass path (not ONE_BLOCK) reads
    # the logits a second time (often from L2).
    # With p = softmax(x) and the smoothed target q_j = (1 - eps) [j == y] + eps / V:
    #   loss = -sum_j q_j log p_j = lse(x) - (1 - eps) x_y - (eps / V) sum_j x_j,
    #   lse(x) = m + log(sum_j exp(x_j - m)), m = max_j x_j (no exp overflows)
    #   d loss / d x_j = p_j - q_j = exp(x_j - m) / d - (1 - eps) [j == y] - eps / V
    # with d = sum_j exp(x_j - m): the forward's statistics give the gradient with no second
    # reduction. exp(t) is computed as exp2(t * log2(e)), the hardware's native exponential.
    row = tl.program_id(0).to(tl.int64)
    x_ptr += row * stride_x
    grad_ptr += row * stride_g
    cols = tl.arange(0, BLOCK)
    y = tl.load(target_ptr + row)
    if y == ignore_index:
        tl.store(loss_ptr + row, 0.0)
        if WRITE_GRAD:
            for start in range(0, V, BLOCK):
                tl.store(grad_ptr + start + cols, 0.0, mask=start + cols < V)
        return

    # Read x[y] before any thread can overwrite it (the gradient may alias the logits).
    x_y = tl.load(x_ptr + y).to(tl.float32)
    if ONE_BLOCK:
        x = tl.load(x_ptr + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m = tl.max(x, 0)
        d = tl.sum(tl.exp2((x - m) * _LOG2E), 0)
        if SMOOTH:
            sum_x = tl.sum(tl.where(cols < V, x, 0.0), 0)
    else:
        # online max / sum-exp over blocks: when the running max rises from m to m_new, the sum
        # so far is rescaled by exp(m - m_new), so one read of the row gives both
        m = float("-inf")
        d = 0.0
        sum_x = 0.0
        for start in range(0, V, BLOCK):
            xb = tl.load(x_ptr + start + cols, mask=start + cols < V, other=float("-inf")).to(
                tl.float32
            )
            m_new = tl.maximum(m, tl.max(xb, 0))
            d = d * tl.exp2((m - m_new) * _LOG2E) + tl.sum(tl.exp2((xb - m_new) * _LOG2E), 0)
            m = m_new
            if SMOOTH:
                sum_x += tl.sum(tl.where(start + cols < V, xb, 0.0), 0)

    lse = m + tl.log(d)
    if SMOOTH:
        loss = lse - (1.0 - smoothing) * x_y - smoothing / V * sum_x
    else:
        loss = lse - x_y
    tl.store(loss_ptr + row, loss)

    if WRITE_GRAD:
        # the gradient of the reduced loss: 'mean' divides each row's by n_valid (read from the
        # device, so no host sync), 'sum' and 'none' leave it as is
        scale = 1.0
        if MEAN:
            scale = 1.0 / tl.load(n_valid_ptr).to(tl.float32)
        p_scale = scale / d
        hit = (1.0 - smoothing) * scale
        floor = smoothing / V * scale
        # every thread's reads of the row are done before any overwrites it (in-place gradient)
        tl.debug_barrier()
        if ONE_BLOCK:
            g = tl.exp2((x - m) * _LOG2E) * p_scale - floor
            g = tl.where(cols == y, g - hit, g)
            tl.store(grad_ptr + cols, g.to(grad_ptr.dtype.element_ty), mask=cols < V)
        else:
            for start in range(0, V, BLOCK):
                mask = start + cols < V
                xb = tl.load(x_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
                g = tl.exp2((xb - m) * _LOG2E) * p_scale - floor
                g = tl.where(start + cols == y, g - hit, g)
                tl.store(grad_ptr + start + cols, g.to(grad_ptr.dtype.element_ty), mask=mask)


def _ce_config(V: int) -> tuple[int, bool, int]:
    """(BLOCK, ONE_BLOCK, num_warps) for a row of V logits."""
    # a row in one register block up to MAX_ONE_BLOCK_V, else TWO_PASS_BLOCK columns at a time;
    # about ELEMENTS_PER_THREAD logits per thread, 4 to 32 warps
    one_block = V <= MAX_ONE_BLOCK_V
    block = triton.next_power_of_2(V) if one_block else TWO_PASS_BLOCK
    return block, one_block, max(4, min(32, block // (32 * ELEMENTS_PER_THREAD)))


def num_valid(target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Number of non-ignored targets, as a 0-d int64 tensor on target's device (no host sync)."""
    return (target != ignore_index).sum()


def ce_loss_and_grad_(
    logits: torch.Tensor,
    target: torch.Tensor,
    loss_rows: torch.Tensor,
    grad: torch.Tensor | None,
    n_valid: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
) -> None:
    """Launch the kernel: fp32 per-row losses (unscaled) into ``loss_rows`` (N,), dloss/dlogits into
    ``grad``.

    ``grad`` is (N, V) of any float dtype and may be ``logits`` itself; ``None`` skips the gradient.
    ``n_valid`` (0-d tensor) scales the gradient by 1 / n_valid ('mean'); ``None`` means scale 1.
    Both ``logits`` and ``grad`` need unit stride along V.
    """
    n_rows, V = logits.shape
    if n_rows == 0:
        return
    block, one_block, num_warps = _ce_config(V)
    grad_buf = logits if grad is None else grad  # never written when grad is None
    _ce_fwd_kernel[(n_rows,)](
        logits,
        grad_buf,
        target,
        loss_rows,
        n_valid,
        logits.stride(0),
        grad_buf.stride(0),
        ignore_index,
        label_smoothing,
        V=V,
        MEAN=n_valid is not None,
        SMOOTH=label_smoothing > 0.0,
        WRITE_GRAD=grad is not None,
        BLOCK=block,
        ONE_BLOCK=one_block,
        num_warps=num_warps,
    )


def reduce_loss(
    loss_rows: torch.Tensor, n_valid: torch.Tensor | None, reduction: str
) -> torch.Tensor:
    """Per-row fp32 losses -> the requested reduction ('mean' needs ``n_valid``)."""
    if reduction == "none":
        return loss_rows
    total = loss_rows.sum()
    return total / n_valid if reduction == "mean" else total


@triton.jit
def _scale_kernel(x_ptr, scale_ptr, n, BLOCK: tl.constexpr):
    """x *= scale (a 0-d device tensor) in place, BLOCK elements a program: the chain rule's
    d loss / d x = grad_output * (d loss / d x at grad_output 1). Reads and writes n elements
    (2n*s bytes) when scale != 1, none otherwise."""
    scale = tl.load(scale_ptr).to(tl.float32)
    if scale != 1.0:  # the usual grad_output of a loss is 1: then nothing is read or written
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        tl.store(x_ptr + offs, (x * scale).to(x_ptr.dtype.element_ty), mask=mask)


def scale_by_(grad: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """``grad *= grad_output`` in place for a 0-d grad_output, without a host sync (a no-op pass
    when it is 1)."""
    # a per-row grad_output ('none') or a strided gradient: torch's broadcast multiply; a 0-d
    # one goes to the kernel, which reads it on the device and skips the pass when it is 1
    if grad_output.ndim != 0 or not grad.is_contiguous():
        return grad.mul_(grad_output)
    BLOCK = 4096
    _scale_kernel[(triton.cdiv(grad.numel(), BLOCK),)](
        grad, grad_output.detach().contiguous(), grad.numel(), BLOCK=BLOCK, num_warps=8
    )
    return grad


def check_args(
    reduction: str, label_smoothing: float, allowed: tuple[str, ...] = REDUCTIONS
) -> None:
    """Validate reduction and label_smoothing."""
    if reduction not in allowed:
        raise ValueError(f"reduction must be one of {allowed}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


class CrossEntropyFunction(torch.autograd.Function):
    """Autograd wrapper: the gradient is computed in the forward; backward scales it by grad_output
    in place.

    With ``inplace_grad`` the gradient overwrites the logits buffer, so the logits' values are gone
    after the forward (whenever they require grad): nothing else may need them, and backward may run
    only once.
    """

    @staticmethod
    def forward(
        ctx,
        logits: torch.Tensor,
        target: torch.Tensor,
        ignore_index: int,
        label_smoothing: float,
        reduction: str,
        inplace_grad: bool,
    ) -> torch.Tensor:
        check_args(reduction, label_smoothing)
        if logits.ndim != 2 or target.shape != logits.shape[:1]:
            raise ValueError(
                f"expected logits (N, V) and target (N,), got {logits.shape} and {target.shape}"
            )
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        target = target.contiguous()
        n_valid = num_valid(target, ignore_index) if reduction == "mean" else None
        grad = None
        if ctx.needs_input_grad[0]:
            # in place, the gradient takes the logits' memory: no second (N, V) buffer
            grad = logits if inplace_grad else torch.empty_like(logits)
        loss_rows = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        ce_loss_and_grad_(logits, target, loss_rows, grad, n_valid, ignore_index, label_smoothing)
        if grad is not None:
            ctx.save_for_backward(grad.detach())
        return reduce_loss(loss_rows, n_valid, reduction)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        # d loss / d logits = grad_output * G, G written by the forward at grad_output 1: one
        # scalar for 'mean' and 'sum' (skipped when it is 1), one per row for 'none'
        (grad,) = ctx.saved_tensors
        if grad_output.ndim == 1:
            grad.mul_(grad_output.unsqueeze(1))
        else:
            scale_by_(grad, grad_output)
        return grad, None, None, None, None, None


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    inplace_grad: bool = True,
) -> torch.Tensor:
    """Triton cross-entropy of logits (N, V) against target (N,); fp32 loss (0-d, or (N,) for
    'none').

    ``inplace_grad=True`` (default) stores d loss / d logits in the logits buffer during the
    forward: the logits must not be used afterwards. ``inplace_grad=False`` writes it to a new (N,
    V) buffer instead.
    """
    return CrossEntropyFunction.apply(
        logits, target, ignore_index, label_smoothing, reduction, inplace_grad
    )


def cross_entropy_eager(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """Reference: ``F.cross_entropy`` on logits upcast to at least fp32 (materializes an fp32
    copy)."""
    upcast = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(
        upcast,
        target,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
    )


def fused_linear_cross_entropy_eager(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """Reference LM head + loss: full logits ``hidden @ weight.T`` (N, V) in the input dtype, eager
    CE."""
    return cross_entropy_eager(
        hidden @ weight.t(), target, ignore_index, label_smoothing, reduction
    )


def default_chunk_size(n_tokens: int, hidden_size: int, vocab_size: int) -> int:
    """Tokens per chunk so that a (chunk, V) logits chunk holds about as many elements as (N, H)
    hidden: next_pow2(ceil(N / ceil(V / H)))."""
    return max(
        1, triton.next_power_of_2(triton.cdiv(n_tokens, triton.cdiv(vocab_size, hidden_size)))
    )


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    chunk_size: int | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """Plain-PyTorch "chunked CE" of ``hidden @ weight.T``: hidden (N, H), weight (V, H), target
    (N,).

    Each chunk of ``chunk_size`` tokens computes its logits and eager CE under
    ``torch.utils.checkpoint``, so only the chunk inputs are kept for backward and the logits are
    recomputed there. Returns an fp32 loss.
    """
    check_args(reduction, label_smoothing)
    n_tokens = hidden.shape[0]
    chunk = chunk_size or default_chunk_size(n_tokens, hidden.shape[1], weight.shape[0])
    # chunks sum their losses ('mean' divides once by the valid count over all chunks, so a
    # chunk's share does not depend on how many of its tokens are ignored); the checkpoint keeps
    # each chunk's inputs only and recomputes its (chunk, V) logits in the backward
    part_reduction = "none" if reduction == "none" else "sum"
    parts = [
        checkpoint(
            fused_linear_cross_entropy_eager,
            hidden[start : start + chunk],
            weight,
            target[start : start + chunk],
            ignore_index,
            label_smoothing,
            part_reduction,
            use_reentrant=False,
        )
        for start in range(0, n_tokens, chunk)
    ]
    if reduction == "none":
        return torch.cat(parts)
    total = torch.stack(parts).sum()
    return total / num_valid(target, ignore_index) if reduction == "mean" else total
