"""``optbench ab BASE HEAD``: did HEAD slow anything down? Both commits measured here, interleaved.

Each commit is checked out into a worktree of its own (under ``.cache/ab/``) after resolving it to
the commit whose code it holds (commits of results and docs alone measure their parent's code):
where both resolve to one commit, the code is the same and nothing is measured. Every case is
checked before it is timed: a kernel or step case in the rounds until every side has passed the
checks of its grid process's cases in one run, and later rounds reuse those checks (their records
name that run, ``checked_in``; where a side's code predates this, every side checks in every round);
every other case in every round. A process that checked need not hold what one that reused a check
holds after timing (NOTES.md), so a case's memory is judged from the rounds that reused its check
where both sides have such rounds, else from all. The selected cases are measured in one of two
designs:

- **ABBA rounds** (kernels, device-bound steps): a round runs one commit's cases in fresh processes
  (the steps in one, the other grids in another, as ``optbench run`` does), one side after the other
  in ABBA order (base, head, head, base, ...), so that drift of the machine falls on both sides
  alike. Per metric, head/base of the rounds' values with its Mann-Whitney interval
  (:func:`optbench.gate.ratio.ratio`).
- **Lockstep rounds** (cases whose step is host-bound: below 1B, no CUDA graph): both commits'
  processes at once, every thread of both on one CPU (another each round), taking turns sample by
  sample (:mod:`optbench.measure.lockstep`), the base first in every other round. A host-bound
  step's time is the host's, whose speed moves within seconds on a shared machine: paired samples
  meet the same spells. Per metric, each round's median of ``log(head_i / base_i)``, and over the
  rounds the signed-rank interval (:func:`optbench.gate.ratio.paired_ratio`; 6 rounds are the fewest
  that bound it). Where a side's code predates lockstep, these cases go to the ABBA rounds.

Each round's processes make an ordinary run of their commit: the records go to the store
(``results/<machine>/optbench/``; a lockstep run's records say so, ``lockstep``) and the history
gains them. The first pair and lockstep round fill the compile caches (the base's first round
compiles, the head's reads what it can of that): their compile seconds are not judged, so compile
seconds need a fifth pair to be bounded (``--require compile`` runs it); their times are judged, and
their memory where no later round reuses their check (on an H200 the first pair's device times sat
within the later pairs' spread, cold cache or not: NOTES.md, 2026-11-29). The first ``--warmup``
pairs and lockstep rounds (default none) are not judged at all. Each verdict is against the metric's
threshold (``optbench.suite.catalog.GATE_THRESHOLDS``: device-bound times 3%, host-bound 10%, peak
memory 1%, compile seconds 15%). Each design goes on until every metric of the classes that must
be decided (``--require``: device-bound, memory and host-bound by default) has a verdict other than
inconclusive, after at least ``--min-rounds`` judged rounds (lockstep: at least 6), or until
``--max-rounds``; a pair or round runs only where it fits in what is left of ``--time-budget``. A
host-bound time measured in fresh processes (a graphed step's forward, or any where lockstep cannot
run) moves by tens of percent between them: it is judged and reported, and flags a regression when
its whole interval is past the threshold, but never holds up the verdict. A case that is ok at base
and fails at head in any round is a regression. The pairing (which runs, in which order, on which
GPU and CPU, the verdicts) is stored in ``results/<machine>/ab/<first run id>.json``.

With several heads (``optbench ab BASE HEAD1 HEAD2``: a planted and a neutral change, or a
stack of pull requests), every head is judged against the same base runs: each ABBA pass runs the
base and every head once (base first, then last), and lockstep rounds pair the base with each head
in turn. Each head gets its own verdicts, pairing record (``<first run id>-head<i>.json``) and exit
code; ab exits with the worst (a regression, then inconclusive, then nothing to compare).

Exit codes: 0 no regression (or the same code on both sides), 1 a regression, 2 nothing to compare
(a ref git cannot resolve, no case measured on both sides), 3 inconclusive: no regression found, but
the budget ended before every required metric had a verdict (run again with a larger
``--time-budget``, or narrow ``--select``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from optbench.gate.ratio import (
    INCONCLUSIVE,
    REGRESSION,
    Ratio,
    paired_ratio,
    ratio,
    replicated_ratio,
)
from optbench.measure.lockstep import ENV as LOCKSTEP_ENV
from optbench.measure.lockstep import Partner
from optbench.run import worktree
from optbench.run.runner import measured_commit
from optbench.store.records import (
    CASE_PEAK,
    CASE_RESIDENT,
    EARLIER_METER,
    OK,
    SKIPPED,
    Record,
    metric_label,
)
from optbench.store.settings import VARIABLES, Settings, process_env
from optbench.store.store import (
    MACHINE_KEY,
    REPO_ROOT,
    ResultStore,
    new_run_id,
    read_records,
    write_json_atomic,
)
from optbench.suite import catalog
from optbench.suite.grids import PROCESSES
from optbench.suite.shard import pattern

EXIT_OK, EXIT_REGRESSION, EXIT_NOTHING, EXIT_INCONCLUSIVE = 0, 1, 2, 3
PAIRING_DIR = "ab"  # results/<machine>/ab/: each call's pairing record, one per head
# A peak memory whose runs on each side agree within this share of its class's threshold is judged
# by its extreme ratios, not a rank test (which bounds nothing from 2 runs against 2)
REPLICATED_SHARE = 0.1
# the fewest lockstep rounds whose exact signed-rank test reaches 5% two-sided
LOCKSTEP_MIN_ROUNDS = 6
# a side's code has lockstep where its tree holds one of these: today's path, or that of the commits
# before optbench/core/ was split into rooms (ab measures those in their own worktrees)
LOCKSTEP_MODULES = ("optbench/measure/lockstep.py", "optbench/core/lockstep.py")
# a side's code reuses an earlier round's check where its settings name this variable
CHECKED_IN_VARIABLE = VARIABLES["checked_in"]
# the clock of a case-memory series measured in a round that ran the case's check, where checks are
# reused (:func:`memory_of_reused_rounds` decides which rounds judge it)
CHECKED_ROUND = "checked"
# A grid process of a round, in its side's worktree. Once its records are stored it leaves without
# the interpreter's teardown (inductor's compile workers, the CUDA context: 1-3 s a process), which
# no figure of the round depends on; an error still ends it as Python does.
GRID_ENTRY = (
    "import os, sys; "
    "from optbench.suite.grids import PROCESSES, measure_suite; "
    "measure_suite(kinds=PROCESSES[{!r}]); "
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(0)"
)


class Series(NamedTuple):
    """One judged metric of one case: a time by its clock, peak memory, or compile seconds."""

    key: str
    metric: str
    quantity: str  # 'time', 'peak memory' or 'compile'
    clock: str  # of a time; '' otherwise


@dataclass
class Side:
    """One commit of the comparison: its code commit, its worktree, and its rounds' runs (run
    ids)."""

    label: str  # 'base' or 'head'
    ref: str
    commit: str
    tree: Path | None = None
    runs: list[str] = field(default_factory=list)
    # run id -> the cases that passed their check in that run of this side, or were skipped there
    checked: dict[str, set[str]] = field(default_factory=dict)
    # every case key a run of this side stored (a selected case its code lacks is never stored)
    stored: set[str] = field(default_factory=set)

    def checked_in(self, keys: Iterable[str]) -> str | None:
        """The first run of this side in which every case of ``keys`` that its code has passed its
        check or was skipped, or None (none yet)."""
        need = {key for key in keys if key in self.stored}
        return (
            next((run for run, passed in self.checked.items() if need <= passed), None)
            if need
            else None
        )


def resolve(ref: str, root: Path = REPO_ROOT) -> str:
    """The commit whose code ``ref`` holds (``optbench.run.runner.measured_commit``); ValueError
    naming the ref where git cannot resolve it."""
    try:
        commit = measured_commit(ref, cwd=root)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ValueError(f"git cannot resolve {ref!r} in {root}") from exc
    if not commit:
        raise ValueError(f"git cannot resolve {ref!r} in {root}")
    return commit


def add_worktree(commit: str, root: Path = REPO_ROOT) -> Path:
    """A fresh detached worktree of ``commit``'s code under ``.cache/ab/`` (one left by an earlier
    job is replaced; :mod:`optbench.run.worktree`)."""
    return worktree.add(root / ".cache" / "ab" / commit[:12], commit, root)


def remove_worktree(tree: Path, root: Path = REPO_ROOT) -> None:
    worktree.remove(tree, root)


def planned(suite: str, select: str | None) -> dict[str, list[str]]:
    """The selected cases of ``suite`` by grid process ('steps', 'other'): what each round
    measures."""
    from optbench.run.progress import planned_cases

    groups: dict[str, list[str]] = defaultdict(list)
    for key in planned_cases(catalog.BENCHMARKS.values(), suite, select):
        kind = catalog.kind(key.split("|")[0])
        groups[next(g for g, kinds in PROCESSES.items() if kind in kinds)].append(key)
    return dict(groups)


def case_of(key: str) -> tuple[str, dict[str, str]]:
    """(benchmark, params) of a record key ('bench_step.Step100M|variant=eager')."""
    benchmark, *rest = key.split("|")
    return benchmark, dict(p.split("=", 1) for p in rest)


def grid_env(
    side: Side, settings: Settings, run_id: str, keys: list[str], checked_in: str | None = None
) -> dict[str, str]:
    """The environment of a grid process of ``side`` that measures exactly the cases ``keys`` as
    part of run ``run_id`` of its commit; with ``checked_in`` (an earlier run of the side that
    checked them all) its cases skip their checks (``Settings.checked_in``), without it they check,
    whatever the caller's environment says (:func:`optbench.store.settings.process_env`)."""
    assert side.tree is not None
    return process_env(
        dataclasses.replace(
            settings,
            run_id=run_id,
            asv_commit=side.commit,
            select=pattern(keys),
            checked_in=checked_in,
        ),
        side.tree,
        REPO_ROOT / ".cache",
    )


