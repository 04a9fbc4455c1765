"""The ``optbench`` command: run the suite, compare commits, publish reports, profile a training
step, plan what a GPU can run, check the timer and the gate.

``optbench run`` benchmarks the current commit on whatever device is here (the CPU suite without a
GPU), stores results under ``results/<machine>/`` (asv's under ``results/asv/<machine>/``) and
writes HTML under ``html/``. The other commands are those of their modules (``optbench <command>
--help``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib
import platform
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from optbench.asv import asv_timed
from optbench.run import breakdown, progress
from optbench.run.compile_cache import COLD
from optbench.run.console import console
from optbench.run.helptext import plain
from optbench.store.records import INTERRUPTED, Record
from optbench.store.settings import Settings, current
from optbench.store.store import REPO_ROOT as ROOT
from optbench.store.store import (
    CannotWrite,
    ResultStore,
    asv_results_dir,
    new_run_id,
    require_writable,
)
from optbench.suite import shard
from optbench.suite.catalog import BENCHMARKS, SUITES, asv_pattern, with_references

SUBCOMMANDS = {
    "ab": "optbench.gate.ab",
    "bisect": "optbench.gate.bisect",
    "compare": "optbench.gate.compare",
    "report": "optbench.reporting.site",
    "history": "optbench.reporting.history",
    "calibrate": "optbench.run.calibrate",
    "profile": "optbench.profiling.profile",
    "plan": "optbench.suite.plan",
    "noisecheck": "optbench.gate.noisecheck",
    "merge": "optbench.store.merge",
}


# What asv needs after the grids of a run with a time budget: the remaining classes' quick skips,
# its track processes and writing the results (a run stopped before asv writes them stores no asv
# results).
ASV_WRAP_UP_S = 60.0
# What a run spends before its first case: asv's start and discovery, the grid processes' start-up
# (each run's stored breakdown holds its own): kept out of the budget in the estimate before a run.
ASV_START_S = 20.0
# The shortest --time-budget that can measure a case: the wrap-up, asv's start-up before the first
# grid (about 30 s on an H100 runner) and the 30 s a case needs left to start
# (optbench.run.runner): a shorter budget is refused, since it would measure nothing.
MIN_TIME_BUDGET_S = ASV_WRAP_UP_S + 60.0


def git_commit(ref: str = "HEAD") -> str:
    """The commit whose code ``ref`` has (``optbench.run.runner.measured_commit``: commits of
    results and notes alone are skipped); a clear error where the work tree has no git history."""
    from optbench.run.runner import measured_commit

    try:
        return measured_commit(ref, cwd=str(ROOT))
    except subprocess.CalledProcessError as exc:
        raise SystemExit(
            f"optbench: cannot resolve {ref!r} in {ROOT}: {exc.stderr.strip()}\n"
            "A copied work tree has no history: restore it from a bundle (scripts/gpu-run.sh does)."
        ) from exc


def bench_env(settings: Settings) -> dict[str, str]:
    """Environment of the asv processes: the run's settings (``optbench.store.settings``, read back
    there), a run id they share, persistent compile caches."""
    from optbench.store.settings import process_env
    from optbench.store.store import new_run_id

    if settings.run_id is None:
        settings = dataclasses.replace(settings, run_id=new_run_id())
    return process_env(settings, ROOT, ROOT / ".cache")


def register_machine(machine: str) -> None:
    """Makes ``machine`` known to asv in asv's per-user machine file (``~/.asv-machine.json``),
    whose entry ``asv run --machine`` copies into ``results/asv/<machine>/machine.json``. Where that
    file exists (committed results), the entry is its description as it is, so asv writes it back
    byte for byte; else this machine's (OS, architecture, CPU with the GPU named beside it, CPUs,
    RAM). The entry is written only where it differs; the other machines of the file are kept, and
    nothing under ``results/`` is written here."""
    import json

    from asv import util
    from asv.machine import MachineCollection

    from optbench.measure.machine import machine_info

    try:
        description = json.loads((asv_results_dir() / machine / "machine.json").read_text())
        description.pop("version", None)
    except (OSError, ValueError):
        info = machine_info()
        cpu = str(info.get("cpu") or platform.processor() or "unknown cpu")
        if info.get("gpu_name"):
            cpu = (
                f"{cpu} | {info['gpu_count']}x {info['gpu_name']} (driver {info.get('driver')}, "
                f"CUDA {info.get('cuda')})"
            )
        description = {
            "machine": machine,
            "os": str(info.get("os")),
            "arch": platform.machine(),
            "cpu": cpu,
            "num_cpu": str(info.get("num_cpu")),
            "ram": str(info.get("ram_gb")),
        }
    path = Path(MachineCollection.get_machine_file_path())
    known = util.load_json(str(path)) if path.is_file() else {}
    if known.get(machine) != description:
        MachineCollection.save(machine, description)


def asv_run_command(commit: str, machine: str, bench: str) -> list[str]:
    """The command of ``optbench run``'s asv run: the benchmarks matching ``bench`` (asv's
    ``--bench`` regex) in this Python's environment, recorded under ``commit`` on ``machine``,
    through :mod:`optbench.asv.asv_atomic`, with the benchmark processes' stderr in its output."""
    return [
        sys.executable,
        "-m",
        "optbench.asv.asv_atomic",
        "run",
        "--environment",
        f"existing:{sys.executable}",
        "--set-commit-hash",
        commit,
        "--machine",
        machine,
        "--show-stderr",
        "--bench",
        bench,
    ]


