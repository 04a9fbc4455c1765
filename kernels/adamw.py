"""AdamW over fp32 master weights, for a model whose matmul weights are bf16: one Triton pass per
tensor.

Under bf16 autocast with fp32 weights, every step casts each matmul weight to bf16 (read 4 + write 2
bytes per parameter), casts its bf16 gradient back to fp32 (2 + 4), and the gradient statistics read
the fp32 gradient and weight (4 + 4) before torch's fused AdamW reads and writes 32 (28, plus
writing back the clipped gradient): 52 bytes. Here the model holds the bf16 weights, so there are no
casts, the gradient norm reads the bf16 gradient (2), and one pass per tensor does the rest (28): it
reads the bf16 gradient, scaled by a device scalar (the clip coefficient) as it is read, the fp32
master weight and both moments, writes them back and the model's bf16 copy, and sums the squares of
the weights it read (the parameter norm) into one slot per program. The values are autocast's: its
cast rounds the weight as the copy does, and its weight gradient is the same bf16 product before the
cast.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import triton
import triton.language as tl

from kernels._common import warps_for

# Sources: Adam is Kingma and Ba (2015, https://arxiv.org/abs/1412.6980), with the weight decay
# decoupled from the gradient as in Loshchilov and Hutter, "Decoupled Weight Decay Regularization"
# (2019, https://arxiv.org/abs/1711.05101), in the form of torch.optim.AdamW
# (https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html); fp32 master copies of
# low-precision weights are Micikevicius et al., "Mixed Precision Training" (2018,
# https://arxiv.org/abs/1710.03740).

BLOCK = 2048  # elements per program
WARPS = warps_for(BLOCK, per_thread=8)


@triton.jit
def _adamw_kernel(
    MASTER,
    GRAD,
    EXP_AVG,
    EXP_AVG_SQ,
    WEIGHT,
    SCALARS,
    SUMSQ,
    n,
    lr_decay,
    beta1,
    beta2,
    eps,
    WRITE_WEIGHT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One AdamW step over BLOCK elements of one tensor (an optimizer: no backward), in fp32:
        g = grad * inv_grad_scale
        m = beta1 m + (1 - beta1) g,  v = beta2 v + (1 - beta2) g^2
        p = p (1 - lr wd) - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    i.e. torch's AdamW: the bias-corrected moments m / (1 - beta1^t), v / (1 - beta2^t), and the
    decay applied to the weight, not added to the gradient. The step-dependent factors come in
    SCALARS, computed on the device, so a CUDA graph replays the step as t grows. SUMSQ[pid] =
    the sum of squares of the weights this program read, before the update.
    """
    # Memory per element: reads the gradient (2 bytes bf16, 4 fp32) and the fp32 weight, m, v (12),
    # writes weight, m, v (12) and, with WRITE_WEIGHT, the bf16 copy (2): 28 bytes either way, the
    # floor of kernels/README.md; plus 4 bytes of SUMSQ per program.
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # 1 / grad_scale (the clip coefficient when clipping rides here)
    inv_grad_scale = tl.load(SCALARS)
    step_size = tl.load(SCALARS + 1)  # lr / (1 - beta1^t)
    inv_sqrt_bias2 = tl.load(SCALARS + 2)  # 1 / sqrt(1 - beta2^t)
    p = tl.load(MASTER + offs, mask=mask, other=0.0)
    g = tl.load(GRAD + offs, mask=mask, other=0.0).to(tl.float32) * inv_grad_scale
    m = tl.load(EXP_AVG + offs, mask=mask, other=0.0)
    v = tl.load(EXP_AVG_SQ + offs, mask=mask, other=0.0)
    # the parameter norm rides on this read of the weights: a separate norm would read them again
    tl.store(SUMSQ + pid, tl.sum(p * p, axis=0))
    m = m + (1.0 - beta1) * (g - m)  # lerp, as torch's AdamW
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p * lr_decay - step_size * m / (tl.sqrt(v) * inv_sqrt_bias2 + eps)
    tl.store(MASTER + offs, p, mask=mask)
    tl.store(EXP_AVG + offs, m, mask=mask)
    tl.store(EXP_AVG_SQ + offs, v, mask=mask)
    # the model's low-precision copy, rounded once from the fp32 master (what autocast's cast of
    # an fp32 weight would give)
    if WRITE_WEIGHT:
        tl.store(WEIGHT + offs, p.to(WEIGHT.dtype.element_ty), mask=mask)


def adamw_reference(
    master: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    grad_scale: float = 1.0,
) -> None:
    """Eager reference of one update, in place, in the tensors' dtype (float64 in the tests)."""
    beta1, beta2 = betas
    g = grad.to(master.dtype) / grad_scale
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).add_(g * g, alpha=1 - beta2)
    master.mul_(1 - lr * weight_decay)
    denom = exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5 + eps
    master.sub_(lr / (1 - beta1**step) * exp_avg / denom)


