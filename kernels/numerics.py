"""The one error measure of optbench: relative error of a result against its reference."""

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
