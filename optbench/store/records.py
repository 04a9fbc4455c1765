"""The one typed reader of stored records: what :mod:`optbench.run.runner` writes, read back by
name.

A record is a JSON object (one line of a run's file, :mod:`optbench.store.store`); :meth:`Record.of`
views it without copying and tolerates records of any age: a missing field reads as empty, a clock
stored as null (no device on a CPU) or absent (``device_warm`` before cold-L2 timing) reads as no
timing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OK = "ok"
# The status of a case the machine or the plan does not run (its reason says why)
SKIPPED = "skipped"
# The status of a case that SIGINT or SIGTERM stopped (Ctrl-C, a runner's cancel): it says nothing
# about the case, and its run is partial (its ``__run__`` record, optbench.store.store).
INTERRUPTED = "interrupted"
# How the reason of a record whose case never ran starts (the run's time budget ended before or in
# it, or its grid lost the CUDA context in an earlier case): it says nothing about the case.
NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class TimingView:
    """One clock's timing of one metric (a ``Timing.to_dict()``), ms per call; the quartiles default
    to the median and the samples to none where a record lacks them."""

    median_ms: float
    q25_ms: float
    q75_ms: float
    samples_ms: tuple[float, ...] = ()
    method: str = ""

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> TimingView:
        median = data.get("median_ms", 0.0)
        return cls(
            median,
            data.get("q25_ms", median),
            data.get("q75_ms", median),
            tuple(data.get("samples_ms", ())),
            data.get("method", ""),
        )

    @property
    def iqr_ms(self) -> float:
        """Interquartile range of the samples, ms."""
        return self.q75_ms - self.q25_ms


@dataclass(frozen=True)
class CaseMemory:
    """A case's device memory as training needs it, bytes, above what its process held before the
    case (``held_before_bytes``: earlier cases' leftovers); each None where not measured (a CPU, a
    record from before 2026-11-28).

    ``peak_bytes``: the most allocated at any point while the case was built, warmed up, captured
    (CUDA graphs) and timed: weights, gradients, optimizer state, activations and graph pools
    together. The correctness check is not counted, nor the check's reference, whose bytes left
    on the device are ``reference_bytes``, apart. ``resident_bytes``: what stays after timing
    (weights, optimizer state, the CUDA graphs' private pools). ``reserved_peak_bytes``: the
    caching allocator's reserved peak over the same phases (what ``nvidia-smi`` sees grow).
    """

    peak_bytes: float | None = None
    resident_bytes: float | None = None
    reserved_peak_bytes: float | None = None
    held_before_bytes: float | None = None
    reference_bytes: float | None = None
    meter: int | None = None  # the case meter's version (CASE_METER); None before versions

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> CaseMemory:
        return cls(**{name: data.get(name) for name in cls.__dataclass_fields__})


# The names under which Record.peaks() gives a case's own memory beside its metrics' per-call peaks:
# the gate's memory class judges each.
CASE_PEAK, CASE_RESIDENT = "case peak", "case resident"
# The case meter's version (optbench.measure.memory.CaseMeter). Figures of the meters before it
# (no version) depended on the cases before them in their process: an earlier case's live CUDA graph
# pool shrank a peak (by 1,031 MiB for the 100M best-kernels step after 56 cases of a full suite),
# and the first case of a process counted cuBLAS's workspaces. Record.peaks() gives theirs under
# EARLIER_METER's names, which are reported, never judged.
CASE_METER = 2
EARLIER_METER = (f"{CASE_PEAK} (earlier meter)", f"{CASE_RESIDENT} (earlier meter)")


def metric_label(metric: str, quantity: str, clock: str = "") -> str:
    """How a judged metric reads in a table: a time as its metric and clock (``step device``), a
    case's own memory by its name (``case peak``, ``case resident``), a call's peak memory as
    ``<call> peak memory``, compile seconds as ``compile``, a change of status as ``status``."""
    if quantity == "peak memory":
        return metric if metric.startswith("case ") else f"{metric} peak memory"
    if quantity == "compile":
        return "compile"
    return f"{metric} {clock}".strip() or quantity  # a change of status has no metric


def ab_design(data: Mapping[str, Any]) -> bool:
    """Whether a stored record was measured in a design of ``optbench ab``'s own, whose figures are
    not those of the ordinary runs history compares it with: timed in turns with another commit's
    process on one CPU (``lockstep``), or in a process that did not run its check, reusing an
    earlier run's (``checked_in``; such a process held 98-128 MiB less after timing). Every
    reader of history and the store's latest records leaves these out; ab judges them itself."""
    return "lockstep" in data or "checked_in" in data


@dataclass(frozen=True)
class Record:
    """One stored record. ``run`` is the run id ('' for records from before run ids), ``date`` the
    ISO 8601 time its run started; ``flops``/``bytes_moved`` map a metric to the work of one call
    (for the roofline); ``compile_seconds``: torch.compile's seconds in the case's build and check
    (None in records without it)."""

    key: str
    benchmark: str
    params: Mapping[str, str]
    status: str
    reason: str
    info: Mapping[str, Any]
    run: str
    date: str
    flops: Mapping[str, float]
    bytes_moved: Mapping[str, float]
    compile_seconds: float | None
    # measured in a design of optbench ab's own, not comparable with ordinary runs (ab_design)
    ab_design: bool
    _timings: Mapping[str, Mapping[str, Mapping[str, Any] | None] | None] = field(repr=False)
    _peaks: Mapping[str, float | None] = field(repr=False)
    memory: CaseMemory = CaseMemory()

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Record:
        """The view of one stored record (a dict as read from the store)."""
        return cls(
            key=data.get("key", ""),
            benchmark=data.get("benchmark", ""),
            params=data.get("params") or {},
            status=data.get("status", ""),
            reason=data.get("reason", ""),
            info=data.get("info") or {},
            run=data.get("run") or "",
            date=data.get("date") or "",
            flops=data.get("flops") or {},
            bytes_moved=data.get("bytes") or {},
            compile_seconds=data.get("compile_seconds"),
            ab_design=ab_design(data),
            _timings=data.get("metrics") or {},
            _peaks=data.get("peak_mem_bytes") or {},
            memory=CaseMemory.of(data.get("memory") or {}),
        )

    @property
    def ok(self) -> bool:
        """Whether the case was checked and measured."""
        return self.status == OK

    @property
    def interrupted(self) -> bool:
        """Whether the case was stopped by an interrupt of its run: no verdict on the case."""
        return self.status == INTERRUPTED

    @property
    def skipped(self) -> bool:
        """Whether the machine or the plan does not run the case (not one that never ran: its reason
        starts with NOT_MEASURED)."""
        return self.status == SKIPPED and not self.reason.startswith(NOT_MEASURED)

    @property
    def failed(self) -> bool:
        """Whether the case ran and did not end ok (wrong, oom, timeout, error, crashed): not a
        skip, an interrupt, or a case that never ran (its reason starts with NOT_MEASURED)."""
        return self.status not in (OK, SKIPPED, INTERRUPTED) and not self.reason.startswith(
            NOT_MEASURED
        )

    @property
    def primary_clock(self) -> str:
        """The clock the record's figure is read by: ``info.primary_clock``, device time where
        unset."""
        return self.info.get("primary_clock", "device")

    @property
    def metrics(self) -> tuple[str, ...]:
        """Names of the timed metrics, in stored order (one may have no timing by any clock)."""
        return tuple(self._timings)

    def clocks(self, metric: str) -> tuple[str, ...]:
        """The clocks with a timing of ``metric`` ('device', 'device_warm', 'wall'), in stored
        order."""
        return tuple(clock for clock, t in (self._timings.get(metric) or {}).items() if t)

    def timing(self, metric: str, clock: str) -> TimingView | None:
        """``metric`` timed by ``clock``; None where it was not (a null or missing clock, a missing
        metric)."""
        t = (self._timings.get(metric) or {}).get(clock)
        return TimingView.of(t) if t else None

    def peaks(self) -> dict[str, float]:
        """Peak extra device memory of each metric that has one (one call's, above what was
        allocated before it), and the case's own peak and resident bytes (:class:`CaseMemory`)
        under CASE_PEAK and CASE_RESIDENT where measured (under EARLIER_METER's names where an
        earlier meter measured them); bytes."""
        names = (CASE_PEAK, CASE_RESIDENT) if self.memory.meter == CASE_METER else EARLIER_METER
        case = dict(zip(names, (self.memory.peak_bytes, self.memory.resident_bytes)))
        both = {**self._peaks, **case}
        return {metric: value for metric, value in both.items() if value is not None}

    def peak_bytes(self, metric: str) -> float | None:
        """Peak extra device memory during ``metric``, bytes; None where not measured."""
        return self._peaks.get(metric)
