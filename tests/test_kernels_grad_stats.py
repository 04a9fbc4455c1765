"""Gradient statistics and clipping: loop vs foreach vs torch.nn.utils.clip_grad_norm_ on float64 copies."""

from __future__ import annotations

import pytest
import torch
from kernel_numerics import DEVICE, assert_rel_close, requires_cuda

from kernels import grad_stats as gs

# Relative-error tolerance: fp32 for the norms (fp32 accumulation of any dtype); clipped gradients are
# rounded to their own dtype.
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
SHAPES = [(3,), (7, 5), (1,), (13, 17, 3), (129,), (31, 33), (2, 3, 5, 7), (1000,), (11, 1), (257, 3)] * 2


def make_params(device: str = DEVICE) -> list[torch.Tensor]:
    """20 tensors of odd shapes, every third bf16, with random gradients (one parameter without)."""
    params = []
    for i, shape in enumerate(SHAPES):
        dtype = torch.bfloat16 if i % 3 == 0 else torch.float32
        p = torch.randn(shape, device=device).to(dtype).requires_grad_()
        p.grad = (torch.rand(()) * torch.randn(shape, device=device)).to(dtype)
        params.append(p)
    params[4].grad = None
    return params


def float64_copies(params: list[torch.Tensor]) -> list[torch.Tensor]:
    copies = []
    for p in params:
        c = p.detach().double().requires_grad_()
        c.grad = None if p.grad is None else p.grad.double()
        copies.append(c)
    return copies


def test_grad_stats():
    params = make_params()
    ref = float64_copies(params)
    ref_grad_norm = torch.nn.utils.clip_grad_norm_(ref, float("inf"))
    ref_param_norm = torch.linalg.vector_norm(torch.cat([p.detach().flatten() for p in ref]))
    for fn in (gs.grad_stats_loop, gs.grad_stats_foreach):
        stats = fn(params)
        assert stats["grad_norm"].dtype == stats["param_norm"].dtype == torch.float32
        assert_rel_close(stats["grad_norm"], ref_grad_norm, TOL[torch.float32], f"{fn.__name__} grad_norm")
        assert_rel_close(stats["param_norm"], ref_param_norm, TOL[torch.float32], f"{fn.__name__} param_norm")


@pytest.mark.parametrize("clip_fn", [gs.clip_grad_norm_loop, gs.clip_grad_norm_foreach])
@pytest.mark.parametrize("max_norm_factor", [0.3, 3.0])
def test_clip_grad_norm(clip_fn, max_norm_factor):
    """max_norm below the norm (clipping) and above it (gradients unchanged)."""
    params = make_params()
    ref = float64_copies(params)
    max_norm = max_norm_factor * gs.grad_stats_loop(params)["grad_norm"].item()
    ref_total = torch.nn.utils.clip_grad_norm_(ref, max_norm)
    total = clip_fn(params, max_norm)
    assert total.dtype == torch.float32
    assert_rel_close(total, ref_total, TOL[torch.float32], f"{clip_fn.__name__} total norm")
    for i, (p, r) in enumerate(zip(params, ref, strict=True)):
        if p.grad is None:
            assert r.grad is None
            continue
        assert p.grad.dtype == p.dtype
        assert_rel_close(p.grad, r.grad, TOL[p.dtype], f"{clip_fn.__name__} grad {i} {p.dtype}")


def test_update_ratio():
    before = [p.detach() for p in make_params()]
    after = [b + 1e-2 * torch.randn_like(b) for b in before]
    diff = torch.cat([(a.double() - b.double()).flatten() for a, b in zip(after, before, strict=True)])
    ref = diff.norm() / torch.cat([b.double().flatten() for b in before]).norm()
    ratio = gs.update_ratio(before, after)
    assert ratio.dtype == torch.float32
    assert_rel_close(ratio, ref, TOL[torch.float32], "update_ratio")


def test_wrong_statistic_is_caught(monkeypatch):
    """Dropping one group (here bf16) from the foreach norm must fail the comparison."""
    real_groups = gs._groups
    without_bf16 = lambda ts: {k: v for k, v in real_groups(ts).items() if k[1] != torch.bfloat16}
    monkeypatch.setattr(gs, "_groups", without_bf16)
    with pytest.raises(AssertionError, match="relative error"):
        test_grad_stats()


@pytest.mark.gpu
@requires_cuda
def test_grad_stats_gpu():
    """A ~100M-parameter list (GPT-like, 12 layers, H=768, vocab 32000), fp32 weights and bf16 norms."""
    layer = [(768, 768)] * 4 + [(2048, 768), (768, 2048), (2048, 768)] + [(768,)] * 2
    shapes = [(32000, 768)] + layer * 12 + [(768,)]
    params = []
    for i, shape in enumerate(shapes):
        dtype = torch.bfloat16 if len(shape) == 1 else torch.float32
        p = torch.randn(shape, device="cuda").to(dtype).requires_grad_()
        p.grad = (1e-3 * (i + 1) * torch.randn(shape, device="cuda")).to(dtype)
        params.append(p)
    ref = float64_copies(params)
    ref_param_norm = torch.linalg.vector_norm(torch.cat([p.detach().flatten() for p in ref]))
    ref_total = torch.nn.utils.clip_grad_norm_(ref, 1.0)
    stats = gs.grad_stats_foreach(params)
    assert_rel_close(stats["param_norm"], ref_param_norm, TOL[torch.float32], "cuda param_norm")
    assert_rel_close(gs.clip_grad_norm_foreach(params, 1.0), ref_total, TOL[torch.float32], "cuda total norm")
    for i, (p, r) in enumerate(zip(params, ref, strict=True)):
        assert_rel_close(p.grad, r.grad, TOL[p.dtype], f"cuda clipped grad {i}")
