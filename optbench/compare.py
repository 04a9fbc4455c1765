"""Compares two commits' records machine by machine: what got slower or hungrier, by how much, and is it real.

The rule, per benchmark record and metric:

- Time: the stored samples of the record's primary clock (``info["primary_clock"]``, default ``device``;
  ``wall`` where a side has no device time) go to asv's own test, ``asv._stats.is_different`` with
  ``p_threshold`` (0.002): a two-sided Mann-Whitney U rank test where the sample counts allow p below that
  threshold, else non-overlap of the two medians' 99% confidence intervals. A significant change is a
  regression when head/base of the medians exceeds ``1 + max(threshold, noise)``, an improvement below
  ``1 - max(threshold, noise)``. ``noise`` is the metric's run-to-run spread on that machine: (max - min) / min
  of its medians in the stored runs of the other commits, where there are at least three (else 0). The rank
  test only sees one run's samples; a host-bound step varies more between processes than within one (the
  100M eager step: 54 to 88 ms on one H100 across runs, with an interquartile range of 5 to 24 ms in
  each). History that holds a real
  change also widens the spread, so the gate errs towards silence for a benchmark that moved before.
- Peak memory (one deterministic value): significant when head/base differs from 1 by more than ``threshold``.
- Status: ``ok`` to anything else (oom, wrong, timeout, error, skipped) is a regression, anything to ``ok`` an
  improvement; other non-ok records are reported as they are, and records skipped on both sides stay silent.
  A record on one side only is reported with status ``missing`` and never fails the gate, but a comparison
  in which no record has results on both sides exits 2: a gate with nothing to compare must not pass.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from optbench.store import ResultStore

OK = "ok"
MISSING = "missing"
COLUMNS = ("benchmark", "params", "metric", "clock", "base", "head", "head/base", "verdict")


class Summary(NamedTuple):
    """Median and quartiles of one side: ms for a time, bytes for peak memory (quartiles = median)."""

    median: float
    q25: float
    q75: float


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
    clock: str | None  # 'device' or 'wall' for a time
    base: Summary | None
    head: Summary | None
    ratio: float | None
    significant: bool
    regression: bool
    improvement: bool
    base_status: str = OK
    head_status: str = OK
    noise: float = 0.0  # run-to-run spread of this metric's medians on this machine (see the module docstring)
    within_noise: bool = False  # significant and beyond the threshold, but not beyond that spread


def timing(record: dict, metric: str, clock: str | None = None) -> tuple[str, dict] | None:
    """(clock, Timing dict) of ``metric``: by ``clock`` if given, else by the record's primary clock with
    wall as the fallback where that is null; None where there is no such timing."""
    clocks = record.get("metrics", {}).get(metric) or {}
    if clock is not None:
        return (clock, clocks[clock]) if clocks.get(clock) else None
    primary = record.get("info", {}).get("primary_clock", "device")
    for name in (primary, "wall"):
        if clocks.get(name):
            return name, clocks[name]
    return None


def git_commit(ref: str) -> str | None:
    """Full hash of a commit-ish in the repository of this file, or None where git cannot resolve it."""
    try:
        out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                             cwd=Path(__file__).resolve().parent, capture_output=True, text=True)
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


def is_different(a: Sequence[float], b: Sequence[float], p_threshold: float) -> bool:
    """asv's significance test of two sample sets (False when either is empty)."""
    from asv import _stats
    from asv_runner.statistics import compute_stats

    if not a or not b:
        return False
    return _stats.is_different(a, b, compute_stats(a, 1)[1], compute_stats(b, 1)[1], p_threshold)


def _summary(t: dict) -> Summary:
    return Summary(t["median_ms"], t["q25_ms"], t["q75_ms"])