def run_parser() -> argparse.ArgumentParser:
    """The command line of ``optbench run``."""
    p = argparse.ArgumentParser(prog="optbench run", description=plain(run.__doc__))
    p.add_argument(
        "--suite",
        choices=["auto", *SUITES],
        default="auto",
        help="auto: 'full' with a GPU, 'cpu' without",
    )
    p.add_argument(
        "--commit",
        default="HEAD",
        help="record the results under the commit whose code this is (commits that only add "
        "results or notes are skipped)",
    )
    p.add_argument(
        "--emulate",
        help="hardware profile to emulate on a larger GPU (t4, a100-40gb, rtx5090, ...)",
    )
    p.add_argument(
        "--select",
        help="regex on record keys ('bench_step.Step1B|variant=best'): measure only those",
    )
    p.add_argument(
        "--skip-existing",
        action="store_true",
        help="leave out the cases this commit already has a record of on this machine "
        "(any status but crashed or interrupted), but for the references of the cases "
        "measured now: a suite too long for one call (sweep) is run in parts that add up",
    )
    p.add_argument("--no-html", action="store_true", help="skip asv publish and optbench's charts")
    p.add_argument(
        "--no-prewarm",
        action="store_true",
        help="no compile warm-up: where the compile caches start empty on a GPU, the run first "
        "builds its compiled cases once each, in parallel, and its records' compile seconds are "
        "then warm ones; with this, each case compiles cold, in turn",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show asv's output as it runs (always in its log file, "
        "results/<machine>/progress/<run id>.asv.log)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        metavar="SECONDS",
        help="end the run within SECONDS (e.g. a runner's job limit): no case starts, and a "
        f"running one stops, {ASV_WRAP_UP_S:g} s before it, so asv still writes what was "
        "measured",
    )
    p.add_argument(
        "--shard",
        type=shard.parse_shard,
        metavar="I/N",
        help="measure only shard I of N of the (selected) cases, split by their "
        "times here (optbench.suite.shard)",
    )
    p.add_argument(
        "--gpus",
        metavar="all|0,1,...",
        help="one shard per GPU, each a run of its own, all at once (logs in "
        "results/<machine>/progress/)",
    )
    return p


