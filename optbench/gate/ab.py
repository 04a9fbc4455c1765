"""``optbench ab BASE HEAD``: did HEAD slow anything down? Both commits measured here, interleaved.

Each commit is checked out into a worktree of its own (under ``.cache/ab/``) after resolving it to
the commit whose code it holds (commits of results and docs alone measure their parent's code):
where both resolve to one commit, the code is the same and nothing is measured. Then rounds: each
round runs the selected cases of one commit in fresh processes (the steps in one, the other grids in
another, as ``optbench run`` does), one side after the other in ABBA order (base, head, head, base,
...), so that drift of the machine during the job falls on both sides alike. Every case is checked
before it is timed, as always.

Each round is an ordinary run of its commit: its records go to the store
(``results/<machine>/optbench/``) and the history gains them. The first pair of rounds
(``--warmup``) fills the compile caches and is not judged. Then, per metric, head/base of the runs'
values with its Mann-Whitney interval (:mod:`optbench.gate.ratio`) against the metric's threshold
(``optbench.suite.catalog.GATE_THRESHOLDS``: device-bound times 3%, host-bound 10%, peak memory 1%,
compile seconds 15%). Rounds go on until every metric of the classes that must be decided
(``--require``: device-bound and memory by default) has a verdict other than inconclusive, after at
least ``--min-rounds`` judged rounds a side, or until ``--max-rounds`` or the ``--time-budget``
would be passed. Host-bound times and compile seconds move by tens of percent between processes of
one GPU: they are judged and reported, and flag a regression when their whole interval is past the
threshold, but an interval that still straddles it does not hold up the verdict unless required. A
case that is ok at base and fails at head in any round is a regression. The pairing (which runs, in
which order, on which GPU, the verdicts) is stored in ``results/<machine>/ab/<first run id>.json``.

Exit codes: 0 no regression (or the same code on both sides), 1 a regression, 2 nothing to compare
(a ref git cannot resolve, no case measured on both sides), 3 inconclusive: no regression found, but
the budget ended before every required metric had a verdict (run again with a larger
``--time-budget``, or narrow ``--select``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from optbench.core.records import OK, Record
from optbench.core.runner import measured_commit
from optbench.core.settings import Settings, process_env
from optbench.core.store import (
    MACHINE_KEY,
    REPO_ROOT,
    ResultStore,
    new_run_id,
    read_records,
    write_json_atomic,
)
from optbench.gate.ratio import INCONCLUSIVE, REGRESSION, Ratio, ratio
from optbench.suite import catalog
from optbench.suite.grids import PROCESSES

EXIT_OK, EXIT_REGRESSION, EXIT_NOTHING, EXIT_INCONCLUSIVE = 0, 1, 2, 3
GRID_ENTRY = (
    "from optbench.suite.grids import PROCESSES, measure_suite; "
    "measure_suite(kinds=PROCESSES[{!r}])"
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


def resolve(ref: str, root: Path = REPO_ROOT) -> str:
    """The commit whose code ``ref`` holds (``optbench.core.runner.measured_commit``); ValueError
    naming the ref where git cannot resolve it."""
    try:
        commit = measured_commit(ref, cwd=root)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ValueError(f"git cannot resolve {ref!r} in {root}") from exc
    if not commit:
        raise ValueError(f"git cannot resolve {ref!r} in {root}")
    return commit


def add_worktree(commit: str, root: Path = REPO_ROOT) -> Path:
    """A fresh detached worktree of ``commit`` under ``.cache/ab/`` (one left by an earlier job is
    replaced)."""
    tree = root / ".cache" / "ab" / commit[:12]
    if tree.exists():
        remove_worktree(tree, root)
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(tree), commit],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    )
    return tree


def remove_worktree(tree: Path, root: Path = REPO_ROOT) -> None:
    subprocess.run(
        ["git", "worktree", "remove", "--force", str(tree)], cwd=root, capture_output=True
    )
    subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)


def planned(suite: str, select: str | None) -> dict[str, list[str]]:
    """The selected cases of ``suite`` by grid process ('steps', 'other'): what each round
    measures."""
    from optbench.core.progress import planned_cases

    groups: dict[str, list[str]] = defaultdict(list)
    for key in planned_cases(catalog.BENCHMARKS.values(), suite, select):
        kind = catalog.kind(key.split("|")[0])
        groups[next(g for g, kinds in PROCESSES.items() if kind in kinds)].append(key)
    return dict(groups)


def run_round(
    side: Side, settings: Settings, groups: Iterable[str], logs: Path
) -> tuple[str, float, int]:
    """One round of ``side``: each grid process of ``groups`` in turn, fresh, in the side's
    worktree, as one run of its commit. Returns the run id, the seconds it took and the worst exit
    code of its processes (their output is in ``logs/<run id>.log``)."""
    assert side.tree is not None
    run_id = new_run_id()
    env = process_env(
        dataclasses.replace(settings, run_id=run_id, asv_commit=side.commit),
        side.tree,
        REPO_ROOT / ".cache",
    )
    logs.mkdir(parents=True, exist_ok=True)
    started, worst = time.perf_counter(), 0
    with open(logs / f"{run_id}.log", "w") as log:
        for group in groups:
            code = subprocess.run(
                [sys.executable, "-c", GRID_ENTRY.format(group)],
                cwd=side.tree,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            ).returncode
            worst = max(worst, code)
    side.runs.append(run_id)
    return run_id, time.perf_counter() - started, worst


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


@dataclass(frozen=True)
class Verdict:
    """The judgement of one series over the judged rounds."""

    series: Series
    klass: str
    threshold: float
    base: tuple[float, ...]
    head: tuple[float, ...]
    ratio: Ratio

    @property
    def verdict(self) -> str:
        return self.ratio.verdict(self.threshold)


def judge(
    base: list[dict[Series, float]], head: list[dict[Series, float]], confidence: float
) -> list[Verdict]:
    """A verdict for every series that each judged round of both sides measured."""
    common = set.intersection(*(set(run) for run in [*base, *head])) if base and head else set()
    out = []
    for series in sorted(common):
        benchmark, *_ = series.key.split("|")
        params = dict(p.split("=", 1) for p in series.key.split("|")[1:])
        klass = catalog.metric_class(
            benchmark, params, series.quantity, series.clock, series.metric
        )
        if klass is None:
            continue
        b, h = tuple(run[series] for run in base), tuple(run[series] for run in head)
        out.append(
            Verdict(series, klass, catalog.GATE_THRESHOLDS[klass], b, h, ratio(b, h, confidence))
        )
    return out


def status_regressions(base: list[dict[str, str]], head: list[dict[str, str]]) -> list[str]:
    """Cases ok in every base round that failed (any status but ok or skipped) in a head round."""
    keys = set().union(*base) if base else set()
    return sorted(
        k
        for k in keys
        if all(r.get(k) == OK for r in base)
        and any(r.get(k, OK) not in (OK, "skipped") for r in head)
    )


def undecided(verdicts: Iterable[Verdict], required: Iterable[str]) -> list[Verdict]:
    """The inconclusive verdicts of the metric classes ``required``."""
    classes = set(required)
    return [v for v in verdicts if v.klass in classes and v.verdict == INCONCLUSIVE]


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
    scale, unit = (2**20, "MiB") if v.series.quantity == "peak memory" else (1.0, "ms")
    if v.series.quantity == "compile":
        unit = "s"
    mid = lambda xs: sorted(xs)[len(xs) // 2] / scale  # noqa: E731
    r = v.ratio
    return (
        v.series.key,
        f"{v.series.metric} {v.series.clock or v.series.quantity}".strip(),
        f"{v.klass} {v.threshold:.0%}",
        f"{mid(v.base):.4g} {unit}",
        f"{mid(v.head):.4g} {unit}",
        f"{r.estimate:.3f}x [{r.low:.3f}, {r.high:.3f}]",
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
    warmup: int = 1
    confidence: float = 0.95
    results: Path | None = None
    require: tuple[str, ...] = ("device-bound", "memory")


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
    p.add_argument("--warmup", type=int, default=1, help="pairs of rounds not judged (default 1)")
    p.add_argument("--confidence", type=float, default=0.95, help="of each interval (default 0.95)")
    p.add_argument("--results", type=Path, help="results root (default results/)")
    p.add_argument(
        "--require",
        action="append",
        choices=list(catalog.GATE_THRESHOLDS),
        help="a metric class that must be decided (repeatable; default device-bound and memory)",
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
        "3 inconclusive (the budget ended first).",
    )
    p.add_argument("base", help="base commit-ish")
    p.add_argument("head", help="head commit-ish")
    add_options(p)
    args = p.parse_args(argv)
    return ab(args.base, args.head, options_of(p, args))


def ab(base_ref: str, head_ref: str, options: Options) -> int:
    """Compare ``head_ref`` with ``base_ref`` here (module docstring); the exit code."""
    started = time.monotonic()
    try:
        base, head = (
            Side(label, ref, resolve(ref))
            for label, ref in (("base", base_ref), ("head", head_ref))
        )
    except ValueError as exc:
        print(f"optbench ab: {exc}", file=sys.stderr)
        return EXIT_NOTHING
    if base.commit == head.commit:
        print(
            f"optbench ab: {base_ref} and {head_ref} hold the same code ({base.commit[:12]}): "
            "nothing can have slowed down"
        )
        return EXIT_OK
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
    sides = {"base": base, "head": head}
    try:
        for side in sides.values():
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
        return _rounds(options, sides, groups, started)
    finally:
        for side in sides.values():
            if side.tree is not None:
                remove_worktree(side.tree)


def _rounds(
    args: Options, sides: dict[str, Side], groups: dict[str, list[str]], started: float
) -> int:
    from optbench.core.console import console, table

    assert args.results is not None
    results = args.results
    settings = Settings(suite=args.suite, select=args.select, results=results)
    store = ResultStore(results)
    logs = REPO_ROOT / ".cache" / "ab" / "logs"
    cases = sum(map(len, groups.values()))
    print(
        f"optbench ab: base {sides['base'].commit[:12]} ({sides['base'].ref}), head "
        f"{sides['head'].commit[:12]} ({sides['head'].ref}): {cases} cases a round; logs in "
        f"{logs.relative_to(REPO_ROOT)}",
        flush=True,
    )
    judged: dict[str, list[dict[Series, float]]] = {"base": [], "head": []}
    states: dict[str, list[dict[str, str]]] = {"base": [], "head": []}
    machine, gpus, pair_s, verdicts = None, set(), 0.0, []
    pairs = args.warmup + args.max_rounds
    for index, label in enumerate(order(pairs)):
        pair = index // 2
        # before a new pair: judge, and stop when done or out of time
        if index % 2 == 0 and pair > args.warmup:
            verdicts = judge(judged["base"], judged["head"], args.confidence)
            judged_pairs = pair - args.warmup
            done = judged_pairs >= args.min_rounds and not undecided(verdicts, args.require)
            elapsed = time.monotonic() - started
            if not done and elapsed + pair_s > args.time_budget and judged_pairs < args.min_rounds:
                needed = elapsed + (args.min_rounds - judged_pairs) * pair_s
                print(
                    f"optbench ab: the time budget ends after {judged_pairs} judged rounds a side, "
                    f"short of --min-rounds {args.min_rounds} (pairs take about {pair_s:.0f} s): "
                    f"about --time-budget {needed:.0f} would reach it",
                    file=sys.stderr,
                )
            if done or elapsed + pair_s > args.time_budget:
                break
        side = sides[label]
        run_id, seconds, code = run_round(side, settings, groups, logs)
        pair_s = max(pair_s, 2 * seconds)
        found = find_run(store, side.commit, run_id)
        if found is None:
            print(
                f"optbench ab: round {pair + 1} of {label} stored nothing (exit {code}); its log: "
                f"{(logs / f'{run_id}.log').relative_to(REPO_ROOT)}",
                file=sys.stderr,
            )
            return EXIT_NOTHING
        machine, records = found
        gpus.add(records.get(MACHINE_KEY, {}).get("info", {}).get("gpu_uuid"))
        measured, statuses = values(records)
        kept = "warm-up" if pair < args.warmup else "judged"
        if kept == "judged":
            judged[label].append(measured)
            states[label].append(statuses)
        bad = sorted(k for k, s in statuses.items() if s != OK)
        print(
            f"  round {pair + 1} {label:4s} run {run_id}: {len(statuses)} cases in {seconds:.0f} s "
            f"({kept})" + (f"; not ok: {', '.join(bad)}" if bad else ""),
            flush=True,
        )
    else:
        verdicts = judge(judged["base"], judged["head"], args.confidence)
    failed = status_regressions(states["base"], states["head"])
    if not verdicts and not failed:
        print(
            "optbench ab: nothing to compare: no metric was measured in every judged round of "
            "both sides",
            file=sys.stderr,
        )
        return EXIT_NOTHING
    marks = [v.verdict.upper() if v.verdict == REGRESSION else v.verdict for v in verdicts]
    console().print(
        table(
            ("case", "metric", "class", "base", "head", "head/base [interval]", "runs", "verdict"),
            [_fmt(v) for v in verdicts],
            title=f"{machine}: ab",
            marks=marks,
        )
    )
    for key in failed:
        print(f"REGRESSION: {key} is ok at base and fails at head")
    regressions = [v for v in verdicts if v.verdict == REGRESSION]
    required = undecided(verdicts, args.require)
    undecided_all = [v for v in verdicts if v.verdict == INCONCLUSIVE]
    code = EXIT_REGRESSION if regressions or failed else EXIT_INCONCLUSIVE if required else EXIT_OK
    record = {
        side.label: {"ref": side.ref, "commit": side.commit, "runs": side.runs}
        for side in sides.values()
    }
    record.update(
        {
            "order": order(len(sides["base"].runs))[
                : len(sides["base"].runs) + len(sides["head"].runs)
            ],
            "warmup_pairs": args.warmup,
            "gpu_uuids": sorted(filter(None, gpus)),
            "suite": args.suite,
            "select": args.select,
            "confidence": args.confidence,
            "exit": code,
            "seconds": round(time.monotonic() - started, 1),
            "required": list(args.require),
            "verdicts": [
                {
                    "key": v.series.key,
                    "metric": v.series.metric,
                    "quantity": v.series.quantity,
                    "clock": v.series.clock,
                    "class": v.klass,
                    "threshold": v.threshold,
                    "base": v.base,
                    "head": v.head,
                    "ratio": v.ratio.estimate,
                    "low": _finite(v.ratio.low),
                    "high": _finite(v.ratio.high),
                    "verdict": v.verdict,
                }
                for v in verdicts
            ],
            "failed_at_head": failed,
        }
    )
    pairing = results / str(machine) / "ab" / f"{sides['base'].runs[0]}.json"
    write_json_atomic(pairing, record)
    print(
        f"optbench ab: {len(regressions) + len(failed)} regressions, {len(undecided_all)} "
        f"inconclusive ({len(required)} of them of a required class: {', '.join(args.require)}) of "
        f"{len(verdicts)} metrics ({len(judged['base'])}/{len(judged['head'])} judged rounds, "
        f"{record['seconds']:.0f} s, GPU {', '.join(record['gpu_uuids']) or 'none'}); pairing in "
        f"{pairing.relative_to(results.parent) if results.parent in pairing.parents else pairing}"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
