"""What optbench's asv suites share.

GPU suites are measured once per run, in the ``setup_cache`` every grid class inherits (two
processes per run: the training steps, and the rest; models, references and compiled functions built
once, a warm GPU, device time by CUDA-graph replay), through
:func:`optbench.suite.grids.measure_suite`, which checks each case against its baseline before
timing it and stores every sample. Each ``track_*`` method then reports one metric of one
combination, so asv keeps history and HTML per metric. Nothing here imports torch: the many small
asv processes that only read a metric stay cheap.
"""

from __future__ import annotations

import abc
from typing import Any

from optbench.store.records import Record
from optbench.suite import catalog


def grid(module: str, qualname: str) -> list[list[str]]:
    """asv's ``params`` of the class ``qualname`` in ``module``: its catalog entry's grid over
    every suite (``optbench.suite.catalog.Benchmark.asv_params``)."""
    return catalog.benchmark(f"{module.rsplit('.', 1)[-1]}.{qualname}").asv_params()


class Selected:
    """A benchmark class of the catalog: asv runs only the combinations this run measures."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A concrete class of the catalog (one that sets ``params``) gets asv's ``skip_params``:
        the combinations this run leaves out (``optbench.suite.grids.unmeasured``), which asv skips
        before ``setup`` and without a line of output. asv lists no ``skip_params`` (its name is
        private to asv), so its list of benchmarks is the same under any settings."""
        super().__init_subclass__(**kwargs)
        if (
            isinstance(cls.__dict__.get("params"), list)
            and cls.benchmark_name() in catalog.BENCHMARKS
        ):
            from optbench.suite.grids import unmeasured

            cls.skip_params = unmeasured(cls.benchmark_name())

    @classmethod
    def benchmark_name(cls) -> str:
        return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"


class Grid(Selected, abc.ABC):
    """Base of a grid suite: a concrete class sets ``params = grid(__module__, __qualname__)``
    (abstract until then, so that asv lists only the concrete classes); its cases come from its
    catalog entry (``optbench.suite.grids``)."""

    param_names: list[str] = []
    rounds = 1
    repeat = 1
    number = 1
    timeout = 3600  # also setup_cache's: the whole suite is measured in it

    @property
    @abc.abstractmethod
    def params(self) -> list[list[str]]:
        """asv's parameter grid."""

    def setup_cache(self) -> dict[str, dict[str, Any]]:
        """Every grid case of this run's suite but the training steps, measured in this one process
        (``optbench.suite.grids``): asv keys a cache by the line defining ``setup_cache``, and every
        grid class but :class:`StepGrid` inherits this one, so asv runs it once per run and hands
        its records to every such class's track methods."""
        from optbench.suite.grids import PROCESSES, measure_suite

        return measure_suite(kinds=PROCESSES["other"])

    def kept(self, records: dict[str, dict[str, Any]], params: tuple[str, ...]) -> dict[str, Any]:
        """What ``setup_cache`` kept of one parameter combination
        (``optbench.suite.grids.KEPT_FIELDS``)."""
        from optbench.store.store import record_key

        return records[record_key(self.benchmark_name(), dict(zip(self.param_names, params)))]

    def record(self, records: dict[str, dict[str, Any]], params: tuple[str, ...]) -> Record:
        """The record of one parameter combination among what ``setup_cache`` kept."""
        return Record.of(self.kept(records, params))

    def setup(self, records: dict[str, dict[str, Any]], *params: str) -> None:
        """Skip what the machine cannot run; fail (asv records null) what broke, with its reason."""
        rec = self.record(records, params)
        if rec.status == "skipped":
            raise NotImplementedError(rec.reason)
        if not rec.ok:
            raise RuntimeError(f"{rec.status}: {rec.reason}")

    def metric_ms(
        self, records: dict, params: tuple[str, ...], metric: str, clock: str = "device"
    ) -> float:
        """Median milliseconds per call of ``metric`` by ``clock`` ('device', 'device_warm' or
        'wall'); NaN (asv: n/a) where the record has no such timing (device time on a machine
        without a GPU)."""
        timing = self.record(records, params).timing(metric, clock)
        return float("nan") if timing is None else timing.median_ms

    def peak_mb(self, records: dict, params: tuple[str, ...], metric: str) -> float:
        """Peak device memory above the starting point during ``metric``, in MiB; NaN where not
        measured."""
        peak = self.record(records, params).peak_bytes(metric)
        return float("nan") if peak is None else peak / 2**20

    def compile_s(self, records: dict, params: tuple[str, ...]) -> float:
        """Seconds torch.compile spent in the case's build and check, with the compile caches its
        run started from (the machine record's ``info.compile_cache``); NaN where the record has no
        such count."""
        seconds = self.record(records, params).compile_seconds
        return float("nan") if seconds is None else seconds


def sync_clock() -> float:
    """``optbench.measure.timing.sync_clock`` (perf_counter seconds after a CUDA synchronize),
    imported at its first call: asv imports every module of this package twice per run (discovery,
    forkserver) and pytest collects the twin's, and none of them should pay for torch before a
    benchmark needs it."""
    from optbench.measure.timing import sync_clock as clock

    return clock()


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
    """The track methods of a single-GPU training-step grid (ours or an anchor's): those of
    :class:`_StepWall`, wall ms per forward+loss, peak MiB per step, and what the step cost to
    compile (s; 0 for an eager step): a user choosing a compile mode weighs it against the ms it
    saves per step."""

    @unit("ms")
    def track_forward_ms(self, records, *params):
        return self.metric_ms(records, params, "forward", "wall")

    @unit("MB")
    def track_step_peak_mb(self, records, *params):
        return self.peak_mb(records, params, "step")

    @unit("s")
    def track_compile_s(self, records, *params):
        return self.compile_s(records, params)


class StepGrid(_StepMetrics, Grid):
    """A training-step grid: its model size and variants come from its catalog entry."""

    param_names = ["variant"]
    # 2: steps timed after 2 s of steps, at the GPU's power-steady clock (optbench.suite.workloads)
    version = 2

    def setup_cache(self) -> dict[str, dict[str, Any]]:
        """Every training step of this run's suite, in a process of their own
        (``optbench.suite.grids``)."""
        from optbench.suite.grids import PROCESSES, measure_suite

        return measure_suite(kinds=PROCESSES["steps"])
