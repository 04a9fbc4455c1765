"""The convergence check (``optbench run --suite convergence``): the 100M model trains 300 steps on
a synthetic language, eager from 8 seeds and each variant that changes the numerics on purpose (FP8,
8-bit and master AdamW) from one; a variant whose loss curve is more than 4 seed spreads (RMS) from
eager's is ``wrong``. The records hold every curve (``info``); the track methods give the final loss
and the deviation. How the tolerance is made, and the GPU time (~6-7 min on an H100):
``optbench.suite.convergence``.
"""

from __future__ import annotations

from .common import Grid, grid, unit


class ConvergenceGrid(Grid):
    """A convergence grid: its model size and variants come from its catalog entry."""

    param_names = ["variant"]
    version = 1

    def figure(self, records, params: tuple[str, ...], name: str) -> float:
        """One figure of the case's summary (``optbench.suite.convergence.summary``: final loss,
        deviations), kept by ``optbench.suite.grids``; NaN (asv: n/a) where it has none."""
        return (self.kept(records, params).get("summary") or {}).get(name, float("nan"))

    @unit("nats")
    def track_final_loss(self, records, *params):
        return self.figure(records, params, "final_loss")

    @unit("nats")
    def track_rms_deviation(self, records, *params):
        return self.figure(records, params, "rms_deviation")

    @unit("nats")
    def track_max_deviation(self, records, *params):
        return self.figure(records, params, "max_deviation")

    @unit("ratio")
    def track_deviation_over_tolerance(self, records, *params):
        return self.figure(records, params, "ratio")


class Convergence100M(ConvergenceGrid):
    params = grid(__module__, __qualname__)
