"""Precision modes: TF32 on/off for fp32 matmuls and fp32 training, bf16 autocast vs fp16 +
GradScaler.

Matmul: device ms per 8192^3 product (TFLOP/s derived at report time). Step (100M, B=8, S=1024):
wall-clock ms per optimizer step and peak memory: what TF32 gains over fp32 and what bf16 gains over
fp16.
"""

from __future__ import annotations

from .common import Grid, StepGrid, grid, unit


class Matmul(Grid):
    params = grid(__module__, __qualname__)
    param_names = ["n", "mode"]
    version = 1

    @unit("ms")
    def track_mm_ms(self, records, n, mode):
        return self.metric_ms(records, (n, mode), "mm")


class Step100M(StepGrid):
    params = grid(__module__, __qualname__)
