"""The convergence check (``optbench run --suite convergence``): the 100M model trains 300 steps on a synthetic
language, eager from 4 seeds and each variant that changes the numerics on purpose (FP8, 8-bit and master AdamW)
from one; a variant whose loss curve is more than 4 seed spreads (RMS) from eager's is ``wrong``. The records
hold every curve (``info``); the track methods give the final loss and the deviation. How the tolerance is
made, and the GPU time (~4-5 min on an H100): ``optbench.suite.convergence``.
"""

from __future__ import annotations

from .common import Grid, device, grid, unit


class ConvergenceGrid(Grid):
    """A convergence grid: its model size and variants come from its catalog entry."""

    param_names = ["variant"]
    version = 1

    def cases(self):
        from functools import partial

        from optbench.core.runner import Case
        from optbench.suite import catalog
        from optbench.suite.convergence import convergence_work

        dev, size = device(), catalog.benchmark(self.benchmark_name()).size
        return [Case({"variant": v}, partial(convergence_work, size, v, dev)) for v in self.params[0]]

    def measure_grid(self):
        """Grid.measure_grid's records, each with its case's figures where this process measured it
        (optbench.suite.convergence.summary: final loss, deviations)."""
        from optbench.core.store import record_key
        from optbench.suite import catalog
        from optbench.suite.convergence import summary

        records, size = super().measure_grid(), catalog.benchmark(self.benchmark_name()).size
        for variant in self.params[0]:
            key = record_key(self.benchmark_name(), {"variant": variant})
            records[key] = {**records[key], "summary": summary(size, variant) or {}}
        return records

    def figure(self, records, params: tuple[str, ...], name: str) -> float:
        """One figure of the case's summary; NaN (asv: n/a) where it has none."""
        from optbench.core.store import record_key

        key = record_key(self.benchmark_name(), dict(zip(self.param_names, params)))
        return (records[key].get("summary") or {}).get(name, float("nan"))

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

    def setup_cache(self):
        return self.measure_grid()
