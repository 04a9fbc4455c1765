"""Helpers for kernel tests: relative-error checks against float64 references and poisoned
allocations."""

from __future__ import annotations

import types

import pytest
import torch

from kernels.numerics import rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# Row scales at which RMSNorm's eps = 1e-6 matters: a mean square of about 1 (eps negligible),
# 1e-6 (eps doubles it), 1e-8 (eps dominates) and 0 (eps alone keeps rsqrt finite). N(0, 1) rows
# never show eps.
EPS_ROW_SCALES = (1.0, 1e-3, 1e-4, 0.0)


def randn_rows_at_eps_scales(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """N(0, 1) of ``shape`` in ``dtype`` whose rows (over the last dim) take EPS_ROW_SCALES in
    turn."""
    rows = torch.randn(shape, device=DEVICE).reshape(-1, shape[-1])
    turns = torch.arange(len(rows), device=DEVICE) % len(EPS_ROW_SCALES)
    scales = torch.tensor(EPS_ROW_SCALES, device=DEVICE)[turns]
    return (rows * scales[:, None]).reshape(shape).to(dtype)


def assert_rel_close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str) -> None:
    """Shape match and relative error within tol; NaN never passes."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    err = rel_err(out, ref)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"


def _poisoned(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(torch.iinfo(t.dtype).min)


class _PoisonedTorch(types.ModuleType):
    """``torch`` whose ``empty`` / ``empty_like`` return NaN-filled (float) or min-filled (int)
    tensors."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs) -> torch.Tensor:
        return _poisoned(torch.empty(*args, **kwargs))

    @staticmethod
    def empty_like(*args, **kwargs) -> torch.Tensor:
        return _poisoned(torch.empty_like(*args, **kwargs))


def poison_empty(monkeypatch: pytest.MonkeyPatch, *modules: types.ModuleType) -> None:
    """Make ``torch.empty``/``torch.empty_like`` as called inside ``modules`` return poisoned
    tensors."""
    for module in modules:
        monkeypatch.setattr(module, "torch", _PoisonedTorch())