def run_round(
    side: Side,
    settings: Settings,
    groups: dict[str, list[str]],
    logs: Path,
    checked: Mapping[str, str | None] | None = None,
) -> tuple[str, float, int]:
    """One round of ``side``: each grid process of ``groups`` in turn, fresh, in the side's
    worktree, measuring exactly that group's cases, as one run of its commit (a group's cases
    reusing the checks of run ``checked[group]`` where given). Returns the run id, the seconds it
    took and the worst exit code of its processes (their output is in ``logs/<run id>.log``)."""
    assert side.tree is not None
    run_id = new_run_id()
    logs.mkdir(parents=True, exist_ok=True)
    started, worst = time.perf_counter(), 0
    with open(logs / f"{run_id}.log", "w") as log:
        for group, keys in groups.items():
            code = subprocess.run(
                [sys.executable, "-c", GRID_ENTRY.format(group)],
                cwd=side.tree,
                env=grid_env(side, settings, run_id, keys, (checked or {}).get(group)),
                stdout=log,
                stderr=subprocess.STDOUT,
            ).returncode
            worst = max(worst, code)
    side.runs.append(run_id)
    return run_id, time.perf_counter() - started, worst


def host_bound(key: str) -> bool:
    """Whether case ``key``'s step is host-bound (a one-process training step, ours or the
    anchor's, below 1B and replaying no CUDA graph): ab times such a case in lockstep pairs where
    both commits' code can. A multi-GPU step's ranks are processes of their own: never."""
    benchmark, params = case_of(key)
    return catalog.kind(benchmark) in ("step", "anchor") and (
        catalog.metric_class(benchmark, params, "time", "wall", "step") == "host-bound"
    )


