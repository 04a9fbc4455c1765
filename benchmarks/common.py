"""What optbench's asv suites share.

GPU suites measure their whole parameter grid once per run, in ``setup_cache`` (one process: models
and compiled functions built once, a warm GPU, device time by CUDA-graph replay), through
:func:`optbench.core.runner.run_grid`, which checks each case against its baseline before timing it and
stores every sample. Each ``track_*`` method then reports one metric of one combination, so asv keeps
history and HTML per metric. asv keys ``setup_cache`` by its source line, so every concrete class
defines its own one-line ``setup_cache``. Nothing here imports torch: the many small asv processes
that only read a metric stay cheap.
"""

from __future__ import annotations

import abc
from typing import Any

from optbench.core.records import Record
from optbench.core.settings import current
from optbench.suite import catalog


def grid(module: str, qualname: str) -> list[list[str]]:
    """asv's ``params`` of the class ``qualname`` in ``module``: its catalog entry's grid in this run's suite
    (``optbench.core.settings``)."""
    return catalog.benchmark(f"{module.rsplit('.', 1)[-1]}.{qualname}").grid(current().suite)


def device() -> str:
    """'cuda' when a GPU is visible, else 'cpu' (imports torch, so only call it inside setup_cache)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Grid(abc.ABC):
    """Base of a grid suite: subclasses set ``params``/``param_names``, implement ``cases()`` and define a
    one-line ``setup_cache`` (abstract here, so asv lists only the concrete classes)."""

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

    @abc.abstractmethod
    def setup_cache(self) -> dict[str, dict[str, Any]]:
        """``return self.measure_grid()``, in each concrete class (asv keys its cache by this line)."""

    def measure_grid(self, distributed: bool = False) -> dict[str, dict[str, Any]]:
        """Run every case selected by ``$OPTBENCH_SELECT`` (a regex on record keys; all when unset; see
        optbench.core.runner) and keep what the track methods read; unselected cases are skipped, not stored.
        ``distributed``: cases that launch torchrun, each with at least ``optbench.suite.distributed``'s budget."""
        import itertools
        import re

        from optbench.core.store import record_key

        name, settings = self.benchmark_name(), current()
        select = settings.select
        keys = [record_key(name, dict(zip(self.param_names, combo))) for combo in itertools.product(*self.params)]
        unselected = {"status": "skipped", "reason": f"not selected in this run (OPTBENCH_SELECT={select})"}
        if select and not any(re.search(select, key) for key in keys):
            return dict.fromkeys(keys, unselected)  # without building cases: no torch, no CUDA context
        if name not in catalog.SUITES[settings.suite]:  # a plain `asv run` lists every class: skip the others
            return dict.fromkeys(keys, {"status": "skipped", "reason": f"not in the {settings.suite!r} suite "
                                        "(optbench run --suite, or OPTBENCH_SUITE)"})
        from optbench.core import progress
        from optbench.core.runner import NOT_STARTED, out_of_run_time, run_grid

        if out_of_run_time():
            not_started = {"status": "skipped", "reason": NOT_STARTED}
            for key in keys:  # the run's progress counts them as done
                if not select or re.search(select, key):
                    progress.case_ended(key, name, not_started)
            return dict.fromkeys(keys, not_started)

        chosen = [c for c in self.cases() if not select or re.search(select, record_key(name, c.params))]
        budget_s = settings.case_budget_s
        if distributed:
            from optbench.suite.distributed import CASE_BUDGET_S

            budget_s = max(budget_s, CASE_BUDGET_S)
        records = run_grid(name, chosen, budget_s=budget_s)
        kept = {k: {f: r.get(f) for f in ("status", "reason", "metrics", "peak_mem_bytes")}
                for k, r in records.items()}
        return {key: kept.get(key, unselected) for key in keys}

    def record(self, records: dict[str, dict[str, Any]], params: tuple[str, ...]) -> Record:
        """The record of one parameter combination among what ``setup_cache`` kept."""
        from optbench.core.store import record_key

        return Record.of(records[record_key(self.benchmark_name(), dict(zip(self.param_names, params)))])

    def setup(self, records: dict[str, dict[str, Any]], *params: str) -> None:
        """Skip what the machine cannot run; fail (asv records null) what broke, with its reason."""
        rec = self.record(records, params)
        if rec.status == "skipped":
            raise NotImplementedError(rec.reason)
        if not rec.ok:
            raise RuntimeError(f"{rec.status}: {rec.reason}")

    def metric_ms(self, records: dict, params: tuple[str, ...], metric: str, clock: str = "device") -> float:
        """Median milliseconds per call of ``metric`` by ``clock`` ('device', 'device_warm' or 'wall'); NaN
        (asv: n/a) where the record has no such timing (device time on a machine without a GPU)."""
        timing = self.record(records, params).timing(metric, clock)
        return float("nan") if timing is None else timing.median_ms

    def peak_mb(self, records: dict, params: tuple[str, ...], metric: str) -> float:
        """Peak device memory above the starting point during ``metric``, in MiB; NaN where not measured."""
        peak = self.record(records, params).peak_bytes(metric)
        return float("nan") if peak is None else peak / 2**20


def unit(name: str):
    """Decorator setting asv's unit of a track method."""
    def mark(fn):
        fn.unit = name
        return fn
    return mark


class _StepWall:
    """The track methods of any training step: wall and device ms per optimizer step."""

    @unit("ms")
    def track_step_ms(self, records, *params):
        return self.metric_ms(records, params, "step", "wall")

    @unit("ms")
    def track_step_device_ms(self, records, *params):
        return self.metric_ms(records, params, "step", "device")


class _StepMetrics(_StepWall):
    """The track methods of a single-GPU training-step grid (ours or an anchor's): those of :class:`_StepWall`,
    wall ms per forward+loss, peak MiB per step."""

    @unit("ms")
    def track_forward_ms(self, records, *params):
        return self.metric_ms(records, params, "forward", "wall")

    @unit("MB")
    def track_step_peak_mb(self, records, *params):
        return self.peak_mb(records, params, "step")


class StepGrid(_StepMetrics, Grid):
    """A training-step grid: its model size and variants come from its catalog entry."""

    param_names = ["variant"]
    version = 2  # 2: steps timed after 2 s of steps, at the GPU's power-steady clock (optbench.suite.workloads)

    def cases(self):
        from functools import partial

        from optbench.core.runner import Case
        from optbench.suite.workloads import step_work

        dev, size = device(), catalog.benchmark(self.benchmark_name()).size
        return [Case({"variant": v}, partial(step_work, size, v, dev)) for v in self.params[0]]
