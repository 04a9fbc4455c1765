"""Gradient / parameter L2 norms, update ratio and gradient-norm clipping over a list of parameters.

Every statistic is a 0-d tensor on the first tensor's device, accumulated and returned in fp32 for
fp32 and narrower parameters, in float64 where any is float64 (a float64 call is a float64
reference). The ``*_loop`` functions are the per-parameter slow path (a few launches per tensor);
the ``*_foreach`` ones use ``torch._foreach_norm`` / ``torch._foreach_mul_`` on (device, dtype)
groups: O(1) launches per group and no host sync. No Triton variant: ``_foreach_norm`` already
covers a whole group in one multi-tensor launch, and a Triton kernel over a pointer table would add
a host-built table per call without moving fewer bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_CLIP_EPS = 1e-6  # as in torch.nn.utils.clip_grad_norm_


def _grads(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [p.grad.detach() for p in params if p.grad is not None]


def _groups(
    tensors: list[torch.Tensor],
) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return groups


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype of a tensor: fp32, or its own dtype when wider (float64)."""
    return torch.promote_types(dtype, torch.float32)


def _norm_loop(tensors: list[torch.Tensor]) -> torch.Tensor:
    """sqrt(sum_i sum(t_i ** 2)) with one square-sum per tensor in its accumulation dtype."""
    if not tensors:
        return torch.zeros((), dtype=torch.float32)
    device = tensors[0].device
    return (
        torch.stack([t.to(_acc_dtype(t.dtype)).pow(2).sum().to(device) for t in tensors])
        .sum()
        .sqrt()
    )


def _norm_foreach(tensors: list[torch.Tensor]) -> torch.Tensor:
    """sqrt(sum_i ||t_i||^2) with one ``_foreach_norm`` per (device, dtype) group, in its
    accumulation dtype."""
    # ||(t_1, ..., t_n)|| = ||(||t_1||, ..., ||t_n||)||: each group's per-tensor norms come from
    # one multi-tensor launch, then two small norms of norms; reads every element once (P*s bytes)
    if not tensors:
        return torch.zeros((), dtype=torch.float32)
    device = tensors[0].device
    norms = [
        torch.linalg.vector_norm(
            torch.stack(torch._foreach_norm(group, 2, dtype=_acc_dtype(dtype)))
        ).to(device)
        for (_, dtype), group in _groups(tensors).items()
    ]
    return torch.linalg.vector_norm(torch.stack(norms))


def grad_stats_loop(
    params: Iterable[torch.Tensor], param_norm: bool = True
) -> dict[str, torch.Tensor]:
    """{'grad_norm', 'param_norm'}: global L2 norms (0-d), one reduction per parameter; without
    ``param_norm``, the gradient norm only (when the optimizer takes the other in its own pass)."""
    params = list(params)
    stats = {"grad_norm": _norm_loop(_grads(params))}
    if param_norm:
        stats["param_norm"] = _norm_loop([p.detach() for p in params])
    return stats


def grad_stats_foreach(
    params: Iterable[torch.Tensor], param_norm: bool = True
) -> dict[str, torch.Tensor]:
    """Same values as :func:`grad_stats_loop`, with foreach norms per (device, dtype) group, no host
    sync."""
    params = list(params)
    stats = {"grad_norm": _norm_foreach(_grads(params))}
    if param_norm:
        stats["param_norm"] = _norm_foreach([p.detach() for p in params])
    return stats


def update_ratio(before: list[torch.Tensor], after: list[torch.Tensor]) -> torch.Tensor:
    """||after - before|| / ||before|| over all tensors (0-d); pairs must match in shape, dtype,
    device.

    The difference is taken in the tensors' dtype (exact for small updates) into one temporary copy.
    """
    # after - before is exact in the tensors' dtype wherever after is within a factor 2 of
    # before (Sterbenz's lemma): for any update under half the weight it changes
    groups = _groups([t.detach() for t in before])
    after_groups = _groups([t.detach() for t in after])
    diffs = [
        d for key, group in groups.items() for d in torch._foreach_sub(after_groups[key], group)
    ]
    return _norm_foreach(diffs) / _norm_foreach([t for group in groups.values() for t in group])


def clip_coefficient(total: torch.Tensor, max_norm: float) -> torch.Tensor:
    """min(1, max_norm / (total + 1e-6)): what clipping multiplies every gradient by (0-d, total's
    dtype)."""
    # torch.nn.utils.clip_grad_norm_'s coefficient, kept on the device as a 0-d tensor (no
    # comparison on the host), so that clipping never waits for the norm to reach the CPU
    return (max_norm / (total + _CLIP_EPS)).clamp(max=1.0)


def clip_grad_norm_loop(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale gradients in place so their global L2 norm is at most ``max_norm``, one tensor at a
    time.

    Returns the norm before clipping (0-d), like ``torch.nn.utils.clip_grad_norm_``.
    """
    grads = _grads(params)
    total = _norm_loop(grads)
    coef = clip_coefficient(total, max_norm)
    for g in grads:
        g.mul_(coef.to(g.device))
    return total


def clip_grad_norm_foreach(
    params: Iterable[torch.Tensor], max_norm: float, total: torch.Tensor | None = None
) -> torch.Tensor:
    """Same as :func:`clip_grad_norm_loop` with foreach norms and ``_foreach_mul_``; the clip
    coefficient stays on the device (no host sync). ``total``: the gradients' global norm when
    already known (e.g. from
    :func:`grad_stats_foreach`), which saves one read of every gradient."""
    grads = _grads(params)
    total = _norm_foreach(grads) if total is None else total
    coef = clip_coefficient(total, max_norm)
    for (device, _), group in _groups(grads).items():
        torch._foreach_mul_(group, coef.to(device))
    return total