def split_lockstep(
    groups: dict[str, list[str]], trees: Iterable[Path]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(the cases timed in ABBA rounds, the host-bound cases timed in lockstep rounds) by grid
    process; none in lockstep where a side's code predates it (none of :data:`LOCKSTEP_MODULES`)."""
    if not all(any((tree / m).exists() for m in LOCKSTEP_MODULES) for tree in trees):
        return groups, {}
    split: tuple[dict[str, list[str]], dict[str, list[str]]] = ({}, {})
    for group, keys in groups.items():
        for lockstep in (False, True):
            chosen = [k for k in keys if host_bound(k) == lockstep]
            if chosen:
                split[lockstep][group] = chosen
    return split


def lockstep_cpus() -> list[int]:
    """The CPUs lockstep rounds take in turn: this process's, but the first (where the kernel
    handles most interrupts) where there are others."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    return cpus[1:] or cpus


def run_lockstep_round(
    sides: dict[str, Side],
    settings: Settings,
    groups: dict[str, list[str]],
    logs: Path,
    cpu: int,
    base_first: bool,
    checked: Mapping[str, Mapping[str, str | None]] | None = None,
) -> tuple[dict[str, str], float, int]:
    """One lockstep round: for each grid process of ``groups``, both sides' processes at once, each
    in its worktree, timing the same cases in turns on ``cpu`` (:mod:`optbench.measure.lockstep`),
    the base first where ``base_first``; a side's group reuses the checks of run
    ``checked[side][group]`` where given. Each side's processes make one run of its commit. Returns
    the run ids by side, the seconds it took and the worst exit code (logs in
    ``logs/<run id>.log``)."""
    ids = {label: new_run_id() for label in sides}
    logs.mkdir(parents=True, exist_ok=True)
    started, worst = time.perf_counter(), 0
    for group, keys in groups.items():
        base_read, head_write = os.pipe()
        head_read, base_write = os.pipe()
        ends = {"base": (base_read, base_write), "head": (head_read, head_write)}
        running = []
        for label, side in sides.items():
            env = grid_env(
                side, settings, ids[label], keys, (checked or {}).get(label, {}).get(group)
            )
            first = (label == "base") == base_first
            env[LOCKSTEP_ENV] = Partner.env_value(*ends[label], first, cpu)
            log = open(logs / f"{ids[label]}.log", "a")  # noqa: SIM115 - closed below
            running.append(
                (
                    subprocess.Popen(
                        [sys.executable, "-c", GRID_ENTRY.format(group)],
                        cwd=side.tree,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        pass_fds=ends[label],
                    ),
                    log,
                )
            )
        for fd in (base_read, base_write, head_read, head_write):
            os.close(fd)  # each process holds its own ends: one that ends closes them
        for process, log in running:
            worst = max(worst, process.wait())
            log.close()
    for label, side in sides.items():
        side.runs.append(ids[label])
    return ids, time.perf_counter() - started, worst


def find_run(store: ResultStore, commit: str, run_id: str) -> tuple[str, dict[str, dict]] | None:
    """(machine, records) of the stored run ``run_id`` of ``commit``, wherever its processes stored
    it (the machine folder they named), read from its file."""
    for machine in store.machines():
        path = store.path(machine, commit, run_id)
        if path.exists():
            return machine, read_records(path)
    return None


def values(records: dict[str, dict]) -> tuple[dict[Series, float], dict[str, str]]:
    """The judged values of one run's records (times of gated clocks, peak memory, compile seconds:
    positive values only) and every case's status."""
    found: dict[Series, float] = {}
    statuses = {}
    for key, data in records.items():
        if key.startswith("__"):
            continue
        rec = Record.of(data)
        statuses[key] = rec.status
        if not rec.ok:
            continue
        for metric in rec.metrics:
            for clock in rec.clocks(metric):
                t = rec.timing(metric, clock)
                if (
                    t
                    and t.median_ms > 0
                    and catalog.metric_class(rec.benchmark, rec.params, "time", clock, metric)
                ):
                    found[Series(key, metric, "time", clock)] = t.median_ms
        for metric, peak in rec.peaks().items():
            if peak > 0:
                found[Series(key, metric, "peak memory", "")] = peak
        if rec.compile_seconds:
            found[Series(key, "compile", "compile", "")] = rec.compile_seconds
    return found, statuses


def meters_differ(base: list[dict[Series, float]], head: list[dict[Series, float]]) -> bool:
    """Whether one side's rounds measured case memory by an earlier meter and the other's by the
    current one (``records.EARLIER_METER`` against ``CASE_PEAK``): then neither is judged."""

    def names(runs: list[dict[Series, float]]) -> set[str]:
        return {s.metric for run in runs for s in run if s.quantity == "peak memory"}

    earlier, current = set(EARLIER_METER), {CASE_PEAK, CASE_RESIDENT}
    b, h = names(base), names(head)
    return bool((b & earlier and h & current) or (b & current and h & earlier))


def reuses_checks(tree: Path) -> bool:
    """Whether the code in ``tree`` can reuse an earlier round's check (``Settings.checked_in``)."""
    settings = tree / "optbench/store/settings.py"
    return settings.exists() and CHECKED_IN_VARIABLE in settings.read_text(errors="replace")


def mark_memory_of_checks(
    measured: dict[Series, float], records: dict[str, dict]
) -> dict[Series, float]:
    """``measured`` with the case memory of the cases that ran their check in this round (no
    ``checked_in``) under the clock :data:`CHECKED_ROUND`, for :func:`memory_of_reused_rounds`."""
    checked = {key for key, data in records.items() if "checked_in" not in data}
    return {
        (
            s._replace(clock=CHECKED_ROUND)
            if s.quantity == "peak memory" and s.key in checked
            else s
        ): x
        for s, x in measured.items()
    }


def memory_of_reused_rounds(
    base: list[dict[Series, float]], head: list[dict[Series, float]]
) -> tuple[list[dict[Series, float]], list[dict[Series, float]]]:
    """Both sides' runs with each case-memory series of :func:`mark_memory_of_checks`' rounds
    settled: left out where both sides have rounds that reused the case's check (a process that
    checked holds more), else judged with the rest (a case whose code never reuses its check)."""

    def reused(runs: list[dict[Series, float]]) -> set[tuple[str, str]]:
        return {
            (s.key, s.metric)
            for run in runs
            for s in run
            if s.quantity == "peak memory" and s.clock != CHECKED_ROUND
        }

    both = reused(base) & reused(head)

    def settle(runs: list[dict[Series, float]]) -> list[dict[Series, float]]:
        return [
            {
                (s._replace(clock="") if s.clock == CHECKED_ROUND else s): x
                for s, x in run.items()
                if s.clock != CHECKED_ROUND or (s.key, s.metric) not in both
            }
            for run in runs
        ]

    return settle(base), settle(head)


def without_compile(measured: dict[Series, float]) -> dict[Series, float]:
    """``measured`` less its compile seconds: what a side's first round is judged on, whose
    processes filled the compile caches that its later rounds read."""
    return {s: x for s, x in measured.items() if s.quantity != "compile"}


