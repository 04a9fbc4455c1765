"""Fused LM head + cross-entropy: loss of ``hidden @ weight.T`` without ever holding the full (N, V)
logits.

hidden (N, H) and weight (V, H) share one float dtype; target (N,) int64. Tokens are processed in
chunks; per chunk of C tokens: ``logits = hidden_c @ weight.T`` (torch matmul into one reused (C, V)
buffer, input dtype), the Triton CE kernel of ``kernels.cross_entropy`` writes the fp32 loss rows
and the logits-gradient in place, then ``grad_weight += grad_logits.T @ hidden_c`` (accumulated in
weight's dtype, the first chunk writing it directly) and ``grad_hidden_c = grad_logits @ weight``.
All gradient work happens in the forward; backward only multiplies by grad_output (skipped when it
is 1; for fp16 'mean', by grad_output / n_valid, so that GradScaler's loss scale reaches the
gradients before they would underflow). Extra memory: grad_hidden (N, H) + grad_weight (V, H) + one
(C, V) logits chunk + N fp32 loss rows.

With ``inplace_grad_hidden`` each chunk's grad_hidden overwrites that chunk of ``hidden`` once the
chunk is done (the hidden values are gone after the forward). The N * H elements this frees go to a
larger default chunk (:func:`inplace_chunk_size`) within the same memory; larger chunks make the
grad_weight GEMM (inner size C, read-modify-write of grad_weight once per chunk) less memory-bound.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from kernels.cross_entropy import (
    ce_loss_and_grad_,
    check_args,
    default_chunk_size,
    fused_linear_cross_entropy_eager,
    num_valid,
    reduce_loss,
    scale_by_,
)

# Sources: chunking the LM head so that the (N, V) logits never exist at once, with the gradient
# taken during the forward, is Liger-Kernel's fused linear cross-entropy
# (https://github.com/linkedin/Liger-Kernel/blob/main/src/liger_kernel/ops/fused_linear_cross_entropy.py);
# Wijmans et al., "Cut Your Losses in Large-Vocabulary Language Models" (2024,
# https://arxiv.org/abs/2411.09009) go further and never materialize a logits chunk.

__all__ = [
    "FusedLinearCrossEntropy",
    "FusedLinearCrossEntropyFunction",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_eager",
    "inplace_chunk_size",
]


def inplace_chunk_size(n_tokens: int, hidden_size: int, vocab_size: int) -> int:
    """Default chunk with ``inplace_grad_hidden``: the largest multiple of 128 tokens (at least the
    plain default C0) whose logits chunk fits in C0 * V + N * H elements, i.e. the default's
    memory."""
    base = default_chunk_size(n_tokens, hidden_size, vocab_size)
    return max(base, (base + n_tokens * hidden_size // vocab_size) // 128 * 128)


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    """Autograd wrapper: gradients are computed in the forward; backward scales them by grad_output
    in place, so it may run only once per forward."""

    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        target: torch.Tensor,
        ignore_index: int,
        label_smoothing: float,
        reduction: str,
        chunk_size: int | None,
        inplace_grad_hidden: bool,
    ) -> torch.Tensor:
        check_args(reduction, label_smoothing, allowed=("mean", "sum"))
        n_tokens, hidden_size = hidden.shape
        vocab_size = weight.shape[0]
        if (
            weight.shape[1] != hidden_size
            or target.shape != (n_tokens,)
            or weight.dtype != hidden.dtype
        ):
            raise ValueError(
                f"expected hidden (N, H), weight (V, H) of one dtype and target (N,); got "
                f"{hidden.shape} {hidden.dtype}, {weight.shape} {weight.dtype}, {target.shape}"
            )
        need_grad_h, need_grad_w = ctx.needs_input_grad[:2]
        inplace = inplace_grad_hidden and need_grad_h and hidden.is_contiguous()
        chunk = chunk_size or (inplace_chunk_size if inplace else default_chunk_size)(
            n_tokens, hidden_size, vocab_size
        )
        chunk = min(chunk, max(n_tokens, 1))
        target = target.contiguous()
        n_valid = num_valid(target, ignore_index) if reduction == "mean" else None
        # fp16: (softmax - onehot) / n_valid underflows fp16 before a GradScaler's loss scale
        # reaches it (that scale arrives as grad_output, in backward): keep the gradients unscaled,
        # apply 1 / n_valid in backward.
        defer_mean = n_valid is not None and hidden.dtype == torch.float16
        ctx.n_valid = n_valid if defer_mean else None
        loss_rows = torch.empty(n_tokens, dtype=torch.float32, device=hidden.device)
        # Memory: grad_hidden (N, H) (none extra in place), grad_weight (V, H) and one (C, V)
        # logits buffer that every chunk reuses, so the peak does not grow with N * V
        new = dict(dtype=hidden.dtype, device=hidden.device)
        grad_h = (
            hidden
            if inplace
            else torch.empty(n_tokens, hidden_size, **new)
            if need_grad_h
            else None
        )
        grad_w = torch.empty(vocab_size, hidden_size, **new) if need_grad_w else None
        logits_buf = torch.empty(chunk, vocab_size, **new)
        # Per chunk c of tokens, with logits z_c = h_c W^T (C, V) and G_c = d loss / d z_c, which
        # the CE kernel writes over z_c (softmax minus the smoothed one-hot, times the reduction's
        # 1 / n_valid unless deferred):
        #   d loss / d h_c = G_c W         (C, V) @ (V, H): this chunk's rows of grad_hidden
        #   d loss / d W  = sum_c G_c^T h_c (V, C) @ (C, H), accumulated over the chunks
        # so the backward of the GEMM z = h W^T is two GEMMs per chunk, done here, and only one
        # (C, V) chunk of logits exists at a time.
        for start in range(0, n_tokens, chunk):
            stop = min(start + chunk, n_tokens)
            hidden_c = hidden[start:stop]
            logits = logits_buf[: stop - start]
            torch.mm(hidden_c, weight.t(), out=logits)
            grad_logits = logits if need_grad_h or need_grad_w else None
            ce_loss_and_grad_(
                logits,
                target[start:stop],
                loss_rows[start:stop],
                grad_logits,
                None if defer_mean else n_valid,
                ignore_index,
                label_smoothing,
            )
            if need_grad_w:
                if start == 0:
                    torch.mm(grad_logits.t(), hidden_c, out=grad_w)
                else:
                    grad_w.addmm_(grad_logits.t(), hidden_c)
            if need_grad_h:  # after the last read of hidden_c, which it may overwrite
                torch.mm(grad_logits, weight, out=grad_h[start:stop])
        if need_grad_w and n_tokens == 0:  # no chunk ran: the sum over no tokens is zero
            grad_w.zero_()
        ctx.save_for_backward(grad_h, grad_w)
        return reduce_loss(loss_rows, n_valid, reduction)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        if ctx.n_valid is not None:
            grad_output = grad_output / ctx.n_valid
        for grad in (grad_h, grad_w):
            if grad is not None:
                scale_by_(grad, grad_output)
        return grad_h, grad_w, None, None, None, None, None, None


# one graph break at the LM head: torch.compile runs the chunk loop and its kernels as is
@torch.compiler.disable
def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
    inplace_grad_hidden: bool = False,
) -> torch.Tensor:
    """fp32 cross-entropy ('mean' or 'sum') of ``hidden (N, H) @ weight (V, H).T`` against target
    (N,).

    ``chunk_size`` tokens per chunk; default ``next_pow2(ceil(N / ceil(V / H)))``, so a logits chunk
    has about N * H elements (:func:`inplace_chunk_size` with ``inplace_grad_hidden``).
    ``inplace_grad_hidden=True`` stores d loss / d hidden in hidden's buffer (when hidden is
    contiguous and requires grad): hidden must not be used afterwards.
    """
    return FusedLinearCrossEntropyFunction.apply(
        hidden,
        weight,
        target,
        ignore_index,
        label_smoothing,
        reduction,
        chunk_size,
        inplace_grad_hidden,
    )


class FusedLinearCrossEntropy(nn.Module):
    """LM head (bias-free ``Linear(hidden_size, vocab_size)``) fused with its cross-entropy loss.

    ``forward(hidden (..., H), target (...)) -> fp32 loss``; ``self.weight`` is (V, H) and may be
    tied to an embedding by assignment.
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        chunk_size: int | None = None,
        inplace_grad_hidden: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_args(reduction, label_smoothing, allowed=("mean", "sum"))
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, device=device, dtype=dtype))
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.reduction = reduction
        self.chunk_size = chunk_size
        self.inplace_grad_hidden = inplace_grad_hidden
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Same initialization as ``nn.Linear``."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return fused_linear_cross_entropy(
            hidden.reshape(-1, hidden.shape[-1]),
            self.weight,
            target.reshape(-1),
            self.ignore_index,
            self.label_smoothing,
            self.reduction,
            self.chunk_size,
            self.inplace_grad_hidden,
        )

    def extra_repr(self) -> str:
        vocab_size, hidden_size = self.weight.shape
        return f"hidden_size={hidden_size}, vocab_size={vocab_size}, reduction={self.reduction!r}"