def run_to_run_noise(runs: Iterable[dict[str, dict]], min_runs: int = 3) -> dict[tuple[str, str, str], float]:
    """(key, metric, clock) -> (max - min) / min of the median times over ``runs`` (records by key), for the
    metrics timed in at least ``min_runs`` of them."""
    medians: dict[tuple[str, str, str], list[float]] = {}
    for records in runs:
        for key, rec in records.items():
            if key.startswith("__") or rec.get("status") != OK:
                continue
            for metric in rec.get("metrics", {}):
                found = timing(rec, metric)
                if found and found[1]["median_ms"] > 0:
                    medians.setdefault((key, metric, found[0]), []).append(found[1]["median_ms"])
    return {k: (max(v) - min(v)) / min(v) for k, v in medians.items() if len(v) >= min_runs}


def compare_records(base: dict | None, head: dict | None, threshold: float = 0.05,
                    p_threshold: float = 0.002, noise: dict[tuple[str, str, str], float] | None = None,
                    **where: str) -> list[Change]:
    """Changes of one record (``where``: machine, base_commit, head_commit) by the rule of this module;
    ``noise`` as :func:`run_to_run_noise` gives it (none: 0)."""
    rec = head or base
    assert rec is not None
    common = dict(where, key=rec["key"], benchmark=rec["benchmark"], params=rec.get("params", {}))
    sb, sh = (r["status"] if r else MISSING for r in (base, head))
    if sb != OK or sh != OK:
        if sb == sh == "skipped":
            return []
        significant = sb != sh and MISSING not in (sb, sh)
        return [Change(**common, metric="", quantity="status", clock=None, base=None, head=None, ratio=None,
                       significant=significant, regression=significant and sb == OK,
                       improvement=significant and sh == OK, base_status=sb, head_status=sh)]
    assert base is not None and head is not None

    def change(metric: str, quantity: str, clock: str | None, b: Summary, h: Summary, significant: bool):
        ratio = h.median / b.median if b.median else (1.0 if h.median == b.median else math.inf)
        spread = (noise or {}).get((rec["key"], metric, clock), 0.0) if quantity == "time" else 0.0
        bound = max(threshold, spread)
        return Change(**common, metric=metric, quantity=quantity, clock=clock, base=b, head=h, ratio=ratio,
                      significant=significant, regression=significant and ratio > 1 + bound,
                      improvement=significant and ratio < 1 - bound, noise=spread,
                      within_noise=significant and threshold < abs(ratio - 1) <= spread)

    changes = []
    for metric in head.get("metrics", {}):
        found = [timing(r, metric) for r in (base, head)]
        if found[0] and found[1] and found[0][0] != found[1][0]:
            found = [timing(r, metric, "wall") for r in (base, head)]
        if not (found[0] and found[1]):
            continue
        (clock, tb), (_, th) = found
        changes.append(change(metric, "time", clock, _summary(tb), _summary(th),
                              is_different(tb["samples_ms"], th["samples_ms"], p_threshold)))
    for metric, h in (head.get("peak_mem_bytes") or {}).items():
        b = (base.get("peak_mem_bytes") or {}).get(metric)
        if b is not None and h is not None:
            changes.append(change(metric, "peak memory", None, Summary(b, b, b), Summary(h, h, h),
                                  abs(h - b) > threshold * abs(b)))
    return changes


def compare(store: ResultStore, base: str, head: str, machines: Iterable[str] | None = None,
            threshold: float = 0.05, p_threshold: float = 0.002) -> list[Change]:
    """Every change from ``base`` to ``head`` (commit-ish or stored prefix) on each machine with both.

    Non-significant changes are included (``significant`` False), and records on one side only (missing).
    """
    changes: list[Change] = []
    for machine in machines or store.machines():
        b, h = resolve(store, machine, base), resolve(store, machine, head)
        if b is None or h is None:
            continue
        old, new = store.load(machine, b), store.load(machine, h)
        noise = run_to_run_noise(store.load(machine, c) for c in store.commits(machine) if c != h)
        for key in dict.fromkeys([*old, *new]):
            if not key.startswith("__"):  # special records: __machine__, __calibration__
                changes += compare_records(old.get(key), new.get(key), threshold, p_threshold, noise,
                                           machine=machine, base_commit=b, head_commit=h)
    return changes