def paired_samples(records: dict[str, dict]) -> dict[Series, tuple[float, ...]]:
    """The samples of each host-bound time series of one lockstep run whose pairing held."""
    found: dict[Series, tuple[float, ...]] = {}
    for key, data in records.items():
        if key.startswith("__"):
            continue
        rec, held = Record.of(data), data.get("lockstep") or {}
        if not rec.ok:
            continue
        for metric in rec.metrics:
            if not (held.get(metric) or {}).get("paired"):
                continue
            for clock in rec.clocks(metric):
                t = rec.timing(metric, clock)
                klass = catalog.metric_class(rec.benchmark, rec.params, "time", clock, metric)
                if t and t.samples_ms and klass == "host-bound":
                    found[Series(key, metric, "time", clock)] = t.samples_ms
    return found


def shift(base: tuple[float, ...], head: tuple[float, ...]) -> float | None:
    """A lockstep round's log shift of head over base: the median of ``log(head_i / base_i)``
    over its paired samples (taken one after the other); None where none pair."""
    logs = [math.log(h / b) for b, h in zip(base, head) if b > 0 and h > 0]
    return statistics.median(logs) if logs else None


@dataclass(frozen=True)
class Verdict:
    """The judgement of one series over the judged rounds."""

    series: Series
    klass: str
    threshold: float
    base: tuple[float, ...]
    head: tuple[float, ...]
    ratio: Ratio
    paired: bool = False  # judged from lockstep rounds' paired samples

    @property
    def verdict(self) -> str:
        return self.ratio.verdict(self.threshold)


def judge(
    base: list[dict[Series, float]], head: list[dict[Series, float]], confidence: float
) -> list[Verdict]:
    """A verdict for every series that judged rounds of both sides measured, over the rounds that
    measured it (a case not ok in a round has none there; a first round's compile seconds are left
    out); a peak memory that each side gave alike in every round, within REPLICATED_SHARE of its
    threshold, is bounded by its extreme ratios (:func:`optbench.gate.ratio.replicated_ratio`)."""
    out = []
    for series in sorted(set().union(*base) & set().union(*head)):
        benchmark, params = case_of(series.key)
        klass = catalog.metric_class(
            benchmark, params, series.quantity, series.clock, series.metric
        )
        if klass is None:
            continue
        b = tuple(run[series] for run in base if series in run)
        h = tuple(run[series] for run in head if series in run)
        threshold = catalog.GATE_THRESHOLDS[klass]
        exact = (
            replicated_ratio(b, h, threshold * REPLICATED_SHARE)
            if series.quantity == "peak memory"
            else None
        )
        out.append(Verdict(series, klass, threshold, b, h, exact or ratio(b, h, confidence)))
    return out


def judge_paired(
    rounds: list[tuple[dict[Series, tuple[float, ...]], dict[Series, tuple[float, ...]]]],
    confidence: float,
) -> list[Verdict]:
    """A verdict for every host-bound series that a lockstep round paired on both sides, over the
    rounds that paired it: the rounds' shifts (:func:`shift`) through
    :func:`optbench.gate.ratio.paired_ratio` (fewer than 6 leave it unbounded, so inconclusive);
    its base and head values are those rounds' medians."""
    out = []
    for series in sorted(set().union(*(set(b) & set(h) for b, h in rounds))):
        used = [(b[series], h[series]) for b, h in rounds if series in b and series in h]
        shifts = [s for s in (shift(b, h) for b, h in used) if s is not None]
        if not shifts:
            continue
        benchmark, params = case_of(series.key)
        klass = catalog.metric_class(benchmark, params, "time", series.clock, series.metric)
        assert klass is not None
        out.append(
            Verdict(
                series,
                klass,
                catalog.GATE_THRESHOLDS[klass],
                tuple(statistics.median(b) for b, _ in used),
                tuple(statistics.median(h) for _, h in used),
                paired_ratio(shifts, confidence),
                paired=True,
            )
        )
    return out


def unpaired(records: dict[str, dict]) -> list[str]:
    """'<case> <metric>' of each timing of a lockstep run that was not taken in turns (its partner
    left, disagreed or never came)."""
    return sorted(
        f"{key} {metric}"
        for key, data in records.items()
        if not key.startswith("__")
        for metric, held in (data.get("lockstep") or {}).items()
        if not held.get("paired")
    )


def status_regressions(base: list[dict[str, str]], head: list[dict[str, str]]) -> list[str]:
    """Cases ok in every base round that failed (any status but ok or skipped) in a head round."""
    keys = set().union(*base) if base else set()
    return sorted(
        k
        for k in keys
        if all(r.get(k) == OK for r in base)
        and any(r.get(k, OK) not in (OK, SKIPPED) for r in head)
    )


def undecided(verdicts: Iterable[Verdict], required: Iterable[str]) -> list[Verdict]:
    """The inconclusive verdicts of the metric classes ``required``; a host-bound one only where it
    was paired (one measured in fresh processes moves by tens of percent between them, and a
    graphed step's forward is such a one)."""
    classes = set(required)
    return [
        v
        for v in verdicts
        if v.klass in classes
        and v.verdict == INCONCLUSIVE
        and (v.paired or v.klass != "host-bound")
    ]


def required_classes(required: Iterable[str]) -> str:
    """The classes :func:`undecided` holds to, as the console names them: a host-bound metric only
    where it was timed in lockstep (paired)."""
    return ", ".join(
        "host-bound in lockstep rounds" if klass == "host-bound" else klass for klass in required
    )


def order(pairs: int) -> list[str]:
    """ABBA order of ``pairs`` pairs of rounds: base, head, head, base, base, head, ..."""
    return [
        side
        for i in range(pairs)
        for side in (("base", "head") if i % 2 == 0 else ("head", "base"))
    ]


def _finite(x: float) -> float | None:
    """``x``, or None (JSON's null) for an unbounded end of an interval."""
    return x if math.isfinite(x) else None


def _fmt(v: Verdict) -> tuple[str, ...]:
    """Table cells of a verdict: each side's median (memory in MiB, or GiB from 1 GiB on, that no
    figure reads in powers of ten), head/base with its interval, or ``unbounded`` where neither
    end is bounded (too few runs: the estimate alone could even point the other way from the
    medians), the runs a side and the verdict."""
    mid = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    if v.series.quantity == "peak memory":
        gib = mid(v.base) >= 2**30
        scale, unit = (2**30, "GiB") if gib else (2**20, "MiB")
    else:
        scale, unit = 1.0, "s" if v.series.quantity == "compile" else "ms"
    r = v.ratio
    unbounded = r.low <= 0 and math.isinf(r.high)
    return (
        v.series.key,
        metric_label(v.series.metric, v.series.quantity, v.series.clock),
        f"{v.klass} {v.threshold:.0%}",
        f"{mid(v.base) / scale:.4g} {unit}",
        f"{mid(v.head) / scale:.4g} {unit}",
        "unbounded" if unbounded else f"{r.estimate:.3f}x [{r.low:.3f}, {r.high:.3f}]",
        f"{r.n_base}/{r.n_head}",
        v.verdict,
    )


