"""Compares two commits' runs machine by machine: what got slower or hungrier, by how much, and is it real.

The unit of evidence is a run (one process), not a sample within one: a host-bound step moves more between
processes than within one, and so do kernels between two lent machines of one kind. The rule, per benchmark
record, metric and clock (``device``, ``wall``, ...):

- Time: each run's median; base and head are the runs of each commit (``optbench run`` adds a run, and a
  commit's runs add up). The change is the difference of the mean log medians, head minus base. Its noise is
  the metric's run-to-run standard deviation sigma of a log median, estimated on that machine from history that
  holds no real change (:func:`fit_noise`): the runs of every commit but head, in commit order, cut into
  segments at the change points asv's step detection finds (``asv.step_detect.detect_steps`` on the commits'
  mean log medians), pooled within segments (runs of one commit are an A/A set and never split). Lent machines
  of one kind differ: runs from several of them (each run records its GPU UUID) enter the estimate, so it
  holds across machines. A metric with fewer than :data:`MIN_DF` degrees of freedom of its own borrows that of
  its other device clock (cold- and warm-L2 time the same kernels on the same machines), else the median
  estimate of its benchmark's parameter combinations (at least :data:`MIN_DF` of them, its degrees of freedom
  taken as their number), else :data:`PRIOR_SIGMA`. It is never below the spread of a compared run's samples.
- The smallest detectable change of a comparison is ``exp(max(log(1 + threshold), q * sigma * sqrt(1/n_base +
  1/n_head))) - 1``, with q Student's t quantile at 1 - :data:`ALPHA` for sigma's degrees of freedom (the
  normal quantile for the prior). A change beyond it is a regression (slower) or an improvement (faster).
- The wall time of a record whose primary clock is its device time (a kernel's) is reported, never gated: it is
  host launch overhead, noisier between machines than 5%; the device times of the same work gate
  (:func:`gated_clock`).
- Peak memory (one deterministic value per run): a change of the median over runs beyond ``threshold`` counts.
- Status (of each side's latest run): ``ok`` to anything else (oom, wrong, timeout, error, skipped) is a
  regression, anything to ``ok`` an improvement; other non-ok records are reported as they are, and records
  skipped on both sides stay silent. A record on one side only is reported with status ``missing`` and never
  fails the gate, but a comparison in which no record has results on both sides exits 2: a gate with nothing to
  compare must not pass.

Exit codes of ``optbench compare``: 0 no regression, 1 a regression, 2 nothing to compare.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from optbench.core.records import OK, Record, TimingView
from optbench.core.store import REPO_ROOT, ResultStore, StoredRun

MISSING = "missing"
COLUMNS = ("benchmark", "params", "metric", "clock", "base", "head", "head/base", "runs", "detectable", "verdict")
ALPHA = 1e-3  # one-sided false-alarm rate of one metric's verdict
MIN_DF = 3  # degrees of freedom a metric's own noise estimate needs before it is used
PRIOR_SIGMA = 0.05  # run-to-run sigma of a log median assumed where history says nothing (5%)

Series = tuple[str, str, str]  # (record key, metric, clock)
SIBLING_CLOCKS = {"device": "device_warm", "device_warm": "device"}  # one kernel's cold- and warm-L2 device times


class Summary(NamedTuple):
    """Median and quartiles of one side: ms for a time, bytes for peak memory (quartiles = median)."""

    median: float
    q25: float
    q75: float


@dataclass(frozen=True)
class Noise:
    """Run-to-run noise of one metric: sigma of a run's log median, its degrees of freedom (0: the prior) and
    where it comes from ('own', 'other clock', 'benchmark' (the benchmark's parameters), 'within run' or
    'prior')."""

    sigma: float
    df: int
    source: str

    def quantile(self) -> float:
        """The one-sided 1 - ALPHA quantile that a change must pass, in sigmas of the compared means."""
        from scipy import stats

        return float(stats.norm.ppf(1 - ALPHA) if self.df <= 0 else stats.t.ppf(1 - ALPHA, self.df))

    def detectable(self, n_base: int, n_head: int, threshold: float) -> float:
        """Smallest relative change a comparison of n_base and n_head runs flags (0.05 = 5%)."""
        bound = self.quantile() * self.sigma * math.sqrt(1 / n_base + 1 / n_head)
        return math.exp(max(math.log1p(threshold), bound)) - 1

    def aa_spread(self) -> float:
        """The A/A run-to-run spread: what two single runs of the same code may differ by without the gate
        calling it a change (the smallest change one run against one run detects, without the threshold)."""
        return math.exp(self.quantile() * self.sigma * math.sqrt(2)) - 1


    def at_least(self, sigma: float) -> Noise:
        """This noise, or ``sigma`` (source 'within run', from a run's many samples: the normal quantile) where
        that is larger."""
        return self if sigma <= self.sigma else Noise(sigma, 0, "within run")


PRIOR = Noise(PRIOR_SIGMA, 0, "prior")
IQR_PER_SIGMA = 1.349  # interquartile range of a normal distribution, in standard deviations


def _within_run_sigma(base: Sequence[StoredRun], head: Sequence[StoredRun], series: Series) -> float:
    """The largest relative spread of one run's samples (IQR / median / 1.349) among the runs compared: a run
    whose samples drift that much has a median no more repeatable than that, whatever the history says."""
    key, metric, clock = series
    spreads = [0.0]
    for run in (*base, *head):
        rec = Record.of(run.records[key]) if key in run.records else None
        t = timing_of(rec, metric, clock) if rec and rec.ok else None
        if t and t.median_ms > 0:
            spreads.append(t.iqr_ms / t.median_ms / IQR_PER_SIGMA)
    return max(spreads)


@dataclass(frozen=True)
class Change:
    """One metric of one record from base to head on one machine (quantity 'status' for a status change)."""

    machine: str
    base_commit: str
    head_commit: str
    key: str
    benchmark: str
    params: dict[str, Any]
    metric: str
    quantity: str  # 'time', 'peak memory' or 'status'
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
    noise: Noise | None = None  # a time's run-to-run noise on this machine
    detectable: float | None = None  # the smallest relative change this comparison flags
    method_changed: bool = False  # the clock measures something else at head (e.g. cold-L2 device time): not gated
    gated: bool = True  # False: reported only (host wall time of a record timed on the device: :func:`gated_clock`)
    base_machine: str | None = None  # set where the base ran on another machine (:func:`cross_machine`)


def git_commit(ref: str) -> str | None:
    """Full hash of a commit-ish in the repository of this file, or None where git cannot resolve it."""
    try:
        out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                             cwd=REPO_ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def resolve(store: ResultStore, machine: str, ref: str) -> str | None:
    """Stored commit of ``machine`` for a commit-ish (via git) or a stored hash prefix; None if not one."""
    for candidate in dict.fromkeys(filter(None, (git_commit(ref), ref))):
        try:
            return store.resolve(machine, candidate)
        except KeyError:
            continue
    return None


def series_clock(rec: Record, clock: str) -> str:
    """The clock a record's timing belongs to by method: a graph-replayed ``device`` time of a record that predates
    ``info.device_clock`` (a kernel's, back-to-back on one input set) is what newer records call ``device_warm``,
    so its history informs that clock's noise."""
    old_kernel = rec.benchmark.startswith("bench_kernels.") and "device_clock" not in rec.info
    return "device_warm" if clock == "device" and old_kernel else clock


def timing_of(rec: Record, metric: str, clock: str) -> TimingView | None:
    """The timing of ``metric`` that belongs to the series clock ``clock`` (:func:`series_clock`), or None."""
    name = next((name for name in rec.clocks(metric) if series_clock(rec, name) == clock), None)
    return rec.timing(metric, name) if name else None


def gated_clock(rec: Record, clock: str) -> bool:
    """Whether a clock of a record decides the gate: every clock but the wall time of a record whose primary clock
    is its device time (a kernel's). That wall time measures host launch overhead (at small shapes twice the device
    time) and spreads more than 5% between two lent H100s (0.089 vs 0.164 ms for compiled QKVRope at 100M); the
    device times of the same work gate, and a wall change is still reported. A step's primary clock is its wall
    time (what training pays), so a step's wall time gates."""
    return clock != "wall" or rec.primary_clock == "wall"


def run_medians(run: StoredRun) -> dict[Series, float]:
    """Median ms of every timed (metric, clock) of the run's ok records, by series (clocks by method:
    :func:`series_clock`)."""
    found = {}
    for key, data in run.results().items():
        rec = Record.of(data)
        if not rec.ok:
            continue
        for metric in rec.metrics:
            for clock in rec.clocks(metric):
                t = rec.timing(metric, clock)
                if t.median_ms > 0:
                    found[(key, metric, series_clock(rec, clock))] = t.median_ms
    return found


def _segments(means: list[float]) -> list[list[int]]:
    """Indices of ``means`` cut at the change points asv's step detection finds (one per commit where there are
    too few commits to look for one)."""
    if len(means) < 3:  # too few to find a change point: only the runs of one commit count as alike
        return [[i] for i in range(len(means))]
    from asv.step_detect import detect_steps

    steps = detect_steps(means)
    return [list(range(left, right)) for left, right, *_ in steps] or [list(range(len(means)))]


def fit_noise(history: Sequence[Sequence[StoredRun]]) -> dict[Series, tuple[float, int]]:
    """(sum of squared deviations, degrees of freedom) of each series' log run medians within segments of no
    change, from ``history``: the runs of each commit, oldest commit first (see the module docstring)."""
    per_commit: dict[Series, list[list[float]]] = defaultdict(list)
    for runs in history:
        values: dict[Series, list[float]] = defaultdict(list)
        for run in runs:
            for series, ms in run_medians(run).items():
                values[series].append(math.log(ms))
        for series, logs in values.items():
            per_commit[series].append(logs)
    fitted = {}
    for series, groups in per_commit.items():
        ss, df = 0.0, 0
        for segment in _segments([statistics.fmean(g) for g in groups]):
            pooled = [v for i in segment for v in groups[i]]
            if len(pooled) > 1:
                mean = statistics.fmean(pooled)
                ss += sum((v - mean) ** 2 for v in pooled)
                df += len(pooled) - 1
        fitted[series] = (ss, df)
    return fitted


@dataclass
class NoiseModel:
    """Each series' :class:`Noise` on one machine (see :func:`fit_noise`)."""

    fitted: dict[Series, tuple[float, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, history: Sequence[Sequence[StoredRun]]) -> NoiseModel:
        return cls(fit_noise(history))

    def __post_init__(self) -> None:
        sigmas: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        for (key, metric, clock), (ss, df) in self.fitted.items():
            if df > 0:
                sigmas[(key.split("|")[0], metric, clock)].append(math.sqrt(ss / df))
        # The median over the benchmark's parameter combinations: one combination whose history holds a change
        # the step detection could not see does not set everyone's noise.
        self._pooled = {k: (statistics.median(v), len(v)) for k, v in sigmas.items()}

    def noise(self, series: Series) -> Noise:
        ss, df = self.fitted.get(series, (0.0, 0))
        if df >= MIN_DF:
            return Noise(math.sqrt(ss / df), df, "own")
        key, metric, clock = series
        ss, df = self.fitted.get((key, metric, SIBLING_CLOCKS.get(clock, "")), (0.0, 0))
        if df >= MIN_DF:  # the same kernels timed on the same machines, by the other device method
            return Noise(math.sqrt(ss / df), df, "other clock")
        sigma, count = self._pooled.get((key.split("|")[0], metric, clock), (0.0, 0))
        return Noise(sigma, count, "benchmark") if count >= MIN_DF else PRIOR


def _summary(t: TimingView) -> Summary:
    return Summary(t.median_ms, t.q25_ms, t.q75_ms)


def _latest(runs: Sequence[StoredRun], key: str) -> Record | None:
    return next((Record.of(run.records[key]) for run in reversed(runs) if key in run.records), None)


def compare_runs(base: Sequence[StoredRun], head: Sequence[StoredRun], noise: NoiseModel,
                 threshold: float = 0.05) -> list[Change]:
    """Every change of every record from the runs ``base`` to the runs ``head`` of one machine."""
    where = {"machine": (head or base)[0].machine, "base_commit": base[0].commit if base else "",
             "head_commit": head[0].commit if head else ""}
    medians = [[run_medians(r) for r in side] for side in (base, head)]
    keys = dict.fromkeys(k for side in (base, head) for run in side for k in run.results())
    changes: list[Change] = []
    for key in keys:
        b, h = _latest(base, key), _latest(head, key)
        rec = h or b
        assert rec is not None
        common = dict(where, key=key, benchmark=rec.benchmark, params=dict(rec.params))
        sb, sh = (r.status if r else MISSING for r in (b, h))
        if sb != OK or sh != OK:
            if sb == sh == "skipped":
                continue
            significant = sb != sh and MISSING not in (sb, sh)
            changes.append(Change(**common, metric="", quantity="status", clock=None, base=None, head=None,
                                  ratio=None, significant=significant, regression=significant and sb == OK,
                                  improvement=significant and sh == OK, base_status=sb, head_status=sh))
            continue
        assert b is not None and h is not None
        for metric in h.metrics:
            for clock in dict.fromkeys(series_clock(h, c) for c in h.clocks(metric)):
                tb, th = timing_of(b, metric, clock), timing_of(h, metric, clock)
                if th is None:
                    continue
                if tb is None:
                    other = b.timing(metric, "device")
                    if clock == "device" and other:  # base measured another thing under it
                        changes.append(Change(**common, metric=metric, quantity="time", clock=clock,
                                              base=_summary(other), head=_summary(th),
                                              ratio=None, significant=False, regression=False, improvement=False,
                                              method_changed=True))
                    continue
                series = (key, metric, clock)
                logs = [[math.log(m[series]) for m in side if series in m] for side in medians]
                if not (logs[0] and logs[1]):
                    continue
                model = noise.noise(series).at_least(_within_run_sigma(base, head, series))
                detectable = model.detectable(len(logs[0]), len(logs[1]), threshold)
                diff = statistics.fmean(logs[1]) - statistics.fmean(logs[0])
                significant = abs(diff) > math.log1p(detectable)
                gated = gated_clock(h, clock)
                changes.append(Change(**common, metric=metric, quantity="time", clock=clock, base=_summary(tb),
                                      head=_summary(th), ratio=math.exp(diff), significant=significant,
                                      regression=gated and significant and diff > 0,
                                      improvement=gated and significant and diff < 0,
                                      runs=(len(logs[0]), len(logs[1])), noise=model, detectable=detectable,
                                      gated=gated))
        changes += _memory_changes(base, head, key, common, threshold)
    return changes


def _memory_changes(base: Sequence[StoredRun], head: Sequence[StoredRun], key: str, common: dict,
                    threshold: float) -> list[Change]:
    def peaks(runs: Sequence[StoredRun]) -> dict[str, list[float]]:
        found: dict[str, list[float]] = defaultdict(list)
        for run in runs:
            rec = Record.of(run.records[key]) if key in run.records else None
            if rec and rec.ok:
                for metric, value in rec.peaks().items():
                    found[metric].append(value)
        return found

    pb, ph = peaks(base), peaks(head)
    changes = []
    for metric in ph:
        if metric not in pb:
            continue
        b, h = statistics.median(pb[metric]), statistics.median(ph[metric])
        ratio = h / b if b else (1.0 if h == b else math.inf)
        significant = abs(h - b) > threshold * abs(b)
        changes.append(Change(**common, metric=metric, quantity="peak memory", clock=None, base=Summary(b, b, b),
                              head=Summary(h, h, h), ratio=ratio, significant=significant,
                              regression=significant and h > b, improvement=significant and h < b,
                              runs=(len(pb[metric]), len(ph[metric])), detectable=threshold))
    return changes


def history_runs(store: ResultStore, machine: str, leave_out: Iterable[str] = ()) -> list[list[StoredRun]]:
    """The runs of each stored commit of ``machine``, oldest commit first, without the runs ``leave_out`` names
    (run ids) and without commits left with no run."""
    skip = set(leave_out)
    history = [[r for r in store.runs(machine, c) if r.run_id not in skip] for c in store.commits(machine)]
    return [runs for runs in history if runs]


def select_runs(runs: Sequence[StoredRun], wanted: Sequence[str] | None) -> list[StoredRun]:
    """The runs whose id starts with one of ``wanted`` (all runs when None)."""
    return list(runs) if not wanted else [r for r in runs if any(r.run_id.startswith(w) for w in wanted)]


def compare(store: ResultStore, base: str, head: str, machines: Iterable[str] | None = None,
            threshold: float = 0.05, base_runs: Sequence[str] | None = None,
            head_runs: Sequence[str] | None = None, base_machine: str | None = None) -> list[Change]:
    """Every change from ``base`` to ``head`` (commit-ish or stored prefix) on each machine with both, the noise
    estimated from every stored run but the compared head runs (``base_runs``/``head_runs``: run id prefixes to
    keep; with ``base == head``, two sets of runs of one commit, an A/A comparison).

    Non-significant changes are included (``significant`` False), and records on one side only (missing).
    ``base_machine``: take the base runs from that machine folder instead: a cross-machine comparison, labelled
    (:func:`cross_machine`), reported and never gated (another GPU is not a regression).
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
        noise = NoiseModel.of(history_runs(store, machine, leave_out=[r.run_id for r in new]))
        found = compare_runs(old, new, noise, threshold)
        changes += found if source == machine else [cross_machine(c, source) for c in found]
    return changes


def cross_machine(change: Change, base_machine: str) -> Change:
    """``change`` of a comparison whose base ran on ``base_machine``: labelled, reported, not gated."""
    return dataclasses.replace(change, base_machine=base_machine, gated=False, regression=False, improvement=False)


def verdict(c: Change) -> str:
    """'REGRESSION', 'improvement', 'slower (not gated)', 'faster (not gated)' or ''."""
    if c.regression:
        return "REGRESSION"
    if c.improvement:
        return "improvement"
    if c.significant and not c.gated:
        return f"{'slower' if (c.ratio or 1) > 1 else 'faster'} (not gated)"
    return ""


def _format(c: Change, s: Summary | None, status: str) -> str:
    if s is None:
        return status
    if c.quantity == "peak memory":
        return f"{s.median / 2**20:.1f} MiB"
    return f"{s.median:.4g} ms [{s.q25:.4g}–{s.q75:.4g}]"


def _detectable(c: Change) -> str:
    if c.detectable is None:
        return ""
    source = f" ({c.noise.source})" if c.noise is not None and c.noise.source != "own" else ""
    return f"±{c.detectable:.1%}{source}"


def rows(changes: Iterable[Change]) -> list[tuple[str, ...]]:
    """Table cells (see COLUMNS) of changes: medians of the latest runs with their quartiles, MiB for memory;
    the ratio of the runs' geometric means; the runs per side; the smallest change the comparison detects."""
    return [(c.benchmark, " ".join(c.key.split("|")[1:]),
             c.metric if c.quantity == "time" else f"{c.metric} {c.quantity}".strip(),
             c.clock or "", _format(c, c.base, c.base_status), _format(c, c.head, c.head_status),
             "" if c.ratio is None else f"{c.ratio:.3f}×", "" if c.quantity == "status" else "{}/{}".format(*c.runs),
             _detectable(c), verdict(c)) for c in changes]


def compared(c: Change) -> bool:
    """Whether the record has results at both commits."""
    return MISSING not in (c.base_status, c.head_status)


def shown(c: Change) -> bool:
    """Whether a change belongs in the default table: beyond what the comparison detects, or failing at head."""
    return c.significant or c.head_status not in (OK, "skipped", MISSING)


def main(argv: list[str] | None = None) -> int:
    """``optbench compare BASE HEAD``: exit 1 on a regression, 2 when nothing was comparable."""
    from optbench.core.console import console, table

    p = argparse.ArgumentParser(prog="optbench compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="base commit-ish or stored hash prefix")
    p.add_argument("head", help="head commit-ish or stored hash prefix (the same as base: compare runs of it)")
    p.add_argument("--machine", action="append", help="machine folder to compare (repeatable; default all)")
    p.add_argument("--threshold", type=float, default=0.05, help="relative change below which nothing fails")
    p.add_argument("--base-run", action="append", help="only the base runs whose id starts with this (repeatable)")
    p.add_argument("--head-run", action="append", help="only the head runs whose id starts with this (repeatable)")
    p.add_argument("--results", type=Path, help="results root (default $OPTBENCH_RESULTS or results/)")
    p.add_argument("--all", action="store_true", help="list every compared metric, not only the changed")
    p.add_argument("--base-machine", help="take BASE's runs from this machine folder: a cross-machine comparison, "
                                          "reported, never gated (exit 0 unless nothing compares)")
    args = p.parse_args(argv)

    store = ResultStore(args.results)
    if args.base == args.head and not (args.base_run and args.head_run) and not args.base_machine:
        print("optbench compare: comparing a commit with itself needs --base-run and --head-run (an A/A "
              "comparison of two sets of its runs)", file=sys.stderr)
        return 2
    changes = compare(store, args.base, args.head, args.machine, args.threshold, args.base_run, args.head_run,
                      args.base_machine)
    out = console()
    if not any(map(compared, changes)):
        out.print(f"optbench compare: nothing to compare: no machine in {store.root} has results of one "
                      f"benchmark at both {args.base} and {args.head}", style="bold red")
        return 2
    for machine in dict.fromkeys(c.machine for c in changes):
        mine = [c for c in changes if c.machine == machine]
        listed = [c for c in mine if args.all or shown(c)]
        title = f"{machine}: {mine[0].base_commit[:12]} → {mine[0].head_commit[:12]}"
        if mine[0].base_machine:
            title = (f"CROSS-MACHINE, not gated: {mine[0].base_machine} {mine[0].base_commit[:12]} → {machine} "
                     f"{mine[0].head_commit[:12]}")
        if listed:
            out.print(table(COLUMNS, rows(listed), title=title, marks=[verdict(c) for c in listed]))
        else:
            out.print(f"{title}: no change beyond what each metric's noise lets it detect, in {len(mine)} "
                          "metrics")
        changed = sum(c.method_changed for c in mine)
        if changed:
            out.print(f"note: {changed} time metrics are not compared on {machine}: their clock measures another "
                          "thing at head (e.g. cold-L2 kernel device time, `info.device_clock`)")
        times = [c for c in mine if c.quantity == "time" and not c.method_changed]
        if times:
            sources = Counter(c.noise.source for c in times if c.noise is not None)
            out.print(f"{machine}: {len(times)} time metrics; smallest detectable change: median "
                          f"{statistics.median(c.detectable for c in times):.1%}, ≤ 10% in "
                          f"{sum(c.detectable <= 0.10 for c in times)}; noise from "
                          + ", ".join(f"{source} {n}" for source, n in sources.most_common())
                          + f" (prior: {PRIOR_SIGMA:.0%} per run)")
        lost = sum(c.base_status == OK and c.head_status == MISSING for c in mine)
        if lost:
            out.print(f"note: {lost} results of the base commit are missing at head on {machine}")
    regressions = [c for c in changes if c.regression]
    out.print(f"{len(regressions)} regressions beyond the threshold ({args.threshold:.0%}) and their noise",
                  style="bold red" if regressions else "green")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