class MasterAdamW:
    """AdamW (torch's update, decoupled weight decay) holding fp32 master copies of low-precision
    weights.

    Build it on the model's fp32 parameters; those in ``low_precision`` are turned into ``dtype`` in
    place (the model then computes with them) while the optimizer keeps their fp32 values. The step
    count lives on the device and ``grad_scale`` (a device scalar, None for 1) divides the gradients
    as they are read, as in torch's fused AdamW, but the gradients are not written back. Nothing
    syncs with the host, so a step can be captured in a CUDA graph. ``param_norm()``: L2 norm of the
    fp32 weights before the last step.
    """

    grad_scale: torch.Tensor | None = None

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        low_precision: Iterable[torch.Tensor],
        lr: float,
        weight_decay: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        dtype: torch.dtype = torch.bfloat16,
    ):
        self.params = list(params)
        low = {id(p) for p in low_precision}
        if any(p.dtype != torch.float32 for p in self.params):
            raise ValueError("MasterAdamW is built on fp32 parameters")
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        self.low_precision = [id(p) in low for p in self.params]
        # an fp32 parameter is its own master
        self.masters = [
            p.detach().clone() if is_low else p.detach()
            for p, is_low in zip(self.params, self.low_precision)
        ]
        for p, is_low in zip(self.params, self.low_precision):
            if is_low:
                p.data = p.data.to(dtype)
        device = self.params[0].device
        self.exp_avgs = [torch.zeros_like(m) for m in self.masters]
        self.exp_avg_sqs = [torch.zeros_like(m) for m in self.masters]
        self.step_count = torch.zeros((), dtype=torch.float32, device=device)
        # one fp32 slot per program of every tensor for its sum of squares: param_norm() sums
        # them, so the parameter norm costs no pass of its own
        self._programs = [triton.cdiv(m.numel(), BLOCK) for m in self.masters]
        self._sumsq = torch.zeros(sum(self._programs), dtype=torch.float32, device=device)
        self._scalars = torch.ones(3, dtype=torch.float32, device=device)

    @property
    def state(self) -> dict[torch.Tensor, dict[str, torch.Tensor]]:
        """What the optimizer holds per parameter, as torch.optim's ``state``: the moments and, for
        a low-precision weight, its fp32 master (an fp32 parameter is its own); the step count with
        the first."""
        state = {}
        for i, (p, master, m, v) in enumerate(
            zip(self.params, self.masters, self.exp_avgs, self.exp_avg_sqs)
        ):
            state[p] = {
                "exp_avg": m,
                "exp_avg_sq": v,
                **({"master": master} if self.low_precision[i] else {}),
                **({"step": self.step_count} if i == 0 else {}),
            }
        return state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        # where profilers look for it
        with torch.profiler.record_function("Optimizer.step#MasterAdamW.step"):
            self._step()

    def _step(self) -> None:
        # The step count and the factors that depend on it live on the device: a captured CUDA
        # graph replays this step with t advancing, and nothing waits on the host. SCALARS holds
        # 1 / grad_scale, lr / (1 - beta1^t) and 1 / sqrt(1 - beta2^t), read once per program.
        beta1, beta2 = self.betas
        self.step_count.add_(1)
        inv_grad_scale = (
            1.0 / self.grad_scale
            if self.grad_scale is not None
            else torch.ones_like(self.step_count)
        )
        torch.stack(
            [
                inv_grad_scale.to(torch.float32).reshape(()),
                self.lr / (1 - torch.pow(beta1, self.step_count)),
                torch.rsqrt(1 - torch.pow(beta2, self.step_count)),
            ],
            out=self._scalars,
        )
        start = 0
        for p, master, m, v, programs in zip(
            self.params, self.masters, self.exp_avgs, self.exp_avg_sqs, self._programs
        ):
            if p.grad is None:
                raise RuntimeError("MasterAdamW.step: a parameter has no gradient")
            _adamw_kernel[(programs,)](
                master,
                p.grad.contiguous(),
                m,
                v,
                p,
                self._scalars,
                self._sumsq[start:],
                master.numel(),
                1 - self.lr * self.weight_decay,
                beta1,
                beta2,
                self.eps,
                WRITE_WEIGHT=p.dtype != torch.float32,
                BLOCK=BLOCK,
                num_warps=WARPS,
            )
            start += programs

    def param_norm(self) -> torch.Tensor:
        """L2 norm (0-d fp32) of the fp32 weights the last step read, i.e. before its update."""
        return self._sumsq.sum().sqrt()

    def snapshot(self) -> list[torch.Tensor]:
        """Copies of the fp32 weights, for :meth:`restore`."""
        return [master.detach().clone() for master in self.masters]

    @torch.no_grad()
    def restore(self, weights: list[torch.Tensor]) -> None:
        """Back, in place, to the state after construction with ``weights`` (from :meth:`snapshot`):
        the masters and the model's copies of them, zero moments and step count (e.g. after a
        CUDA-graph capture's warm-up steps)."""
        torch._foreach_copy_(self.masters, weights)
        for p, master, is_low in zip(self.params, self.masters, self.low_precision):
            if is_low:
                p.copy_(master)
        for t in (*self.exp_avgs, *self.exp_avg_sqs, self.step_count):
            t.zero_()