def verdict(c: Change) -> str:
    """'REGRESSION', 'improvement', 'changed' (significant, within the threshold) or ''."""
    if c.regression:
        return "REGRESSION"
    if c.improvement:
        return "improvement"
    if c.within_noise:
        return f"within run-to-run noise (±{c.noise:.0%})"
    return "changed" if c.significant else ""


def _format(c: Change, s: Summary | None, status: str) -> str:
    if s is None:
        return status
    if c.quantity == "peak memory":
        return f"{s.median / 2**20:.1f} MiB"
    return f"{s.median:.4g} ms [{s.q25:.4g}–{s.q75:.4g}]"


def rows(changes: Iterable[Change]) -> list[tuple[str, ...]]:
    """Table cells (see COLUMNS) of changes: medians with their quartiles, MiB for memory."""
    return [(c.benchmark, " ".join(c.key.split("|")[1:]),
             c.metric if c.quantity == "time" else f"{c.metric} {c.quantity}".strip(),
             c.clock or "", _format(c, c.base, c.base_status), _format(c, c.head, c.head_status),
             "" if c.ratio is None else f"{c.ratio:.3f}×", verdict(c)) for c in changes]


def compared(c: Change) -> bool:
    """Whether the record has results at both commits."""
    return MISSING not in (c.base_status, c.head_status)


def shown(c: Change) -> bool:
    """Whether a change belongs in the default table: significant, or failing at head."""
    return c.significant or c.head_status not in (OK, "skipped", MISSING)


def main(argv: list[str] | None = None) -> int:
    """``optbench compare BASE HEAD``: exit 1 on a significant regression, 2 when nothing was comparable."""
    from rich.console import Console
    from rich.table import Table

    p = argparse.ArgumentParser(prog="optbench compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="base commit-ish or stored hash prefix")
    p.add_argument("head", help="head commit-ish or stored hash prefix")
    p.add_argument("--machine", action="append", help="machine folder to compare (repeatable; default all)")
    p.add_argument("--threshold", type=float, default=0.05, help="relative change that fails the gate")
    p.add_argument("--results", type=Path, help="results root (default $OPTBENCH_RESULTS or results/)")
    p.add_argument("--all", action="store_true", help="list every compared metric, not only the changed")
    args = p.parse_args(argv)

    store = ResultStore(args.results)
    changes = compare(store, args.base, args.head, args.machine, args.threshold)
    console = Console(width=None if sys.stdout.isatty() else 160)
    if not any(map(compared, changes)):
        console.print(f"optbench compare: nothing to compare: no machine in {store.root} has results of one "
                      f"benchmark at both {args.base} and {args.head}", style="bold red")
        return 2
    style = {"REGRESSION": "bold red", "improvement": "green", "changed": "yellow"}
    for machine in dict.fromkeys(c.machine for c in changes):
        mine = [c for c in changes if c.machine == machine]
        listed = [c for c in mine if args.all or shown(c)]
        title = f"{machine}: {mine[0].base_commit[:12]} → {mine[0].head_commit[:12]}"
        if listed:
            table = Table(*COLUMNS, title=title)
            for c, row in zip(listed, rows(listed)):
                table.add_row(*row, style=style.get(verdict(c)))
            console.print(table)
        else:
            console.print(f"{title}: no significant change in {len(mine)} metrics")
        lost = sum(c.base_status == OK and c.head_status == MISSING for c in mine)
        if lost:
            console.print(f"note: {lost} results of the base commit are missing at head on {machine}")
    regressions = [c for c in changes if c.regression]
    console.print(f"{len(regressions)} significant regressions beyond {args.threshold:.0%}",
                  style="bold red" if regressions else "green")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
