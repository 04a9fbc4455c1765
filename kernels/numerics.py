"""The error measures of optbench: relative error of a result against its reference, and bit
mismatches where a result must equal its reference exactly (an FP8 cast)."""

from __future__ import annotations

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 on ``out``'s device (a zero ``ref`` counts as 1e-30); inf
    when ``out`` holds a NaN or an infinity, so that a non-finite result never passes a
    tolerance."""
    # ref crosses to out's device in its own dtype and widens there: widened first, a host
    # reference moves twice the bytes and converts on one CPU thread
    # (scripts/probes/reference_transfer.py times both)
    out, ref = out.detach().double(), ref.detach().to(out.device).double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def bit_mismatches(got: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> int:
    """Elements whose bits differ between each tensor of ``got`` and its namesake in ``ref``
    (same shapes and dtypes), summed: 0 where every result is exactly its reference."""
    if len(got) != len(ref):
        raise ValueError(f"{len(got)} results against {len(ref)} references")
    wrong = 0
    for g, r in zip(got, ref):
        if g.shape != r.shape or g.dtype != r.dtype:
            raise ValueError(f"{tuple(g.shape)} {g.dtype} against {tuple(r.shape)} {r.dtype}")
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[g.element_size()]
        wrong += int((g.reshape(-1).view(bits) != r.reshape(-1).to(g.device).view(bits)).sum())
    return wrong
