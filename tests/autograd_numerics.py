"""Forward + backward checks against float64 references, on top of kernel_numerics."""

from __future__ import annotations

import types
import zlib
from collections.abc import Callable, Sequence

import pytest
import torch
from kernel_numerics import assert_rel_close, poison_empty


def seed_and_poison(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, *modules: types.ModuleType
) -> None:
    """Seed torch from the test id and NaN-poison torch.empty/empty_like inside `modules`."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    poison_empty(monkeypatch, *modules)


def run_and_reference(
    fn: Callable,
    ref_fn: Callable,
    inputs: Sequence[torch.Tensor],
    grad_outputs: Sequence[torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Outputs, then gradients w.r.t. every input, of fn on `inputs` (strides kept) and of ref_fn on
    float64 copies. Output gradients are drawn with torch.randn unless given."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    outs = fn(*leaves)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    if grad_outputs is None:
        grad_outputs = [torch.randn(o.shape, device=o.device).to(o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, leaves, grad_outputs)
    ref_leaves = [t.detach().double().requires_grad_() for t in inputs]
    ref_outs = ref_fn(*ref_leaves)
    ref_outs = list(ref_outs) if isinstance(ref_outs, tuple) else [ref_outs]
    ref_grads = torch.autograd.grad(ref_outs, ref_leaves, [g.double() for g in grad_outputs])
    return [t.detach() for t in outs + list(grads)], ref_outs + list(ref_grads)


def assert_all_close(
    results: Sequence[torch.Tensor], refs: Sequence[torch.Tensor], names: Sequence[str], tol: float
) -> None:
    """Relative error of every result against its reference within tol (NaN never passes)."""
    for out, ref, name in zip(results, refs, names, strict=True):
        assert_rel_close(out, ref, tol, name)
