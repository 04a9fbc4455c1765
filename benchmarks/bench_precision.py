"""Precision modes: TF32 on/off for fp32 matmuls and fp32 training, bf16 autocast vs fp16 + GradScaler.

Matmul: device ms per 8192^3 product (TFLOP/s derived at report time). Step (100M, B=8, S=1024):
wall-clock ms per optimizer step and peak memory. The seeds claim TF32 gives 10-30%; these measure it.
"""

from __future__ import annotations

from models.variants import STEP_VARIANTS

from .bench_step import _Step
from .common import Grid, unit


class Matmul(Grid):
    params = [["8192"], ["fp32", "tf32", "bf16", "fp16"]]
    param_names = ["n", "mode"]
    version = 1

    def cases(self):
        from functools import partial

        from optbench.runner import Case
        from optbench.workloads import matmul_work

        from .common import device

        dev = device()
        return [Case({"n": n, "mode": m}, partial(matmul_work, int(n), m, dev))
                for n in self.params[0] for m in self.params[1]]

    def setup_cache(self):
        return self.measure_grid()

    @unit("ms")
    def track_mm_ms(self, records, n, mode):
        return self.metric_ms(records, (n, mode), "mm")


class Step100M(_Step):
    size = "100M"
    params = [STEP_VARIANTS["precision"]]

    def setup_cache(self):
        return self.measure_grid()