@dataclass(frozen=True)
class Options:
    """What an A/B comparison measures and how long it may take (``optbench ab --help``)."""

    suite: str = catalog.GATE_SUITE
    select: str | None = catalog.GATE_SELECT
    time_budget: float = 540.0
    min_rounds: int = 4
    max_rounds: int = 12
    warmup: int = 0
    confidence: float = 0.95
    results: Path | None = None
    require: tuple[str, ...] = ("device-bound", "memory", "host-bound")


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of :class:`Options` on a command line (``ab`` and ``bisect`` share them)."""
    p.add_argument(
        "--suite",
        default=catalog.GATE_SUITE,
        choices=list(catalog.SUITES),
        help=f"the suite whose cases are measured (default {catalog.GATE_SUITE})",
    )
    p.add_argument(
        "--select",
        default=catalog.GATE_SELECT,
        help="regex on case keys: measure only those, the same on both sides (default: the "
        "catalog's GATE_SELECT, a kernel and the 100M and 1B best-kernels steps)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=540.0,
        metavar="SECONDS",
        help="no pair of rounds starts that would end after SECONDS (default 540)",
    )
    p.add_argument(
        "--min-rounds", type=int, default=4, help="judged rounds a side before stopping (default 4)"
    )
    p.add_argument(
        "--max-rounds", type=int, default=12, help="judged rounds a side at most (default 12)"
    )
    p.add_argument(
        "--warmup", type=int, default=0, help="pairs of rounds not judged at all (default 0)"
    )
    p.add_argument("--confidence", type=float, default=0.95, help="of each interval (default 0.95)")
    p.add_argument("--results", type=Path, help="results root (default results/)")
    p.add_argument(
        "--require",
        action="append",
        choices=list(catalog.GATE_THRESHOLDS),
        help="a metric class that must be decided (repeatable; default device-bound, memory and "
        "host-bound, the last where timed in lockstep)",
    )


def options_of(p: argparse.ArgumentParser, args: argparse.Namespace) -> Options:
    """The :class:`Options` of parsed arguments (a bad ``--select`` is a usage error)."""
    if args.select:
        try:
            re.compile(args.select)
        except re.error as exc:
            p.error(f"--select {args.select!r} is not a regular expression: {exc}")
    return Options(
        args.suite,
        args.select,
        args.time_budget,
        args.min_rounds,
        args.max_rounds,
        args.warmup,
        args.confidence,
        args.results,
        tuple(args.require or Options.require),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="optbench ab",
        description=__doc__.split("\n\n")[0],
        epilog="Exit codes: 0 no regression, 1 a regression, 2 nothing to compare, "
        "3 inconclusive (the budget ended first); with several heads, the worst of theirs.",
    )
    p.add_argument("base", help="base commit-ish")
    p.add_argument(
        "heads",
        nargs="+",
        metavar="head",
        help="head commit-ish; with several, each is compared with the base, whose rounds they "
        "share",
    )
    add_options(p)
    args = p.parse_args(argv)
    return ab(args.base, args.heads, options_of(p, args))


def ab(base_ref: str, head_refs: str | Sequence[str], options: Options) -> int:
    """Compare each of ``head_refs`` (one ref, or several sharing the base's rounds) with
    ``base_ref`` here (module docstring); the exit code, the worst of the heads' with several
    (a regression, then inconclusive)."""
    started = time.monotonic()
    head_refs = [head_refs] if isinstance(head_refs, str) else list(head_refs)
    try:
        base = Side("base", base_ref, resolve(base_ref))
        commits = {ref: resolve(ref) for ref in head_refs}
    except ValueError as exc:
        print(f"optbench ab: {exc}", file=sys.stderr)
        return EXIT_NOTHING
    for ref in [r for r, commit in commits.items() if commit == base.commit]:
        print(
            f"optbench ab: {base_ref} and {ref} hold the same code ({base.commit[:12]}): "
            "nothing can have slowed down"
        )
        del commits[ref]
    heads = [
        Side("head" if len(commits) == 1 else f"head {i}", ref, commit)
        for i, (ref, commit) in enumerate(commits.items(), 1)
    ]
    if not heads:
        return EXIT_OK
    if len({h.commit for h in heads}) < len(heads):
        print("optbench ab: two heads hold the same code: name each once", file=sys.stderr)
        return EXIT_NOTHING
    groups = planned(options.suite, options.select)
    if not groups:
        print(
            f"optbench ab: no case of the {options.suite!r} suite matches --select "
            f"{options.select!r}",
            file=sys.stderr,
        )
        return EXIT_NOTHING
    options = dataclasses.replace(
        options, results=(options.results or REPO_ROOT / "results").resolve()
    )
    try:
        for side in (base, *heads):
            side.tree = add_worktree(side.commit)
            if "def measure_suite" not in (side.tree / "optbench/suite/grids.py").read_text(
                errors="replace"
            ):
                print(
                    f"optbench ab: {side.ref} ({side.commit[:12]}) predates the grid processes ab "
                    "runs",
                    file=sys.stderr,
                )
                return EXIT_NOTHING
        return _rounds(options, base, heads, groups, started)
    finally:
        for side in (base, *heads):
            if side.tree is not None:
                remove_worktree(side.tree)


@dataclass
class _Evidence:
    """What the rounds measured so far of one head against the base, per design."""

    abba: dict[str, list[dict[Series, float]]] = field(
        default_factory=lambda: {"base": [], "head": []}
    )
    abba_states: dict[str, list[dict[str, str]]] = field(
        default_factory=lambda: {"base": [], "head": []}
    )
    lock: dict[str, list[dict[Series, float]]] = field(
        default_factory=lambda: {"base": [], "head": []}
    )
    lock_states: dict[str, list[dict[str, str]]] = field(
        default_factory=lambda: {"base": [], "head": []}
    )
    paired: list[tuple[dict[Series, tuple[float, ...]], dict[Series, tuple[float, ...]]]] = field(
        default_factory=list
    )
    lockstep_rounds: list[dict] = field(default_factory=list)  # the pairing record's
    rounds: int = 0  # lockstep rounds run, warm-up included

    def verdicts(self, confidence: float) -> tuple[list[Verdict], list[Verdict]]:
        """(the ABBA rounds' verdicts, the lockstep rounds')."""
        lock = judge_paired(self.paired, confidence)
        judged = {v.series for v in lock}
        unpaired = {
            label: [{s: x for s, x in run.items() if s not in judged} for run in runs]
            for label, runs in self.lock.items()
        }
        return (
            judge(*memory_of_reused_rounds(self.abba["base"], self.abba["head"]), confidence),
            judge(*memory_of_reused_rounds(unpaired["base"], unpaired["head"]), confidence) + lock,
        )

    def failed(self) -> list[str]:
        return sorted(
            set(status_regressions(self.abba_states["base"], self.abba_states["head"]))
            | set(status_regressions(self.lock_states["base"], self.lock_states["head"]))
        )


def _rounds(
    args: Options, base: Side, heads: list[Side], groups: dict[str, list[str]], started: float
) -> int:
    """Plan the rounds, run them (ABBA passes and lockstep rounds, each while a head needs it and
    the budget allows), judge and report each head; the worst head's exit code."""
    rounds = _Rounds.plan(args, base, heads, groups)
    while (step := rounds.next_step(started)) is not None:
        run_abba, partner = step
        if run_abba and not rounds.abba_pass():
            return EXIT_NOTHING
        if partner is not None and not rounds.lockstep_round(partner):
            return EXIT_NOTHING
    codes = [_verdict(args, rounds, head, started) for head in heads]
    if len(heads) > 1:
        for head, code in zip(heads, codes):
            print(f"optbench ab: {head.label} {head.ref} ({head.commit[:12]}): exit {code}")
    for code in (EXIT_REGRESSION, EXIT_INCONCLUSIVE, EXIT_NOTHING):
        if code in codes:
            return code
    return EXIT_OK


@dataclass
class _Rounds:
    """The rounds of one ``ab`` call: the cases of each design, what each head's rounds measured so
    far (:class:`_Evidence`), how many ran and how long the longest took."""

    args: Options
    base: Side
    heads: list[Side]
    abba: dict[str, list[str]]  # grid process -> its cases timed in ABBA passes
    lock: dict[str, list[str]]  # grid process -> its host-bound cases timed in lockstep rounds
    settings: Settings
    store: ResultStore
    logs: Path
    cpus: list[int]  # the CPUs lockstep rounds take in turn
    seen: dict[str, _Evidence]  # head label -> its evidence
    machine: str | None = None
    gpus: set = field(default_factory=set)
    pairs: int = 0  # ABBA passes run (every side once), warm-up included
    pair_s: float = 0.0  # the longest ABBA pass
    round_s: float = 0.0  # the longest lockstep round
    base_abba: list[str] = field(default_factory=list)  # the base's ABBA runs, every head's
    # whether later rounds reuse each side's first check: only where every side's code can
    reuse_checks: bool = False

    @classmethod
    def plan(
        cls, args: Options, base: Side, heads: list[Side], groups: dict[str, list[str]]
    ) -> _Rounds:
        """The rounds before the first: the cases of each design (:func:`split_lockstep`), said in
        one line."""
        assert args.results is not None
        logs = REPO_ROOT / ".cache" / "ab" / "logs"
        trees = [s.tree for s in (base, *heads) if s.tree is not None]
        abba, lock = split_lockstep(groups, trees)
        reuse = all(map(reuses_checks, trees))
        print(
            f"optbench ab: base {base.commit[:12]} ({base.ref}), "
            + ", ".join(f"{h.label} {h.commit[:12]} ({h.ref})" for h in heads)
            + f": {sum(map(len, abba.values()))} cases in ABBA rounds, "
            f"{sum(map(len, lock.values()))} host-bound in lockstep rounds; "
            + (
                "checks until each side passed them in a round; "
                if reuse
                else "checks every round; "
            )
            + f"logs in {logs.relative_to(REPO_ROOT)}",
            flush=True,
        )
        return cls(
            args,
            base,
            heads,
            abba,
            lock,
            Settings(suite=args.suite, select=args.select, results=args.results),
            ResultStore(args.results),
            logs,
            lockstep_cpus(),
            {head.label: _Evidence() for head in heads},
            reuse_checks=reuse,
        )

    @property
    def lock_min(self) -> int:
        """The fewest judged lockstep rounds a head's verdicts come from."""
        return max(self.args.min_rounds, LOCKSTEP_MIN_ROUNDS)

    def next_step(self, started: float) -> tuple[bool, Side | None] | None:
        """(whether an ABBA pass runs next, the head whose lockstep round runs next or None), or
        None once no head needs another or the time budget has ended (said on stderr). A design
        runs on until its judged passes or rounds reach ``--min-rounds`` (lockstep: at least
        :data:`LOCKSTEP_MIN_ROUNDS`) and no required verdict is undecided, or ``--max-rounds``."""
        args, seen = self.args, self.seen
        judged_pairs = self.pairs - args.warmup
        so_far = {label: e.verdicts(args.confidence) for label, e in seen.items()}
        need_abba = (
            bool(self.abba)
            and self.pairs < args.warmup + args.max_rounds
            and (
                judged_pairs < args.min_rounds
                or any(undecided(on_abba, args.require) for on_abba, _ in so_far.values())
            )
        )
        # the head whose lockstep rounds go on next: of those that need one, the fewest run
        needing = [
            head
            for head in self.heads
            if bool(self.lock)
            and (e := seen[head.label]).rounds < args.warmup + max(args.max_rounds, self.lock_min)
            and (
                e.rounds - args.warmup < self.lock_min
                or bool(undecided(so_far[head.label][1], args.require))
            )
        ]
        partner = min(needing, key=lambda h: seen[h.label].rounds, default=None)
        need_lock = partner is not None
        if not need_abba and not need_lock:
            return None
        judged_rounds = seen[partner.label].rounds - args.warmup if partner else 0
        # The warm-up and one judged pass or round always run (a verdict needs one); otherwise a
        # pass or round runs where it fits in what is left of the budget, ABBA first.
        elapsed = time.monotonic() - started
        run_abba = need_abba and (
            judged_pairs < 1
            or elapsed + self.pair_s + (self.round_s if need_lock else 0.0) <= args.time_budget
        )
        run_lock = need_lock and (
            judged_rounds < 1
            or elapsed + (self.pair_s if run_abba else 0.0) + self.round_s <= args.time_budget
        )
        if not run_abba and not run_lock:
            _budget_ended(
                args,
                elapsed,
                self.pairs,
                self.pair_s,
                need_abba,
                seen,
                bool(self.lock),
                self.round_s,
            )
            return None
        return run_abba, partner if run_lock else None

    def abba_pass(self) -> bool:
        """One ABBA pass: every side once, in the order of :func:`order`; its judged runs go to
        each head's evidence (the base's to every head's). False where a run stored nothing."""
        kept = "warm-up" if self.pairs < self.args.warmup else "judged"
        pass_started = time.perf_counter()
        sides_in_order = [self.base, *self.heads]
        checked = self.checked_runs(sides_in_order, self.abba)
        for side in sides_in_order if self.pairs % 2 == 0 else sides_in_order[::-1]:
            run_id, seconds, code = run_round(
                side, self.settings, self.abba, self.logs, checked[side.label]
            )
            records = self.stored(side, run_id, code)
            if records is None:
                return False
            measured, statuses = values(records)
            if self.pairs == 0:
                measured = without_compile(measured)
            if self.reuse_checks:
                measured = mark_memory_of_checks(measured, records)
            if side is self.base:
                self.base_abba.append(run_id)
            if kept == "judged":
                for label, evidence in self.seen.items():
                    if side is self.base or side.label == label:
                        role = "base" if side is self.base else "head"
                        evidence.abba[role].append(measured)
                        evidence.abba_states[role].append(statuses)
            _said(f"pair {self.pairs + 1}", side.label, run_id, seconds, kept, statuses)
        self.pairs += 1
        self.pair_s = max(self.pair_s, time.perf_counter() - pass_started)
        return True

    def lockstep_round(self, partner: Side) -> bool:
        """One lockstep round of the base and ``partner`` (:func:`run_lockstep_round`): each CPU
        twice in a row, once with either side first; its judged samples go to ``partner``'s
        evidence, paired where the pairing held. False where a side's run stored nothing."""
        evidence = self.seen[partner.label]
        kept = "warm-up" if evidence.rounds < self.args.warmup else "judged"
        cpu = self.cpus[(evidence.rounds // 2) % len(self.cpus)]
        base_first = evidence.rounds % 2 == 0
        sides = {"base": self.base, "head": partner}
        checked = self.checked_runs(list(sides.values()), self.lock)
        ids, seconds, code = run_lockstep_round(
            sides,
            self.settings,
            self.lock,
            self.logs,
            cpu,
            base_first,
            {role: checked[side.label] for role, side in sides.items()},
        )
        got = {role: self.stored(side, ids[role], code) for role, side in sides.items()}
        if any(records is None for records in got.values()):
            return False
        evidence.lockstep_rounds.append(
            {**ids, "cpu": cpu, "first": "base" if base_first else "head", "kept": kept}
        )
        paired = {}
        for role, records in got.items():
            assert records is not None
            measured, statuses = values(records)
            if evidence.rounds == 0:
                measured = without_compile(measured)
            if self.reuse_checks:
                measured = mark_memory_of_checks(measured, records)
            paired[role] = paired_samples(records)
            for timing in unpaired(records):
                print(
                    f"optbench ab: lockstep round {evidence.rounds + 1}, {sides[role].label}: "
                    f"{timing} was not timed in turns (its partner left, disagreed or never "
                    "came): not judged from this round",
                    file=sys.stderr,
                )
            if kept == "judged":
                evidence.lock[role].append(measured)
                evidence.lock_states[role].append(statuses)
            label = sides[role].label
            _said(
                f"lockstep {evidence.rounds + 1} (CPU {cpu})",
                label,
                ids[role],
                seconds,
                kept,
                statuses,
            )
        if kept == "judged":
            evidence.paired.append((paired["base"], paired["head"]))
        evidence.rounds += 1
        self.round_s = max(self.round_s, seconds)
        return True

    def checked_runs(
        self, sides: list[Side], groups: dict[str, list[str]]
    ) -> dict[str, dict[str, str | None]]:
        """Per side label, per grid process of ``groups``: the run whose checks its cases reuse in
        the next round, where checks are reused and every side of the round has such a run (else
        every side checks, so that no side's memory carries a check the other's lacks)."""
        reuse = {
            group: self.reuse_checks and all(s.checked_in(keys) is not None for s in sides)
            for group, keys in groups.items()
        }
        return {
            s.label: {g: s.checked_in(keys) if reuse[g] else None for g, keys in groups.items()}
            for s in sides
        }

    def stored(self, side: Side, run_id: str, code: int) -> dict[str, dict] | None:
        """The records run ``run_id`` of ``side`` stored (its machine and GPU noted), or None,
        said on stderr with its log, where it stored none."""
        found = find_run(self.store, side.commit, run_id)
        if found is None:
            print(
                f"optbench ab: a run of {side.label} stored nothing (exit {code}); its log: "
                f"{(self.logs / f'{run_id}.log').relative_to(REPO_ROOT)}",
                file=sys.stderr,
            )
            return None
        self.machine, records = found
        self.gpus.add(records.get(MACHINE_KEY, {}).get("info", {}).get("gpu_uuid"))
        for key, data in records.items():
            if key.startswith("__"):
                continue
            side.stored.add(key)
            rec = Record.of(data)
            if self.reuse_checks and (rec.skipped or rec.ok and "checked_in" not in data):
                side.checked.setdefault(run_id, set()).add(key)
        return records


def _said(what: str, label: str, run_id: str, seconds: float, kept: str, statuses) -> None:
    """One line of a finished run: its cases, seconds, whether judged, and those not ok."""
    bad = sorted(k for k, s in statuses.items() if s != OK)
    print(
        f"  {what} {label:4s} run {run_id}: {len(statuses)} cases in {seconds:.0f} s "
        f"({kept})" + (f"; not ok: {', '.join(bad)}" if bad else ""),
        flush=True,
    )


def _budget_ended(
    args: Options,
    elapsed: float,
    pairs: int,
    pair_s: float,
    need_abba: bool,
    seen: dict[str, _Evidence],
    lockstep: bool,
    round_s: float,
) -> None:
    """Say which design the time budget left short of its minimum, and what budget would reach
    it."""

    def say(done: int, minimum: int, unit: str, took: float, left: int) -> None:
        print(
            f"optbench ab: the time budget ends after {done} judged {unit}, short of the "
            f"{minimum} they need (--min-rounds {args.min_rounds}; {unit} take about {took:.0f} "
            f"s): about --time-budget {elapsed + left * took:.0f} would reach it",
            file=sys.stderr,
        )

    judged_pairs = pairs - args.warmup
    if need_abba and judged_pairs < args.min_rounds:
        say(judged_pairs, args.min_rounds, "ABBA pairs", pair_s, args.min_rounds - judged_pairs)
    lock_min = max(args.min_rounds, LOCKSTEP_MIN_ROUNDS)
    rounds_left = sum(max(0, lock_min - (e.rounds - args.warmup)) for e in seen.values())
    if lockstep and rounds_left:
        judged_rounds = min(e.rounds for e in seen.values()) - args.warmup
        say(judged_rounds, lock_min, "lockstep rounds", round_s, rounds_left)


def _verdict(args: Options, rounds: _Rounds, head: Side, started: float) -> int:
    """Judge ``head`` against the base from its rounds, report its verdicts, store its pairing
    record, and return its exit code."""
    evidence = rounds.seen[head.label]
    on_abba, on_lock = evidence.verdicts(args.confidence)
    verdicts, failed = on_abba + on_lock, evidence.failed()
    if not verdicts and not failed:
        print(
            f"optbench ab: {head.label}: nothing to compare: no metric was measured in judged "
            "rounds of both sides",
            file=sys.stderr,
        )
        return EXIT_NOTHING
    _show_verdicts(rounds.machine, head, verdicts, failed)
    sides = {role: evidence.abba[role] + evidence.lock[role] for role in ("base", "head")}
    if meters_differ(sides["base"], sides["head"]):
        print(
            f"optbench ab: {head.label}: the case memory of the steps is not compared: the two "
            "sides' case meters differ (optbench.store.records.CASE_METER; an earlier meter's "
            "figures depended on the cases before them)",
            file=sys.stderr,
        )
    regressions = [v for v in verdicts if v.verdict == REGRESSION]
    required = undecided(verdicts, args.require)
    code = EXIT_REGRESSION if regressions or failed else EXIT_INCONCLUSIVE if required else EXIT_OK
    record = _pairing_record(args, rounds, head, verdicts, failed, code, started)
    base = rounds.base
    name = base.runs[0] if head.label == "head" else f"{base.runs[0]}-{head.label.replace(' ', '')}"
    assert args.results is not None
    results = args.results
    pairing = results / str(rounds.machine) / PAIRING_DIR / f"{name}.json"
    write_json_atomic(pairing, record)
    found = len(regressions) + len(failed)
    outcome = {
        EXIT_REGRESSION: f"{found} REGRESSION{'S' if found != 1 else ''}",
        EXIT_INCONCLUSIVE: "INCONCLUSIVE (run again with a larger --time-budget or --max-rounds)",
        EXIT_OK: "no regression",
    }[code]
    print(  # the outcome first: the line a CI log is read by
        f"optbench ab: {head.label + ': ' if head.label != 'head' else ''}{outcome}; "
        f"{sum(v.verdict == INCONCLUSIVE for v in verdicts)} of {len(verdicts)} metrics "
        f"inconclusive, {len(required) or 'none'} of them required "
        f"({required_classes(args.require)}); {max(0, rounds.pairs - args.warmup)} judged ABBA "
        f"pairs, {max(0, evidence.rounds - args.warmup)} judged lockstep rounds, "
        f"{record['seconds']:.0f} s on {', '.join(record['gpu_uuids']) or 'no GPU'}; pairing in "
        f"{pairing.relative_to(results.parent) if results.parent in pairing.parents else pairing}"
    )
    return code


def _show_verdicts(
    machine: str | None, head: Side, verdicts: list[Verdict], failed: list[str]
) -> None:
    """The table of ``head``'s verdicts, then a line per case ok at base that fails at head."""
    from optbench.run.console import console, table

    marks = [v.verdict.upper() if v.verdict == REGRESSION else v.verdict for v in verdicts]
    console().print(
        table(
            ("case", "metric", "class", "base", "head", "head/base [interval]", "runs", "verdict"),
            [_fmt(v) for v in verdicts],
            title=f"{machine}: ab" + ("" if head.label == "head" else f", {head.label} {head.ref}"),
            marks=marks,
        )
    )
    for key in failed:
        print(f"REGRESSION: {key} is ok at base and fails at {head.label}")


def _pairing_record(
    args: Options,
    rounds: _Rounds,
    head: Side,
    verdicts: list[Verdict],
    failed: list[str],
    code: int,
    started: float,
) -> dict:
    """What ``head``'s pairing record stores: both sides' runs, the rounds' order and lockstep
    rounds, whether later rounds reused each side's first check, the GPUs, the options, the exit
    code and every verdict."""
    base, evidence = rounds.base, rounds.seen[head.label]
    ours = {r["base"] for r in evidence.lockstep_rounds}  # not another head's lockstep partners
    return {
        "base": {
            "ref": base.ref,
            "commit": base.commit,
            "runs": [r for r in base.runs if r in ours or r in rounds.base_abba],
        },
        "head": {"ref": head.ref, "commit": head.commit, "runs": head.runs},
        "order": order(rounds.pairs),
        "warmup_pairs": args.warmup,
        "checks_reused": rounds.reuse_checks,
        "lockstep_rounds": evidence.lockstep_rounds,
        "gpu_uuids": sorted(filter(None, rounds.gpus)),
        "suite": args.suite,
        "select": args.select,
        "confidence": args.confidence,
        "exit": code,
        "seconds": round(time.monotonic() - started, 1),
        "required": list(args.require),
        "verdicts": [_verdict_fields(v) for v in verdicts],
        "failed_at_head": failed,
    }


def _verdict_fields(v: Verdict) -> dict:
    """One verdict as its pairing record stores it."""
    return {
        "key": v.series.key,
        "metric": v.series.metric,
        "quantity": v.series.quantity,
        "clock": v.series.clock,
        "class": v.klass,
        "threshold": v.threshold,
        "paired": v.paired,
        "base": v.base,
        "head": v.head,
        "ratio": v.ratio.estimate,
        "low": _finite(v.ratio.low),
        "high": _finite(v.ratio.high),
        "verdict": v.verdict,
    }


if __name__ == "__main__":
    sys.exit(main())
