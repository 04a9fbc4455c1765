"""Compares two commits' stored runs, machine by machine and GPU by GPU: what got slower,
hungrier or slower to compile, by how much, and is it real.

The CI gate is ``optbench ab`` (both commits measured interleaved on one GPU in one job). This
comparison reads stored history: it answers trends, and it must never raise a false alarm.

Refs: BASE and HEAD are commit-ish. Each resolves to the commit whose code it measures
(:func:`optbench.run.runner.measured_commit`: a commit that changes only docs or results measures
its parent's code), under which its runs are stored; else to its own hash; else it is taken as a
stored hash prefix. Two refs of one measured commit are the same code: nothing to gate (exit 0),
unless ``--base-run``/``--head-run`` pick two sets of its runs (an A/A comparison).

GPUs: lent machines of one kind differ by more than a change worth catching, so runs are judged
only against runs of the same GPU (the UUID in each run's machine record, :func:`gpu_of`; a run
that shared its host with others, a shard of ``run --gpus``, is another GPU's). For each
record, the base and head runs on each GPU that ran it at both commits are compared; a record that
no GPU ran at both commits is compared across GPUs, labelled CROSS-GPU, and never gated. A CPU
machine is one as a GPU is: its host id and CPU model, which its machine name holds, in each run's
machine record; runs of one such host are compared and gated as those of one GPU. A GPU run
without a UUID, or a CPU run without a host id (records from before them), shares its unit with
no run.

The rule, per record, metric and clock (``device``, ``device_warm``, ``wall``), on one GPU:

- Time: each run's median. The change is the difference of the mean log medians, head minus base.
  Its noise is the metric's run-to-run standard deviation sigma of a log median on that GPU
  (:class:`NoiseModel`), from A/A sets only: the runs of one commit on that GPU, pooled over the
  commits that GPU ran; never across GPUs, never from the spread of samples inside one run. A
  metric with fewer than :data:`MIN_DF` degrees of freedom on that GPU gets the verdict 'no noise
  estimate on this GPU': reported, not gated.
- The smallest detectable change of a comparison is ``exp(max(log(1 + threshold), q * sigma *
  sqrt(1/n_base + 1/n_head))) - 1``: threshold that of the metric's class
  (:func:`optbench.suite.catalog.gate_threshold`), q Student's t quantile at 1 - :data:`ALPHA` for
  sigma's degrees of freedom. A change beyond it is a regression (slower) or an improvement
  (faster). A metric the catalog does not gate (a kernel's wall time: host launch overhead) is
  reported, never gated; so is a host-bound time on a GPU machine (:data:`HOST_BOUND`), whose
  spread between fresh processes is heavy-tailed: a trend here, decided by ``optbench ab``'s
  lockstep rounds.
- Compile seconds (quantity 'compile': the record's ``compile_seconds``, one value per run, only
  of runs that started from a cold compile cache, ``info.compile_cache``, since a warm cache skips
  the compilation it would time) are judged as times are: against their own A/A noise on that GPU
  (a process's first compile and later ones in the same job differ several-fold), else reported.
- Peak memory (one deterministic value per run): a change of the median over runs beyond the class
  threshold.
- Status (of each side's latest run that gave the record a verdict): ``ok`` to anything else (oom,
  wrong, timeout, error, skipped, crashed) is a regression, anything to ``ok`` an improvement;
  records skipped on both sides stay silent. A record on one side only is reported with status
  ``missing`` and never fails the gate; nor does a record ``interrupted`` on a side (the case an
  interrupt stopped, in a partial run; its side's latest run that did not stop it is taken where
  there is one): reported with the verdict :data:`INTERRUPTED_RUN`, never gated, not compared.

Across GPUs a change beyond the class threshold is reported as slower or faster (CROSS-GPU), never
gated.

Exit codes of ``optbench compare``:
  0  no regression, or the same code on both sides;
  1  a regression on a GPU that ran both commits;
  2  nothing comparable: a ref with no stored runs on the machines compared, or different code
     whose runs share no GPU (a gate with nothing to compare must not pass). The message, on
     stderr, names the ref and the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from optbench.gate.changepoints import CPU_UNIT, cpu_unit, gpu_unit
from optbench.run.compile_cache import COLD
from optbench.run.runner import measured_commit
from optbench.store.records import INTERRUPTED, OK, Record, TimingView, ab_design, metric_label
from optbench.store.store import REPO_ROOT, ResultStore, StoredRun
from optbench.suite.catalog import GATE_THRESHOLDS, gate_threshold, metric_class

MISSING = "missing"
COLUMNS = (
    "benchmark",
    "params",
    "metric",
    "clock",
    "base",
    "head",
    "head/base",
    "runs",
    "detectable",
    "verdict",
)
ALPHA = 1e-3  # one-sided false-alarm rate of one metric's verdict
MIN_DF = 3  # degrees of freedom of A/A runs on one GPU a metric's noise estimate needs
COMPILE_SERIES = ("compile", "seconds")  # (metric, clock) of compile seconds among a run's series
CROSS_GPU = "CROSS-GPU"
NO_NOISE = "no noise estimate on this GPU"
NOT_GATED = "not gated"
# On a GPU machine a host-bound time's run-to-run spread in fresh processes is heavy-tailed (the 1B
# best-kernels forward: 33.6-39.5 ms in four processes of one commit on one H200, no change
# between), which a normal noise model fitted on a few A/A runs cannot bound at ALPHA: a trend here,
# decided by ab's lockstep rounds (a CPU machine's steps, timed by their thread's CPU time, gate)
HOST_BOUND = "host-bound: ab decides"
INTERRUPTED_RUN = "interrupted: not gated"

Series = tuple[str, str, str]  # (record key, metric, clock)


class Summary(NamedTuple):
    """Median and quartiles of one side: ms for a time, bytes for peak memory, seconds for compile
    (quartiles = median for the last two)."""

    median: float
    q25: float
    q75: float


@dataclass(frozen=True)
class Noise:
    """Run-to-run noise of one metric on one GPU: sigma of a run's log median and its degrees of
    freedom."""

    sigma: float
    df: int

    def quantile(self) -> float:
        """The one-sided 1 - ALPHA Student's t quantile that a change must pass, in sigmas of the
        compared means."""
        from scipy import stats

        return float(stats.t.ppf(1 - ALPHA, self.df))

    def detectable(self, n_base: int, n_head: int, threshold: float) -> float:
        """Smallest relative change a comparison of n_base and n_head runs flags (0.05 = 5%)."""
        bound = self.quantile() * self.sigma * math.sqrt(1 / n_base + 1 / n_head)
        return math.exp(max(math.log1p(threshold), bound)) - 1

    def aa_spread(self) -> float:
        """The A/A run-to-run spread: what two single runs of the same code may differ by without
        the gate calling it a change (the smallest change one run against one run detects, without
        a threshold)."""
        return math.exp(self.quantile() * self.sigma * math.sqrt(2)) - 1


@dataclass(frozen=True)
class Change:
    """One metric of one record from base to head on one machine (quantity 'time', 'peak memory',
    'compile' or 'status')."""

    machine: str
    base_commit: str
    head_commit: str
    key: str
    benchmark: str
    params: dict[str, Any]
    metric: str
    quantity: str
    clock: str | None  # 'device', 'wall', ... for a time
    base: Summary | None
    head: Summary | None
    ratio: float | None  # head / base: of the geometric means of the runs' medians for a time
    significant: bool
    regression: bool
    improvement: bool
    base_status: str = OK
    head_status: str = OK
    runs: tuple[int, int] = (1, 1)  # runs with this metric at base and at head
    noise: Noise | None = None  # a time's run-to-run noise on the GPU
    detectable: float | None = None  # the smallest relative change this comparison flags
    method_changed: bool = False  # the clock measures something else at head: not compared
    gated: bool = True  # whether the verdict decides the gate
    reason: str = ""  # why not gated: CROSS_GPU, NO_NOISE, NOT_GATED or HOST_BOUND ('' if gated)
    gpu: str | None = None  # the GPU whose runs were compared; None: runs of different GPUs
    base_machine: str | None = None  # where the base ran on another machine (:func:`cross_machine`)


def gpu_of(run: StoredRun) -> str | None:
    """The GPU a run measured on (``optbench.gate.changepoints.gpu_unit``: its UUID, and how many
    runs shared its host where more than one), or for a run without a GPU its CPU machine
    (``cpu_unit``: its host id and CPU model); None where unknown."""
    return gpu_unit(run.info) or cpu_unit(run.info)


def git_commit(ref: str) -> str | None:
    """Full hash of a commit-ish in the repository of this file, or None where git cannot resolve
    it."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_commit(ref: str) -> str | None:
    """The commit whose code ``ref`` measures (:func:`optbench.run.runner.measured_commit`), or
    None where git cannot resolve ``ref``."""
    if git_commit(ref) is None:
        return None
    try:
        return measured_commit(ref, cwd=REPO_ROOT) or None
    except (OSError, subprocess.CalledProcessError):
        return None


