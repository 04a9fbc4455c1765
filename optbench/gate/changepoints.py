"""Change points of one metric over commits: where its level moved, one GPU (or CPU machine) at a
time.

Input: one metric's runs in commit order, each run's median with the unit it ran on
(:func:`unit_of`). Lent machines of one kind differ by more than many changes worth finding, so a
series never mixes units: each unit's commits form a series of their own, and a change point names
its unit. Each commit of a unit's series is the median of that unit's run medians there, weighted by
their number.

The detection is asv's step detection (``asv.step_detect.detect_steps``, imported lazily): a
piecewise-constant fit of the series minimising the L1 error plus a penalty per segment, chosen by
asv's information criterion (its default beta, 4 ln(n) / n per segment). Each boundary between two
fitted segments is a candidate, kept where it passes asv's own rule for a regression
(``asv.step_detect.detect_regressions``), applied here in both directions: the step between the
segments' medians exceeds the L1 error estimate of either segment (the mean absolute deviation of
its commits from its median) and ``min_magnitude`` of the level before. asv gives no p-value; the
significance reported is that step over the larger of the two error estimates (infinite where both
segments are flat): above 1 by construction, larger is clearer.

A change point lies between the last commit of the segment before (``before``) and the first commit
of the segment after (``after``) in its unit's series: commits between them in the machine's order
ran on other units or not at all, so the change lies somewhere in that range. ``ratio`` is the
segment medians after / before.

This module needs no torch.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Commits a unit's series needs before it is searched. On synthetic flat series with 3% Gaussian
# noise, asv's step detection plus the rule above reports a step in 10% of 6-commit series and in
# 0.4% of 8-commit ones.
MIN_COMMITS = 8
# The smallest move reported, after / before - 1 either way: the gate's smallest threshold on a time
# (the device-bound class of optbench.suite.catalog.GATE_THRESHOLDS); a smaller step would fail no
# comparison either.
MIN_MAGNITUDE = 0.03


@dataclass(frozen=True)
class RunMedian:
    """One run's median of the metric (ms) and the unit it ran on (:func:`unit_of`)."""

    unit: str
    median: float


@dataclass(frozen=True)
class ChangePoint:
    """A move of one metric's level on one unit: between commits ``before`` and ``after``
    (``index``: the position of ``after`` in the unit's series), ``ratio`` = segment median after /
    before, ``significance`` = the step over the larger L1 error estimate of the two segments (see
    the module docstring)."""

    unit: str
    before: str
    after: str
    index: int
    ratio: float
    significance: float


def at_once(info: Mapping[str, Any]) -> int:
    """How many runs measured on the host at once, from a run's ``__machine__`` record's info
    (``runs_at_once``, written by ``run --gpus``); 1 where it says nothing."""
    return int(info.get("runs_at_once") or 1)


def gpu_unit(info: Mapping[str, Any]) -> str | None:
    """The GPU a run measured on, from its ``__machine__`` record's info: the GPU's UUID, and where
    several runs measured on its host at once (``runs_at_once``: the shards of ``run --gpus``,
    whose host-bound steps slow while the others launch and compile on the shared CPUs) their
    number too, as another unit: such figures never sit in one series with the GPU's own. None
    where the run recorded no UUID."""
    if not info.get("gpu_uuid"):
        return None
    return _with_runs_at_once(str(info["gpu_uuid"]), info)


CPU_UNIT = "host "  # how a CPU machine's unit (cpu_unit) begins; a GPU's is its UUID


def cpu_unit(info: Mapping[str, Any]) -> str | None:
    """The CPU machine a run without a GPU measured on, from its ``__machine__`` record's info: its
    host id and CPU model (what its machine name, ``cpu-<model>-<host id>``, holds), e.g. 'host
    003596 (AMD EPYC 7B13)', with the runs at once as :func:`gpu_unit` counts them; None for a GPU
    run, or a run that recorded no host id (which host it ran on is unknown)."""
    if info.get("gpu_name") or not info.get("host_id"):
        return None
    cpu = info.get("cpu") or "unknown CPU"
    return _with_runs_at_once(f"{CPU_UNIT}{info['host_id']} ({cpu})", info)


def _with_runs_at_once(unit: str, info: Mapping[str, Any]) -> str:
    """``unit``, and the number of runs that measured on its host at once where more than one."""
    shared = at_once(info)
    return unit if shared == 1 else f"{unit} ({shared} runs at once)"


def short_unit(unit: str, width: int = 12) -> str:
    """A unit with its GPU's UUID cut to ``width`` characters (what :func:`gpu_unit` adds after it
    kept)."""
    uuid, _, at_once = unit.partition(" ")
    return f"{uuid[:width]} {at_once}".rstrip()


def unit_of(info: Mapping[str, Any], machine: str) -> str | None:
    """The unit a run measured on, from its ``__machine__`` record's info: its GPU
    (:func:`gpu_unit`); the machine folder for a run without a GPU; None for a GPU run that
    recorded no UUID (which of the lent GPUs it ran on is unknown, so it joins no series)."""
    if info.get("gpu_uuid"):
        return gpu_unit(info)
    return None if info.get("gpu_name") else machine


def unit_series(
    series: Sequence[tuple[str, Sequence[RunMedian]]],
) -> dict[str, list[tuple[str, list[float]]]]:
    """Each unit's (commit, run medians) in the order of ``series``, a commit listed where the unit
    has runs."""
    found: dict[str, list[tuple[str, list[float]]]] = defaultdict(list)
    for commit, runs in series:
        by_unit: dict[str, list[float]] = defaultdict(list)
        for run in runs:
            by_unit[run.unit].append(run.median)
        for unit, medians in by_unit.items():
            found[unit].append((commit, medians))
    return dict(found)


def _unit_change_points(
    unit: str, commits: Sequence[tuple[str, Sequence[float]]], min_magnitude: float
) -> list[ChangePoint]:
    # asv rather than a change-point package of its own: apache-otava 0.8.0 pins numpy==2.2.0 and
    # brings BigQuery, Postgres and Slack clients; signal-processing-algorithms 2.1.6 is a source
    # distribution with a C extension, for Python 3.11 only and numpy<2.
    from asv.step_detect import detect_steps

    values = [statistics.median(medians) for _, medians in commits]
    steps = detect_steps(values, [float(len(medians)) for _, medians in commits])
    found = []
    for (_, right, level, _, err), (left, _, next_level, _, next_err) in zip(steps, steps[1:]):
        step = abs(next_level - level)
        noise = max(err, next_err)
        if level <= 0 or step <= noise or step < min_magnitude * level:
            continue
        # asv's segments cover the series without gaps: ``right`` (exclusive) of one is ``left``
        # of the next
        found.append(
            ChangePoint(
                unit,
                commits[right - 1][0],
                commits[left][0],
                left,
                next_level / level,
                step / noise if noise > 0 else math.inf,
            )
        )
    return found


def change_points(
    series: Sequence[tuple[str, Sequence[RunMedian]]],
    min_commits: int = MIN_COMMITS,
    min_magnitude: float = MIN_MAGNITUDE,
) -> list[ChangePoint]:
    """The change points of one metric: ``series`` is its (commit, runs) in commit order; each unit
    with ``min_commits`` commits or more is searched on its own (see the module docstring). Ordered
    by unit, then commit."""
    return [
        point
        for unit, commits in sorted(unit_series(series).items())
        if len(commits) >= min_commits
        for point in _unit_change_points(unit, commits, min_magnitude)
    ]
