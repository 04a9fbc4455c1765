"""What optbench's asv suites share.

GPU suites measure their whole parameter grid once per run, in ``setup_cache`` (one process: models
and compiled functions built once, a warm GPU, device time by CUDA-graph replay), through
:func:`optbench.runner.run_grid`, which checks each case against its baseline before timing it and
stores every sample. Each ``track_*`` method then reports one metric of one combination, so asv keeps
history and HTML per metric. asv keys ``setup_cache`` by its source line, so every concrete class
defines its own one-line ``setup_cache``. Nothing here imports torch: the many small asv processes
that only read a metric stay cheap.
"""

from __future__ import annotations

import os
from typing import Any

# Per-case time budget in seconds (a case over it is recorded as a timeout and the grid goes on).
CASE_BUDGET_S = float(os.environ.get("OPTBENCH_CASE_BUDGET_S", "180"))


def device() -> str:
    """'cuda' when a GPU is visible, else 'cpu' (imports torch, so only call it inside setup_cache)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Grid:
    """Base of a grid suite: subclasses set ``params``/``param_names`` and implement ``cases()``."""

    params: list[list[str]] = []
    param_names: list[str] = []
    rounds = 1
    repeat = 1
    number = 1
    timeout = 3600

    @classmethod
    def benchmark_name(cls) -> str:
        return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"

    def cases(self) -> list[Any]:
        raise NotImplementedError

    def measure_grid(self) -> dict[str, dict[str, Any]]:
        """Run every case selected by ``$OPTBENCH_SELECT`` (a regex on record keys; all when unset; see
        optbench.runner) and keep what the track methods read; unselected cases are skipped, not stored."""
        import itertools
        import re

        from optbench.store import record_key

        name, select = self.benchmark_name(), os.environ.get("OPTBENCH_SELECT")
        keys = [record_key(name, dict(zip(self.param_names, combo))) for combo in itertools.product(*self.params)]
        unselected = {"status": "skipped", "reason": f"not selected in this run (OPTBENCH_SELECT={select})"}
        if select and not any(re.search(select, key) for key in keys):
            return dict.fromkeys(keys, unselected)  # without building cases: no torch, no CUDA context
        from optbench.runner import NOT_STARTED, out_of_run_time, run_grid

        if out_of_run_time():
            return dict.fromkeys(keys, {"status": "skipped", "reason": NOT_STARTED})

        chosen = [c for c in self.cases() if not select or re.search(select, record_key(name, c.params))]
        records = run_grid(name, chosen, budget_s=CASE_BUDGET_S)
        kept = {k: {f: r.get(f) for f in ("status", "reason", "metrics", "peak_mem_bytes")}
                for k, r in records.items()}
        return {key: kept.get(key, unselected) for key in keys}

    def record(self, records: dict[str, dict[str, Any]], params: tuple[str, ...]) -> dict[str, Any]:
        from optbench.store import record_key

        return records[record_key(self.benchmark_name(), dict(zip(self.param_names, params)))]

    def setup(self, records: dict[str, dict[str, Any]], *params: str) -> None:
        """Skip what the machine cannot run; fail (asv records null) what broke, with its reason."""
        rec = self.record(records, params)
        if rec["status"] == "skipped":
            raise NotImplementedError(rec["reason"])
        if rec["status"] != "ok":
            raise RuntimeError(f"{rec['status']}: {rec['reason']}")

    def metric_ms(self, records: dict, params: tuple[str, ...], metric: str, clock: str = "device") -> float:
        """Median milliseconds per call of ``metric`` by ``clock`` ('device' or 'wall'); NaN (asv: n/a)
        for device time on a machine without a GPU."""
        timing = self.record(records, params)["metrics"][metric][clock]
        return float("nan") if timing is None else timing["median_ms"]

    def peak_mb(self, records: dict, params: tuple[str, ...], metric: str) -> float:
        """Peak device memory above the starting point during ``metric``, in MiB."""
        return self.record(records, params)["peak_mem_bytes"][metric] / 2**20


def unit(name: str):
    """Decorator setting asv's unit of a track method."""
    def mark(fn):
        fn.unit = name
        return fn
    return mark


class _StepMetrics:
    """The track methods of a training-step grid (ours or an anchor's): wall and device ms per optimizer step,
    wall ms per forward+loss, peak MiB per step."""

    @unit("ms")
    def track_step_ms(self, records, *params):
        return self.metric_ms(records, params, "step", "wall")

    @unit("ms")
    def track_step_device_ms(self, records, *params):
        return self.metric_ms(records, params, "step", "device")

    @unit("ms")
    def track_forward_ms(self, records, *params):
        return self.metric_ms(records, params, "forward", "wall")

    @unit("MB")
    def track_step_peak_mb(self, records, *params):
        return self.peak_mb(records, params, "step")