def resolve(store: ResultStore, machine: str, ref: str) -> str | None:
    """Stored commit of ``machine`` for a commit-ish (its measured code commit, else its own hash)
    or a stored hash prefix; None if none is stored."""
    for candidate in dict.fromkeys(filter(None, (code_commit(ref), git_commit(ref), ref))):
        try:
            return store.resolve(machine, candidate)
        except KeyError:
            continue
    return None


def series_clock(rec: Record, clock: str) -> str:
    """The clock a record's timing belongs to by method: a graph-replayed ``device`` time of a
    record that predates ``info.device_clock`` (a kernel's, back-to-back on one input set) is what
    newer records call ``device_warm``, so its history informs that clock's noise."""
    old_kernel = rec.benchmark.startswith("bench_kernels.") and "device_clock" not in rec.info
    return "device_warm" if clock == "device" and old_kernel else clock


def timing_of(rec: Record, metric: str, clock: str) -> TimingView | None:
    """The timing of ``metric`` that belongs to the series clock ``clock``
    (:func:`series_clock`), or None."""
    name = next((name for name in rec.clocks(metric) if series_clock(rec, name) == clock), None)
    return rec.timing(metric, name) if name else None


def run_medians(run: StoredRun) -> dict[Series, float]:
    """Median ms of every timed (metric, clock) of the run's ok records, by series (clocks by
    method: :func:`series_clock`), and the compile seconds of a run that started from a cold
    compile cache, as series ``(key, 'compile', 'seconds')``. Records of ``optbench ab``'s own
    designs (:func:`optbench.store.records.ab_design`: timed in lockstep, or without their check)
    are left out: their figures are not those of the runs they would be compared with."""
    found = {}
    cold = run.info.get("compile_cache") == COLD
    for key, data in run.results().items():
        rec = Record.of(data)
        if not rec.ok or rec.ab_design:
            continue
        for metric in rec.metrics:
            for clock in rec.clocks(metric):
                t = rec.timing(metric, clock)
                if t.median_ms > 0:
                    found[(key, metric, series_clock(rec, clock))] = t.median_ms
        if cold and rec.compile_seconds:
            found[(key, *COMPILE_SERIES)] = rec.compile_seconds
    return found