def run_args(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by ``p`` (:func:`run_parser`); a usage error (exit 2) for options that cannot
    measure anything together."""
    args = p.parse_args(argv)
    if args.gpus is not None and args.shard is not None:
        p.error("--gpus makes the shards itself: give it without --shard")
    if args.time_budget is not None and args.time_budget < MIN_TIME_BUDGET_S:
        p.error(
            f"--time-budget {args.time_budget:g} s cannot measure anything: at least "
            f"{MIN_TIME_BUDGET_S:g} s ({ASV_WRAP_UP_S:g} s of it are kept for asv to write its "
            "results)"
        )
    if args.select:
        try:
            re.compile(args.select)
        except re.error as exc:
            p.error(f"--select {args.select!r} is not a regular expression: {exc}")
    if args.emulate:
        from optbench.measure.hardware import PROFILES

        if args.emulate not in PROFILES:
            p.error(
                f"--emulate {args.emulate!r}: no such hardware profile; one of "
                f"{', '.join(sorted(PROFILES))}"
            )
    return args


def run(argv: list[str]) -> int:
    """``optbench run``: benchmark the current commit here, store results, publish HTML."""
    p = run_parser()
    args = run_args(p, argv)
    results = ROOT / "results"
    require_writable(results)
    if args.gpus is not None:

        def register() -> None:  # once, before the shards: each would write asv's machine file
            from optbench.measure.machine import machine_name

            register_machine(machine_name(emulate=args.emulate))

        def html() -> None:  # matplotlib and the site's modules only where HTML is asked for
            from optbench.reporting.site import publish

            publish()

        return shard.run_on_gpus(
            argv,
            args.gpus,
            emulate=args.emulate,
            prepare=register,
            publish=None if args.no_html else html,
            time_budget=args.time_budget,
        )

    return _run_suite(p, args, results)


def _run_suite(p: argparse.ArgumentParser, args: argparse.Namespace, results: Path) -> int:
    """The suite of ``args`` through asv on this machine, shown compactly: a header
    (:func:`_announce`), a line per finished case (``optbench.run.progress``; on a terminal above
    a live progress bar), once asv has ended a line per combination of the benchmarks asv times
    itself (``optbench.asv.asv_timed``), then the result (:func:`_summary`) and where the time went
    (its breakdown, stored with the run). asv's own output goes to a log file beside the run's
    progress file, and to the console as well with ``--verbose``; where asv fails with no failed
    case to explain it, the log's last lines follow the result. HTML is published last unless
    ``--no-html``. asv's exit code; 0, with one line, where nothing is selected."""
    plan = _plan(p, args, results)
    store = ResultStore(results)
    planned, expected, by_asv, warm = _announce(
        args, store, plan.suite, plan.machine, plan.commit, plan.run_id, plan.asv_log
    )
    if not planned and not by_asv:
        return 0
    register_machine(plan.machine)
    out = console()
    follower = progress.Follower(
        plan.progress_file,
        len(planned),
        live=out.is_terminal,
        console=out,
        planned=planned,
        expected=expected,
        asv_timed=by_asv,
    )
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    started, started_at = time.perf_counter(), time.time()
    if warm:
        plan = _prewarm(args, plan, warm, store)
    code = _run_asv(args, plan, store, follower)
    wall = time.perf_counter() - started
    timed = asv_timed.outcomes(
        asv_results_dir(results),
        plan.machine,
        plan.commit,
        {name: BENCHMARKS[name].param_names for name in by_asv},
        since=started_at,
        select=args.select,
    )
    for outcome in timed:
        print(outcome.line(), flush=True)
    stored = _store_breakdown(store, plan, follower, wall, date)
    for line in _summary(follower, timed, code, wall, stored, plan.asv_log):
        print(line, flush=True)
    out.print(breakdown.render(breakdown.phases(follower.events, wall), wall))
    if not args.no_html:
        from optbench.reporting.site import publish

        publish()
    return code


@dataclass(frozen=True)
class _Plan:
    """Where and what one ``optbench run`` measures: its suite, machine, commit and run, the files
    its case events and asv's output go to, and the environment of asv's processes."""

    suite: str
    machine: str
    commit: str
    run_id: str
    progress_file: Path
    asv_log: Path
    env: dict[str, str]


def _plan(p: argparse.ArgumentParser, args: argparse.Namespace, results: Path) -> _Plan:
    """The run ``args`` asks for: its suite (``auto``: full with a GPU, else cpu), its machine
    (whose results folders must be writable before anything runs), commit, deadline, run id and
    progress file (created empty), and its settings with ``--emulate``, ``--shard`` (which narrows
    ``args.select`` to the shard's cases), ``--select`` and ``--skip-existing``."""
    import torch

    from optbench.measure.machine import machine_name

    suite = args.suite
    if suite == "auto":
        suite = "full" if torch.cuda.is_available() else "cpu"
    machine = machine_name(emulate=args.emulate)
    for folder in (results / machine, asv_results_dir(results) / machine):  # before anything runs
        require_writable(folder)
    commit = git_commit(args.commit)
    if args.emulate:
        from optbench.measure.emulate import emulate_env

        try:
            emulate_env(args.emulate)
        except ValueError as exc:
            p.error(f"--emulate {args.emulate}: {exc}")
    deadline = time.time() + args.time_budget - ASV_WRAP_UP_S if args.time_budget else None
    run_id = current().run_id or new_run_id()
    # the case events of every asv process, and asv's output beside them
    progress_file = results / machine / "progress" / f"{run_id}.jsonl"
    asv_log = progress_file.with_suffix(".asv.log")
    progress_file.parent.mkdir(parents=True, exist_ok=True)
    progress_file.touch()
    settings = dataclasses.replace(
        current(),
        suite=suite,
        deadline=deadline,
        results=results,
        machine=machine,
        emulate=args.emulate,
        run_id=run_id,
        progress=progress_file,
    )
    if args.shard:
        args.select = shard.shard_select(
            args.shard, suite, args.select, ResultStore(results), machine, commit
        )
    if args.select:
        settings = dataclasses.replace(settings, select=args.select)
    if args.skip_existing:
        settings = dataclasses.replace(settings, skip_existing="true")
    return _Plan(suite, machine, commit, run_id, progress_file, asv_log, bench_env(settings))


def _warm_keys(args: argparse.Namespace, planned: list[str]) -> list[str]:
    """The planned cases a run warms up first (``optbench.suite.prewarm.wanted``; none with
    ``--no-prewarm``)."""
    if args.no_prewarm:
        return []
    import torch

    from optbench.run.compile_cache import holds_caches
    from optbench.suite import prewarm

    if not torch.cuda.is_available():
        return []
    return prewarm.wanted(
        current().compile_cache, not holds_caches(), "cuda", planned, _profile(args)
    )


def _profile(args: argparse.Namespace):
    """The hardware profile the run's cases must fit: ``--emulate``'s, else this GPU's."""
    from optbench.measure.hardware import lookup
    from optbench.suite.workloads import machine_profile

    return lookup(args.emulate) if args.emulate else machine_profile("cuda")


def _prewarm(args: argparse.Namespace, plan: _Plan, keys: list[str], store: ResultStore) -> _Plan:
    """The compile warm-up of ``keys`` (``optbench.suite.prewarm``): each built once, in parallel,
    before asv starts, those whose earlier cold runs here took longest first, within
    ``prewarm.BUDGET_SHARE`` of what is left of the run's time budget; its line said, its seconds
    appended to the run's progress file (the breakdown's phase); the plan returned with
    ``compile_cache`` 'prewarmed' where any of its processes started (one ended or failed midway
    may have filled the caches in part: its records' compile seconds are then not cold ones)."""
    from optbench.store.settings import VARIABLES
    from optbench.suite import prewarm
    from optbench.suite.memory_estimate import usable_bytes

    profile = _profile(args)
    processes = prewarm.slots(runs_at_once=int(current().runs_at_once or 1))
    print(
        f"optbench: compile warm-up: {len(keys)} compiled cases, each built once, {processes} at "
        "a time, before the run (--no-prewarm: none)",
        flush=True,
    )
    deadline = None
    if VARIABLES["deadline"] in plan.env:
        left = float(plan.env[VARIABLES["deadline"]]) - time.time()
        deadline = time.time() + prewarm.BUDGET_SHARE * max(left, 0.0)
    out = console()
    # on a terminal, a line that follows it: how many are built, how many building
    status = out.status("optbench: compile warm-up: starting") if out.is_terminal else None

    def report(so_far: prewarm.Warmup, running: list[str]) -> None:
        if status is not None:
            done = len(so_far.warmed) + len(so_far.failed)
            status.update(
                f"optbench: compile warm-up: {done} of {len(keys)} built, {len(running)} building"
            )

    with status or contextlib.nullcontext():
        warmed = prewarm.warm(
            keys,
            plan.env,
            need={key: prewarm.device_bytes(key, "cuda") for key in keys},
            usable=usable_bytes(profile) or 0.0,
            processes=processes,
            deadline=deadline,
            first=progress.expected_seconds(store.machine_runs(plan.machine), keys, cold=True),
            report=report,
        )
    print(warmed.line(processes), flush=True)
    progress.append_event(
        plan.progress_file,
        "prewarm",
        seconds=round(warmed.seconds, 3),
        warmed=len(warmed.warmed),
        failed=len(warmed.failed),
    )
    if not warmed.took:  # none started: the caches are as empty as they were
        return plan
    env = {**plan.env, VARIABLES["compile_cache"]: prewarm.PREWARMED}
    return dataclasses.replace(plan, env=env)


def _run_asv(
    args: argparse.Namespace, plan: _Plan, store: ResultStore, follower: progress.Follower
) -> int:
    """asv's run of the plan's benchmarks, its case events followed (:func:`progress.run_followed`;
    asv's output in the plan's log, and on the console with ``--verbose``); asv's exit code. An
    interrupt marks the stored run partial and goes on up."""
    try:
        return progress.run_followed(
            asv_run_command(plan.commit, plan.machine, asv_pattern(plan.suite, args.select)),
            plan.env,
            follower,
            cwd=ROOT,
            log=plan.asv_log,
            echo=args.verbose,
        )
    except progress.RunInterrupted as exc:  # its processes have ended: the run is partial
        store.mark_partial(
            plan.machine,
            plan.commit,
            f"interrupted by {exc.signal}",
            exc.stopped,
            run_id=plan.run_id,
        )
        raise


def _store_breakdown(
    store: ResultStore, plan: _Plan, follower: progress.Follower, wall: float, date: str
) -> Path:
    """The run's file in the store, with the run's time breakdown (:func:`breakdown.record`) added
    where the run stored a record (a run that stored none gets no file for this alone)."""
    stored = store.path(plan.machine, plan.commit, plan.run_id)
    if stored.exists():
        store.save(
            plan.machine,
            plan.commit,
            [
                breakdown.record(
                    follower.events,
                    wall,
                    commit=plan.commit,
                    machine=plan.machine,
                    run_id=plan.run_id,
                    date=date,
                )
            ],
            run_id=plan.run_id,
        )
    return stored


#: How many of the last lines of asv's log follow the result of a run that asv failed unexplained.
LOG_TAIL_LINES = 20
#: How many failed cases the result names (each has its line, with its reason, above it).
NAMED_FAILURES = 10


def _summary(
    follower: progress.Follower,
    timed: list[asv_timed.Outcome],
    code: int,
    wall_s: float,
    stored: Path,
    asv_log: Path,
) -> list[str]:
    """The lines of a run's result, the result first: how many of its cases (grid cases, and the
    combinations asv timed itself, ``timed``) ended ok and how many with each other status (those
    that failed first, then skips and interrupts, then the cases that never ended), the wall time,
    asv's exit code and where the records are; then the first :data:`NAMED_FAILURES` cases that
    failed (neither ok nor skipped nor interrupted), by key; where asv exited non-zero with none
    failed, the last :data:`LOG_TAIL_LINES` lines of its log ``asv_log``."""
    ended = progress.ended(follower.events)
    statuses = Counter(str(e.get("status")) for e in ended.values())
    statuses.update(o.status for o in timed)
    total = max(follower.total, len(ended)) + len(timed)
    by_kind = sorted(statuses.items(), key=lambda sn: (sn[0] in ("skipped", INTERRUPTED), -sn[1]))
    others = [f"{n} {s}" for s, n in by_kind if s != "ok"]
    if total > sum(statuses.values()):
        others.append(f"{total - sum(statuses.values())} never ended")
    where = f"records in {stored.relative_to(ROOT)}" if stored.exists() else "no record stored"
    lines = [
        f"optbench: {statuses['ok']} of {total} cases ok"
        + "".join(f", {o}" for o in others)
        + f" in {progress.clock(wall_s)} (asv exit {code}); {where}"
    ]
    failed = [f"{key} ({e.get('status')})" for key, e in ended.items() if Record.of(e).failed] + [
        f"{o.key} ({o.status})" for o in timed if o.status != "ok"
    ]
    if failed:
        more = len(failed) - NAMED_FAILURES
        lines.append(
            f"optbench: not ok: {', '.join(failed[:NAMED_FAILURES])}"
            + (f" and {more} more (their lines above)" if more > 0 else "")
        )
    elif code != 0:
        tail = asv_log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        lines += [
            f"optbench: asv failed (exit {code}) with no failed case to explain it; the last "
            f"{len(tail)} lines of {asv_log.relative_to(ROOT)}:",
            *(f"  {line}" for line in tail),
        ]
    return lines


def _announce(
    args: argparse.Namespace,
    store: ResultStore,
    suite: str,
    machine: str,
    commit: str,
    run_id: str,
    asv_log: Path,
) -> tuple[list[str], dict[str, float], list[str], list[str]]:
    """The grid cases the run will measure (less, with ``--skip-existing``, those this commit has
    here, but for the references of the rest), their expected seconds from this machine's stored
    runs (of warm caches where the run warms its compiled cases up first), the selected benchmarks
    that asv times itself and the cases the run warms up (:func:`_warm_keys`), said in a header:
    what runs where, the estimate, where asv's output goes (where nothing is to be measured, a
    line saying so alone)."""
    entries = BENCHMARKS.values()
    planned, by_asv = (
        progress.planned_cases(entries, suite, args.select),
        progress.asv_timed(entries, suite, args.select),
    )
    existing = store.measured_keys(machine, commit) if args.skip_existing else set()
    if existing & set(planned):
        kept = with_references([k for k in planned if k not in existing], planned)
        print(
            f"optbench: --skip-existing: {len(existing & set(planned))} of the suite's cases were "
            f"measured in an earlier run of {commit[:12]} here; left out but "
            f"{len(existing & set(kept))}, references of cases measured now",
            flush=True,
        )
        planned = kept
    if not planned and not by_asv:
        print(f"optbench: nothing to measure in suite {suite!r}", flush=True)
        return planned, {}, by_asv, []
    print(
        f"optbench run: suite {suite!r} on {machine}, commit {commit[:12]}, run {run_id}: "
        f"{len(planned)} grid case{'' if len(planned) == 1 else 's'}"
        + (
            f" and {', '.join(by_asv)} (timed by asv: their lines follow its end)" if by_asv else ""
        ),
        flush=True,
    )
    warm = _warm_keys(args, planned)
    expected = progress.expected_seconds(
        store.machine_runs(machine),
        planned,
        cold=current().compile_cache == COLD and not warm,
    )
    reserved = ASV_START_S + ASV_WRAP_UP_S
    print(progress.estimate_note(planned, expected, args.time_budget, reserved, by_asv), flush=True)
    print(
        f"optbench: asv's output goes to {asv_log.relative_to(ROOT)}"
        + ("" if args.verbose else " (--verbose: here too)"),
        flush=True,
    )
    return planned, expected, by_asv, warm


def machine(argv: list[str]) -> int:
    """``optbench machine``: prints this machine's info and results-folder name (``--name``: the
    name alone, what ``asv ... --machine`` takes)."""
    p = argparse.ArgumentParser(prog="optbench machine", description=plain(machine.__doc__))
    p.add_argument("--name", action="store_true", help="print the machine's name only")
    args = p.parse_args(argv)
    import json

    from optbench.measure.machine import machine_info, machine_name

    if args.name:  # where this machine's records go (OPTBENCH_MACHINE, --emulate honoured)
        from optbench.run.runner import current_machine

        print(current_machine())
        return 0
    print(json.dumps({"name": machine_name(), **machine_info()}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``optbench <command> [options]`` (``argv``; default: the process's arguments): the command's
    exit status; 2, with one line on stderr saying why and the usage, without a known command; 2,
    with one line on stderr naming it, where a command cannot write a file or folder it needs
    (:class:`optbench.store.store.CannotWrite`); 130, with one line on stderr, when interrupted
    (Ctrl-C). A subcommand's module docstring, its parser's description, is made plain text
    (:func:`optbench.run.helptext.plain`) before its ``main`` runs."""
    argv = sys.argv[1:] if argv is None else argv
    commands = {"run": run, "machine": machine}
    usage = f"usage: optbench {{{','.join([*commands, *SUBCOMMANDS])}}} [options]"
    if argv and argv[0] in ("-h", "--help"):
        print(f"{usage}\n\n{plain(__doc__)}")
        return 0
    if not argv or argv[0] not in {*commands, *SUBCOMMANDS}:
        problem = f"unknown command {argv[0]!r}" if argv else "no command given"
        print(f"optbench: {problem}\n{usage}", file=sys.stderr)
        return 2
    try:
        if argv[0] in commands:
            return commands[argv[0]](argv[1:])
        module = importlib.import_module(SUBCOMMANDS[argv[0]])
        module.__doc__ = plain(module.__doc__)  # the description of its parser: plain text
        return module.main(argv[1:])
    except KeyboardInterrupt:
        print("optbench: interrupted", file=sys.stderr)
        return 130
    except CannotWrite as exc:
        print(f"optbench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
