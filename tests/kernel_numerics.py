"""Helpers for kernel tests: relative-error checks against float64 references and poisoned allocations."""

from __future__ import annotations

import types

import pytest
import torch

from kernels.numerics import rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def assert_rel_close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str) -> None:
    """Shape match and relative error within tol; NaN never passes."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    err = rel_err(out, ref)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"


def _poisoned(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(torch.iinfo(t.dtype).min)


class _PoisonedTorch(types.ModuleType):
    """``torch`` whose ``empty`` / ``empty_like`` return NaN-filled (float) or min-filled (int) tensors."""

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
    """Make ``torch.empty``/``torch.empty_like`` as called inside ``modules`` return poisoned tensors."""
    for module in modules:
        monkeypatch.setattr(module, "torch", _PoisonedTorch())