@dataclass
class NoiseModel:
    """Each series' run-to-run noise per GPU: ``fitted`` maps (GPU as :func:`gpu_of` names it,
    series) to the sum of squared deviations of the log run medians from their A/A set's mean and
    its degrees of freedom."""

    fitted: dict[tuple[str, Series], tuple[float, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, runs: Iterable[StoredRun]) -> NoiseModel:
        """The noise of ``runs``: A/A sets are the runs of one commit on one GPU (runs without a GPU
        UUID are left out); each set contributes its squared deviations and size - 1 degrees of
        freedom to its GPU's estimate."""
        sets: dict[tuple[str, str, Series], list[float]] = defaultdict(list)
        for run in runs:
            gpu = gpu_of(run)
            if gpu is not None:
                for series, ms in run_medians(run).items():
                    sets[(run.commit, gpu, series)].append(math.log(ms))
        fitted: dict[tuple[str, Series], tuple[float, int]] = {}
        for (_, gpu, series), logs in sets.items():
            if len(logs) > 1:
                mean = statistics.fmean(logs)
                ss, df = fitted.get((gpu, series), (0.0, 0))
                ss += sum((v - mean) ** 2 for v in logs)
                fitted[(gpu, series)] = (ss, df + len(logs) - 1)
        return cls(fitted)

    def noise(self, gpu: str, series: Series) -> Noise | None:
        """The noise of ``series`` on ``gpu``; None with fewer than :data:`MIN_DF` degrees of
        freedom."""
        ss, df = self.fitted.get((gpu, series), (0.0, 0))
        return Noise(math.sqrt(ss / df), df) if df >= MIN_DF else None


def _summary(t: TimingView) -> Summary:
    return Summary(t.median_ms, t.q25_ms, t.q75_ms)


def _latest(runs: Sequence[StoredRun], key: str) -> Record | None:
    """The record of ``key`` of the latest of ``runs`` that gave it a verdict, else (an interrupt
    stopped it in every run that holds it) the latest; None where no run holds it."""
    found = [Record.of(run.records[key]) for run in runs if key in run.records]
    return next((r for r in reversed(found) if not r.interrupted), found[-1] if found else None)


def _limit(
    rec: Record, quantity: str, clock: str | None, threshold: float | None, metric: str = ""
) -> float | None:
    """The threshold of a metric: ``threshold`` where given, else its class's; None where the
    catalog does not gate the metric."""
    limit = gate_threshold(rec.benchmark, rec.params, quantity, clock, metric)
    return None if limit is None else (limit if threshold is None else threshold)


def compare_runs(
    base: Sequence[StoredRun],
    head: Sequence[StoredRun],
    noise: NoiseModel,
    threshold: float | None = None,
) -> list[Change]:
    """Every change of every record from the runs ``base`` to the runs ``head`` of one machine: on
    each GPU that ran the record at both commits, else across GPUs (not gated). Records of optbench
    ab's own designs are left out (:func:`run_medians`), so a row's figures are those its ratio
    comes from. ``threshold`` replaces the catalog's class thresholds of the gated metrics."""
    where = {
        "machine": (head or base)[0].machine,
        "base_commit": base[0].commit if base else "",
        "head_commit": head[0].commit if head else "",
    }

    def device(run: StoredRun) -> tuple[str, str | None]:  # one GPU in two folders: not alike
        return run.machine, gpu_of(run)

    def holds(run: StoredRun, key: str) -> bool:  # as run_medians: no record of ab's own designs
        return key in run.records and not ab_design(run.records[key])

    keys = dict.fromkeys(k for side in (base, head) for run in side for k in run.results())
    medians = {id(run): run_medians(run) for side in (base, head) for run in side}
    changes: list[Change] = []
    for key in keys:
        old = [r for r in base if holds(r, key)]
        new = [r for r in head if holds(r, key)]
        if not (old or new):  # measured in ab's rounds only
            continue
        common = sorted(d for d in {device(r) for r in old} & {device(r) for r in new} if d[1])
        for machine, gpu in common:
            changes += _record_changes(
                [r for r in old if device(r) == (machine, gpu)],
                [r for r in new if device(r) == (machine, gpu)],
                key,
                where,
                noise,
                threshold,
                gpu,
                medians,
            )
        if not common:
            changes += _record_changes(old, new, key, where, noise, threshold, None, medians)
    return changes


def _record_changes(
    base: Sequence[StoredRun],
    head: Sequence[StoredRun],
    key: str,
    where: dict,
    noise: NoiseModel,
    threshold: float | None,
    gpu: str | None,
    run_series: Mapping[int, dict[Series, float]],
) -> list[Change]:
    """The changes of one record between runs of one GPU (``gpu``) or of different GPUs (None);
    ``run_series``: each run's :func:`run_medians` by the run's ``id``. A record not ok on a side
    changes by its status; one ok on both by its times, its compile seconds and its peak memory."""
    b, h = _latest(base, key), _latest(head, key)
    rec = h or b
    assert rec is not None
    common = dict(where, key=key, benchmark=rec.benchmark, params=dict(rec.params), gpu=gpu)
    sb, sh = (r.status if r else MISSING for r in (b, h))
    if sb != OK or sh != OK:
        return _status_changes(common, sb, sh, gpu)
    assert b is not None and h is not None
    medians = [[run_series[id(r)] for r in side] for side in (base, head)]
    return [
        *_time_changes(common, b, h, medians, noise, threshold),
        *_compile_changes(common, h, medians, noise, threshold),
        *_median_changes(base, head, key, common, "peak memory", _peaks, threshold),
    ]


def _status_changes(common: dict, sb: str, sh: str, gpu: str | None) -> list[Change]:
    """The change of a record not ok at base (status ``sb``) or head (``sh``): none where both
    skipped it; never judged where an interrupt stopped it; else significant where the statuses
    differ and neither is missing, a regression where base's was ok and an improvement where
    head's is, judged on one GPU only."""
    if sb == sh == "skipped":
        return []
    if INTERRUPTED in (sb, sh):  # an interrupt stopped the case: no verdict on it
        significant = regression = improvement = gated = False
        reason = INTERRUPTED_RUN
    else:
        significant = sb != sh and MISSING not in (sb, sh)
        judged = significant and gpu is not None
        regression, improvement = judged and sb == OK, judged and sh == OK
        gated, reason = gpu is not None, "" if gpu is not None else CROSS_GPU
    return [
        Change(
            **common,
            metric="",
            quantity="status",
            clock=None,
            base=None,
            head=None,
            ratio=None,
            significant=significant,
            regression=regression,
            improvement=improvement,
            base_status=sb,
            head_status=sh,
            gated=gated,
            reason=reason,
        )
    ]


def _time_changes(
    common: dict,
    b: Record,
    h: Record,
    medians: list[list[dict[Series, float]]],
    noise: NoiseModel,
    threshold: float | None,
) -> list[Change]:
    """The changes of each time of head's record ``h`` against base's ``b``, by metric and clock:
    against the run-to-run noise; not gated where base measured another thing under the device
    clock; none where base has no such time."""
    changes = []
    for metric in h.metrics:
        for clock in dict.fromkeys(series_clock(h, c) for c in h.clocks(metric)):
            tb, th = timing_of(b, metric, clock), timing_of(h, metric, clock)
            if th is None:
                continue
            if tb is None:
                other = b.timing(metric, "device")
                if clock == "device" and other:  # base measured another thing under it
                    changes.append(
                        Change(
                            **common,
                            metric=metric,
                            quantity="time",
                            clock=clock,
                            base=_summary(other),
                            head=_summary(th),
                            ratio=None,
                            significant=False,
                            regression=False,
                            improvement=False,
                            method_changed=True,
                            gated=False,
                            reason=NOT_GATED,
                        )
                    )
                continue
            change = _noise_change(
                common,
                (common["key"], metric, clock),
                medians,
                noise,
                threshold,
                h,
                "time",
                _summary(tb),
                _summary(th),
            )
            if change is not None:
                changes.append(change)
    return changes


def _compile_changes(
    common: dict,
    h: Record,
    medians: list[list[dict[Series, float]]],
    noise: NoiseModel,
    threshold: float | None,
) -> list[Change]:
    """The change of the record's compile seconds (the median of each side's runs) against the
    run-to-run noise, where both sides' runs have some."""
    series = (common["key"], *COMPILE_SERIES)
    seconds = [[m[series] for m in side if series in m] for side in medians]
    if not (seconds[0] and seconds[1]):
        return []
    summaries = [Summary(*[statistics.median(side)] * 3) for side in seconds]
    change = _noise_change(common, series, medians, noise, threshold, h, "compile", *summaries)
    return [] if change is None else [dataclasses.replace(change, metric="", clock=None)]


def _noise_change(
    common: dict,
    series: Series,
    medians: list[list[dict[Series, float]]],
    noise: NoiseModel,
    threshold: float | None,
    rec: Record,
    quantity: str,
    base: Summary,
    head: Summary,
) -> Change | None:
    """The change of one series (a time, or compile seconds) between the runs' values
    ``medians`` (base's, head's), judged against its A/A noise on the comparison's GPU; None where
    a side lacks it."""
    logs = [[math.log(m[series]) for m in side if series in m] for side in medians]
    if not (logs[0] and logs[1]):
        return None
    # a time measured in several runs on a side shows what the change is taken from: their
    # geometric mean and range
    base, head = (
        given
        if len(side) == 1 or quantity != "time"
        else Summary(*(math.exp(v) for v in (statistics.fmean(side), min(side), max(side))))
        for side, given in zip(logs, (base, head))
    )
    _, metric, clock = series
    diff = statistics.fmean(logs[1]) - statistics.fmean(logs[0])
    limit = _limit(rec, quantity, None if quantity == "compile" else clock, threshold, metric)
    gpu = common["gpu"]
    model = noise.noise(gpu, series) if gpu is not None else None
    if gpu is None:  # across GPUs: beyond the threshold, reported
        detectable, reason = limit, CROSS_GPU
    elif quantity == "time" and not gpu.startswith(CPU_UNIT) and _host_bound(rec, clock, metric):
        detectable = limit if model is None else model.detectable(*map(len, logs), limit or 0.0)
        reason = HOST_BOUND
    elif model is None:
        detectable, reason = None, NO_NOISE if limit is not None else NOT_GATED
    else:
        detectable = model.detectable(len(logs[0]), len(logs[1]), limit or 0.0)
        reason = "" if limit is not None else NOT_GATED
    significant = detectable is not None and abs(diff) > math.log1p(detectable)
    gated = not reason
    return Change(
        **common,
        metric=metric,
        quantity=quantity,
        clock=clock,
        base=base,
        head=head,
        ratio=math.exp(diff),
        significant=significant,
        regression=gated and significant and diff > 0,
        improvement=gated and significant and diff < 0,
        runs=(len(logs[0]), len(logs[1])),
        noise=model,
        detectable=detectable,
        gated=gated,
        reason=reason,
    )


def _host_bound(rec: Record, clock: str, metric: str) -> bool:
    return metric_class(rec.benchmark, rec.params, "time", clock, metric) == "host-bound"


def _peaks(run: StoredRun, rec: Record) -> dict[str, float]:
    return rec.peaks()


def _median_changes(
    base: Sequence[StoredRun],
    head: Sequence[StoredRun],
    key: str,
    common: dict,
    quantity: str,
    values: Callable[[StoredRun, Record], dict[str, float]],
    threshold: float | None,
) -> list[Change]:
    """Changes of a quantity with one deterministic value per run and metric (peak memory): of the
    median over runs, beyond the class threshold."""

    def found(runs: Sequence[StoredRun]) -> dict[str, list[float]]:
        by_metric: dict[str, list[float]] = defaultdict(list)
        for run in runs:
            rec = Record.of(run.records[key])
            if rec.ok and not rec.ab_design:  # as run_medians: not ab's own designs
                for metric, value in values(run, rec).items():
                    by_metric[metric].append(value)
        return by_metric

    pb, ph = found(base), found(head)
    rec = Record.of(head[-1].records[key])
    gpu = common["gpu"]
    changes = []
    for metric in ph:
        if metric not in pb:
            continue
        limit = _limit(rec, quantity, None, threshold, metric)
        b, h = statistics.median(pb[metric]), statistics.median(ph[metric])
        ratio = h / b if b else (1.0 if h == b else math.inf)
        significant = limit is not None and abs(h - b) > limit * abs(b)
        gated = gpu is not None and limit is not None
        reason = "" if gated else (CROSS_GPU if gpu is None else NOT_GATED)
        changes.append(
            Change(
                **common,
                metric=metric,
                quantity=quantity,
                clock=None,
                base=Summary(b, b, b),
                head=Summary(h, h, h),
                ratio=ratio,
                significant=significant,
                regression=gated and significant and h > b,
                improvement=gated and significant and h < b,
                runs=(len(pb[metric]), len(ph[metric])),
                detectable=limit,
                gated=gated,
                reason=reason,
            )
        )
    return changes


def select_runs(runs: Sequence[StoredRun], wanted: Sequence[str] | None) -> list[StoredRun]:
    """The runs whose id starts with one of ``wanted`` (all runs when None)."""
    if not wanted:
        return list(runs)
    return [r for r in runs if any(r.run_id.startswith(w) for w in wanted)]


def compare(
    store: ResultStore,
    base: str,
    head: str,
    machines: Iterable[str] | None = None,
    threshold: float | None = None,
    base_runs: Sequence[str] | None = None,
    head_runs: Sequence[str] | None = None,
    base_machine: str | None = None,
) -> list[Change]:
    """Every change from ``base`` to ``head`` (commit-ish or stored prefix, :func:`resolve`) on each
    machine with both, the noise fitted on every stored run of the machine
    (``base_runs``/``head_runs``: run id prefixes to keep; with ``base == head``, two sets of runs
    of one commit, an A/A comparison).

    Non-significant changes are included (``significant`` False), and records on one side only
    (missing). ``base_machine``: take the base runs from that machine folder instead: a
    cross-machine comparison, labelled (:func:`cross_machine`), reported and never gated.
    """
    changes: list[Change] = []
    for machine in machines or store.machines():
        source = base_machine or machine
        b, h = resolve(store, source, base), resolve(store, machine, head)
        if b is None or h is None:
            continue
        old = select_runs(store.runs(source, b), base_runs)
        new = select_runs(store.runs(machine, h), head_runs)
        if b == h and source == machine:
            old = [r for r in old if r.run_id not in {n.run_id for n in new}]
        if not old or not new:
            continue
        found = compare_runs(old, new, NoiseModel.of(store.machine_runs(machine)), threshold)
        changes += found if source == machine else [cross_machine(c, source) for c in found]
    return changes


def cross_machine(change: Change, base_machine: str) -> Change:
    """``change`` of a comparison whose base ran on ``base_machine``: labelled, reported, not
    gated."""
    return dataclasses.replace(
        change,
        base_machine=base_machine,
        gpu=None,
        gated=False,
        regression=False,
        improvement=False,
        reason=CROSS_GPU,
    )


def verdict(c: Change) -> str:
    """'REGRESSION', 'improvement', 'no noise estimate on this GPU', 'interrupted: not gated', a
    not-gated change ('slower (CROSS-GPU)', 'faster (not gated)', 'status changed (CROSS-GPU)', ...)
    or ''."""
    if c.regression:
        return "REGRESSION"
    if c.improvement:
        return "improvement"
    if c.reason in (NO_NOISE, INTERRUPTED_RUN):
        return c.reason
    if c.significant and not c.gated:
        what = (
            "status changed"
            if c.quantity == "status"
            else ("slower" if (c.ratio or 1) > 1 else "faster")
        )
        return f"{what} ({c.reason})"
    return ""


def _format(c: Change, s: Summary | None, status: str) -> str:
    if s is None:
        return status
    if c.quantity == "peak memory":
        return f"{s.median / 2**20:.1f} MiB"
    if c.quantity == "compile":
        return f"{s.median:.3g} s"
    return f"{s.median:.4g} ms [{s.q25:.4g}–{s.q75:.4g}]"


def rows(changes: Iterable[Change]) -> list[tuple[str, ...]]:
    """Table cells (see COLUMNS) of changes: a time's median with its quartiles where a side has
    one run, else the geometric mean of its runs' medians with their range (what the ratio is taken
    from), MiB for memory, seconds for compile; the ratio of the runs' geometric means; the runs per
    side; the smallest change the comparison detects."""
    return [
        (
            c.benchmark,
            " ".join(c.key.split("|")[1:]),
            metric_label(c.metric, c.quantity),
            c.clock or "",
            _format(c, c.base, c.base_status),
            _format(c, c.head, c.head_status),
            "" if c.ratio is None else f"{c.ratio:.3f}×",
            "" if c.quantity == "status" else "{}/{}".format(*c.runs),
            "" if c.detectable is None else f"±{c.detectable:.1%}",
            verdict(c),
        )
        for c in changes
    ]


def compared(c: Change) -> bool:
    """Whether the record has results at both commits (an interrupted one has none)."""
    return not {MISSING, INTERRUPTED} & {c.base_status, c.head_status}


def shown(c: Change) -> bool:
    """Whether a change belongs in the default table: beyond what the comparison detects, or failing
    at head, or interrupted on a side."""
    return (
        c.significant
        or c.head_status not in (OK, "skipped", MISSING)
        or c.reason == INTERRUPTED_RUN
    )


def _title(c: Change) -> str:
    span = f"{c.base_commit[:12]} → {c.head_commit[:12]}"
    if c.base_machine:
        return (
            f"{CROSS_GPU}, not gated: {c.base_machine} {c.base_commit[:12]} → {c.machine} "
            f"{c.head_commit[:12]}"
        )
    if c.gpu is None:
        return f"{CROSS_GPU}, not gated: {c.machine}: {span} (no GPU ran these records at both)"
    return f"{c.machine} on {c.gpu}: {span}"


def main(argv: list[str] | None = None) -> int:
    """``optbench compare BASE HEAD``: exit 0 no regression (or the same code), 1 a regression, 2
    nothing comparable."""
    from optbench.run.console import console

    args = _parser().parse_args(argv)
    store = ResultStore(args.results)
    out = console()
    if not (args.base_run or args.head_run) and _same_code(out, args.base, args.head):
        return 0
    machines = args.machine or store.machines()
    found, same, changes = _gather(store, args, machines)
    for ref, where in found.items():
        if not where:
            on = (
                ", ".join(machines)
                if ref != args.base or not args.base_machine
                else args.base_machine
            )
            print(
                f"optbench compare: nothing to compare: {ref!r} has no stored runs on {on} "
                f"(results in {store.root})",
                file=sys.stderr,
            )
            return 2
    if same and not changes:
        out.print(
            f"same code: {args.base} and {args.head} measure the same commit: nothing to compare",
            style="green",
        )
        return 0
    _show(out, changes, args.all)
    if not same and not any(c.gpu is not None and compared(c) for c in changes):
        print(
            f"optbench compare: nothing comparable: no GPU ran a record at both {args.base} "
            f"(stored on {', '.join(found[args.base])}) and {args.head} (stored on "
            f"{', '.join(found[args.head])}); changes across GPUs are reported, never gated",
            file=sys.stderr,
        )
        return 2
    regressions = [c for c in changes if c.regression]
    out.print(
        f"{len(regressions)} regressions beyond their class threshold and noise",
        style="bold red" if regressions else "green",
    )
    return 1 if regressions else 0


def _parser() -> argparse.ArgumentParser:
    """``optbench compare``'s command line."""
    p = argparse.ArgumentParser(
        prog="optbench compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("base", help="base commit-ish or stored hash prefix")
    p.add_argument("head", help="head commit-ish or stored hash prefix")
    p.add_argument(
        "--machine", action="append", help="machine folder to compare (repeatable; default all)"
    )
    classes = ", ".join(f"{k} {v:.0%}%" for k, v in GATE_THRESHOLDS.items())  # argparse: %%
    p.add_argument(
        "--threshold",
        type=float,
        help="relative change below which nothing fails, for every gated metric "
        f"(default: its class's: {classes})",
    )
    p.add_argument(
        "--base-run",
        action="append",
        help="only the base runs whose id starts with this (repeatable)",
    )
    p.add_argument(
        "--head-run",
        action="append",
        help="only the head runs whose id starts with this (repeatable)",
    )
    p.add_argument(
        "--results", type=Path, help="results root (default $OPTBENCH_RESULTS or results/)"
    )
    p.add_argument(
        "--all", action="store_true", help="list every compared metric, not only the changed"
    )
    p.add_argument(
        "--base-machine",
        help="take BASE's runs from this machine folder: a "
        "cross-machine comparison, reported, never gated",
    )
    return p


def _same_code(out: Any, base: str, head: str) -> bool:
    """Whether ``base`` and ``head`` hold the same code (:func:`code_commit`), said where they
    do."""
    code = {code_commit(base) or base, code_commit(head) or head}
    if len(code) == 1:
        out.print(
            f"same code: {base} and {head} both measure {code.pop()[:12]}: nothing to compare",
            style="green",
        )
        return True
    return False


def _gather(
    store: ResultStore, args: argparse.Namespace, machines: Sequence[str]
) -> tuple[dict[str, list[str]], bool, list[Change]]:
    """(ref -> the machines with runs of it, whether base and head resolve to one commit on a
    machine, the changes of every machine where both have runs)."""
    found: dict[str, list[str]] = {args.base: [], args.head: []}
    same = False
    changes: list[Change] = []
    for machine in machines:
        b = resolve(store, args.base_machine or machine, args.base)
        h = resolve(store, machine, args.head)
        found[args.base] += [args.base_machine or machine] if b else []
        found[args.head] += [machine] if h else []
        if b and h:
            same |= b == h
            if b != h or args.base_run or args.head_run:
                changes += compare(
                    store,
                    b,
                    h,
                    [machine],
                    args.threshold,
                    args.base_run,
                    args.head_run,
                    args.base_machine,
                )
    return found, same, changes


def _show(out: Any, changes: Sequence[Change], everything: bool) -> None:
    """A table per comparison (one GPU's, or one across GPUs) of its changes (``everything``:
    every compared metric), or a line where none changed, then its notes."""
    from optbench.run.console import table

    for title in dict.fromkeys(map(_title, changes)):
        mine = [c for c in changes if _title(c) == title]
        listed = [c for c in mine if everything or shown(c)]
        if listed:
            out.print(table(COLUMNS, rows(listed), title=title, marks=[verdict(c) for c in listed]))
        else:
            out.print(
                f"{title}: no change beyond what each metric lets the comparison detect, in "
                f"{len(mine)} metrics"
            )
        _notes(out, mine)


def _notes(out: Any, mine: Sequence[Change]) -> None:
    """What the table of one comparison leaves out: metrics not compared, without noise, missing."""
    where = f"{mine[0].machine} on {mine[0].gpu}" if mine[0].gpu else mine[0].machine
    changed = sum(c.method_changed for c in mine)
    if changed:
        out.print(
            f"note: {changed} time metrics are not compared on {where}: their clock measures "
            "another thing at head (e.g. cold-L2 kernel device time, `info.device_clock`)"
        )
    times = [c for c in mine if c.quantity == "time" and c.detectable is not None and c.gated]
    if times:
        out.print(
            f"{where}: {len(times)} time metrics judged; smallest detectable change: median "
            f"{statistics.median(c.detectable for c in times):.1%}, ≤ 10% in "
            f"{sum(c.detectable <= 0.10 for c in times)}"
        )
    blind = sum(c.reason == NO_NOISE for c in mine)
    if blind:
        out.print(
            f"note: {blind} time metrics on {where}: {NO_NOISE} (fewer than {MIN_DF} "
            "degrees of freedom of A/A runs, runs of one commit on it): reported (--all), "
            "not gated"
        )
    stopped = sum(c.reason == INTERRUPTED_RUN for c in mine)
    if stopped:
        out.print(
            f"note: {stopped} records on {where} were interrupted (partial runs): reported, "
            "not gated"
        )
    lost = sum(c.base_status == OK and c.head_status == MISSING for c in mine)
    if lost:
        out.print(f"note: {lost} results of the base commit are missing at head on {where}")


if __name__ == "__main__":
    sys.exit(main())
