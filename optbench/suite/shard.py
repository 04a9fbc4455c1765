"""Shards of a suite: ``optbench run --shard I/N`` measures one of N parts of the suite's cases,
and ``optbench run --gpus`` runs one part per GPU of this host, all at once.

:func:`split` is the rule, a pure function: the cases go, longest first (ties by key), each into
the shard that holds the fewest expected seconds so far (the lowest-numbered among equals), its
references that a shard lacks counted in that shard's seconds. Every case lands in exactly one
shard; the same keys and times give the same shards whatever their order; without references, no
shard exceeds the mean (total / N) by more than the longest case. A case weighs its expected
seconds on this machine; one never run here, the median of those known of its benchmark, else of
all known, or 1 s where none is.

:func:`shard_select` applies it in a run. The times are the medians of this machine's stored runs
of *other* commits (``optbench.run.progress.expected_seconds``), so that shards of one commit
started at once (whose records land while the others still split) and shards on several runners
of one checkout split alike. A shard measures its cases and their references that other shards
hold (:func:`optbench.suite.catalog.with_references`), so that each speedup divides two times of
one run on one GPU; the split and the expected seconds it prints count them. The shard's
cases become the run's selection: an anchored regex of their keys, within ``--select`` where
given. asv's own timed classes (the CPU suite's) are no grid cases: every shard runs them.

:func:`run_on_gpus` starts ``optbench run --shard i/N`` per GPU, each with ``CUDA_VISIBLE_DEVICES``
naming its GPU, a run id of its own and a log file beside its progress file
(``results/<machine>/progress/<run id>.log``), without HTML: that is published once, after the
last one ends.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optbench.store.store import ResultStore


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` as (I, N) with 1 <= I <= N (argparse's type for ``--shard``)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not I/N (e.g. 2/4)")
    index, count = int(match[1]), int(match[2])
    if count < 1 or not 1 <= index <= count:
        raise argparse.ArgumentTypeError(f"{text!r}: I must be within 1..N and N at least 1")
    return index, count


def weights(keys: Iterable[str], seconds: Mapping[str, float]) -> dict[str, float]:
    """Each key's expected seconds from ``seconds``; a key without any, the median of those of
    ``keys`` of its benchmark that have one (a variant first run at a size weighs what that size's
    steps take: the 1B's tens of seconds, not a kernel's few), else of all that have one, or 1.0
    where none has."""
    keys = list(keys)
    known: dict[str, list[float]] = {}
    for k in keys:
        if k in seconds:
            known.setdefault(k.split("|")[0], []).append(float(seconds[k]))
    everything = [s for times in known.values() for s in times]
    default = statistics.median(everything) if everything else 1.0

    def guess(key: str) -> float:
        alike = known.get(key.split("|")[0])
        return statistics.median(alike) if alike else default

    return {k: float(seconds[k]) if k in seconds else guess(k) for k in keys}


def split(
    keys: Iterable[str],
    seconds: Mapping[str, float],
    count: int,
    needs: Callable[[str], Iterable[str]] = lambda key: (),
) -> list[list[str]]:
    """``keys`` (distinct) in ``count`` shards by expected ``seconds`` (:func:`weights`): longest
    first, ties by key, each into the shard whose seconds it raises least, the first among equals.
    A case raises a shard's seconds by its own and by those of the keys it ``needs`` (its
    references, measured beside it) that the shard does not hold yet: so a case joins the shard
    that already measures its reference unless another is emptier by more than that reference's
    seconds. Without ``needs``, each case goes into the shard with the fewest seconds so far. Each
    shard's keys in the order of ``keys``."""
    if count < 1:
        raise ValueError(f"shards: {count}, at least 1")
    keys = list(keys)
    weight = weights(keys, seconds)
    held: list[set[str]] = [set() for _ in range(count)]
    load, shard_of = [0.0] * count, {}
    for key in sorted(keys, key=lambda k: (-weight[k], k)):
        measured = dict.fromkeys([key, *(k for k in needs(key) if k in weight)])
        raised = [sum(weight[k] for k in measured if k not in held[i]) for i in range(count)]
        target = min(range(count), key=lambda i: (load[i] + raised[i], i))
        load[target] += raised[target]
        held[target].update(measured)
        shard_of[key] = target
    return [[k for k in keys if shard_of[k] == i] for i in range(count)]


def pattern(keys: Sequence[str]) -> str:
    """A regex (for ``re.search``) that matches exactly the record keys ``keys``; none if empty."""
    return "^(?:" + "|".join(map(re.escape, keys)) + ")$" if keys else "(?!)"


def shard_select(
    shard: tuple[int, int],
    suite: str,
    select: str | None,
    store: ResultStore,
    machine: str,
    commit: str,
    out: IO[str] | None = None,
) -> str:
    """The selection (:func:`pattern`) of shard ``shard`` (I, N) of the cases of ``suite`` that
    ``select`` matches; says on ``out`` (default stdout) how many cases it holds and their expected
    seconds, beside every shard's. The runs in ``store`` of ``machine``, but for those of
    ``commit``, give the times."""
    from optbench.run import progress
    from optbench.run.compile_cache import COLD
    from optbench.store.settings import current
    from optbench.suite.catalog import BENCHMARKS, with_references

    planned = progress.planned_cases(BENCHMARKS.values(), suite, select)
    runs = (run for c in store.commits(machine) if c != commit for run in store.runs(machine, c))
    seconds = progress.expected_seconds(runs, planned, cold=current().compile_cache == COLD)
    index, count = shard
    owned = split(planned, seconds, count, lambda key: with_references([key], planned))
    shards = [with_references(keys, planned) for keys in owned]
    weight = weights(planned, seconds)
    totals = [sum(weight[k] for k in s) for s in shards]
    mine, own = shards[index - 1], owned[index - 1]
    print(
        f"optbench: shard {index}/{count}: {len(own)} of {len(planned)} cases and "
        f"{len(mine) - len(own)} of their references, expected ~{totals[index - 1]:.0f} s "
        f"(every shard: {', '.join(f'{t:.0f}' for t in totals)} s; "
        f"{len(planned) - len(seconds)} cases never run here counted at their benchmark's "
        "median)",
        file=out or sys.stdout,
        flush=True,
    )
    return pattern(mine)


def gpu_indices(spec: str, available: int) -> list[int]:
    """The GPU indices ``spec`` names: 'all' (0..available-1) or distinct indices '0,1,2' below
    ``available``; ValueError saying why otherwise."""
    if available < 1:
        raise ValueError("no CUDA GPU visible here")
    if spec.strip() == "all":
        return list(range(available))
    try:
        indices = [int(part) for part in spec.split(",")]
    except ValueError:
        raise ValueError(f"{spec!r} is not 'all' nor GPU indices such as 0,1,2") from None
    if any(not 0 <= i < available for i in indices) or len(set(indices)) != len(indices):
        raise ValueError(f"{spec!r}: indices must be distinct, within 0..{available - 1}")
    return indices


def without_option(argv: Sequence[str], option: str) -> list[str]:
    """``argv`` less ``option`` and its value (``--opt V``, ``--opt=V``, or an abbreviation that
    argparse took for it)."""
    out, skip = [], False
    for arg in argv:
        name = arg.split("=", 1)[0]
        if skip:
            skip = False
        elif len(name) > 2 and name.startswith("--") and option.startswith(name):
            skip = "=" not in arg
        else:
            out.append(arg)
    return out


# How long past its --time-budget a shard may run (its last case ending, asv writing its results)
# before it is interrupted (SIGINT: the run records what it stopped), and how long it then has
# before it is killed: a shard that hangs must not keep every shard's results from coming back.
STOP_GRACE_S, KILL_AFTER_S = 60.0, 30.0


def _wait(proc: Any, deadline: float | None, label: str) -> int:
    """``proc``'s exit status; where ``deadline`` (time.monotonic) passes first, interrupted, then
    killed :data:`KILL_AFTER_S` later."""
    if deadline is None:
        return proc.wait()
    try:
        return proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        print(
            f"optbench: {label} still runs {STOP_GRACE_S:g} s past its time budget: interrupted",
            flush=True,
        )
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        print(f"optbench: {label} did not end {KILL_AFTER_S:g} s after it: killed", flush=True)
        proc.kill()
        return proc.wait()


def cuda_device_count() -> int:
    """The CUDA devices this process sees (imports torch)."""
    import torch

    return torch.cuda.device_count()


def run_on_gpus(
    argv: Sequence[str],
    spec: str,
    *,
    emulate: str | None = None,
    prepare: Callable[[], Any] | None = None,
    publish: Callable[[], Any] | None = None,
    device_count: Callable[[], int] | None = None,
    start: Callable[..., Any] = subprocess.Popen,
    env: Mapping[str, str] | None = None,
    root: Path | None = None,
    machine: str | None = None,
    new_run_id: Callable[[], str] | None = None,
    time_budget: float | None = None,
) -> int:
    """``optbench run ARGV`` with ``--gpus SPEC``: one shard per GPU that ``spec`` names
    (:func:`gpu_indices`), each ``python -m optbench run ARGV --shard i/N --no-html`` (``ARGV``
    less ``--gpus``) started by ``start`` (Popen's signature) in ``root`` (default the
    repository) with ``env`` (default this process's) plus ``CUDA_VISIBLE_DEVICES`` naming its
    GPU (the i-th of ``env``'s ``CUDA_VISIBLE_DEVICES`` where set), ``OPTBENCH_RUN_ID`` a run
    id of its own (``new_run_id``) and ``OPTBENCH_RUNS_AT_ONCE`` the number of shards (each
    record's machine info says so), its output into its log file, after ``prepare`` where given
    (what the shards would otherwise each do at once: asv's machine file). Says where each went,
    waits for them all (with ``time_budget``, ARGV's ``--time-budget``, a shard still running
    :data:`STOP_GRACE_S` past it is interrupted, then killed), then calls ``publish`` (the HTML,
    once for every shard) where given. Returns the first non-zero exit status among them, else
    0; 2, with one line, where ``spec`` names no GPU here. ``device_count``: how many GPUs this
    process sees (default :func:`cuda_device_count`); ``machine``: the results folder (default
    this machine's, emulating ``emulate`` where given)."""
    from optbench.store import store

    env = dict(os.environ if env is None else env)
    try:
        gpus = gpu_indices(spec, (device_count or cuda_device_count)())
    except ValueError as exc:
        print(f"optbench run: --gpus {spec}: {exc}", file=sys.stderr)
        return 2
    root = root or store.REPO_ROOT
    if prepare is not None:
        prepare()
    if machine is None:
        from optbench.measure.machine import machine_name

        machine = machine_name(emulate=emulate)
    logs = root / "results" / machine / "progress"
    logs.mkdir(parents=True, exist_ok=True)
    children = _start_shards(argv, gpus, start, env, root, logs, new_run_id or store.new_run_id)
    codes = _wait_for_shards(children, len(gpus), time_budget)
    for (n, gpu, run_id, log, _), code in zip(children, codes):
        print(
            f"optbench: shard {n}/{len(gpus)} on GPU {gpu} (run {run_id}) ended with exit "
            f"{code}; log {log}",
            flush=True,
        )
    if publish is not None:
        publish()
    return next((c for c in codes if c), 0)


#: A started shard: its number (from 1), its GPU, run id, log file and process.
Shard = tuple[int, int, str, Path, Any]


def _start_shards(
    argv: Sequence[str],
    gpus: list[int],
    start: Callable[..., Any],
    env: Mapping[str, str],
    root: Path,
    logs: Path,
    new_run_id: Callable[[], str],
) -> list[Shard]:
    """Start ``optbench run ARGV --shard i/N --no-html`` on each of ``gpus`` (:func:`run_on_gpus`),
    each with its GPU, run id and log file in ``logs``, and say where each went."""
    visible = env["CUDA_VISIBLE_DEVICES"].split(",") if env.get("CUDA_VISIBLE_DEVICES") else None
    children = []
    for n, gpu in enumerate(gpus, 1):
        run_id = new_run_id()
        log = logs / f"{run_id}.log"
        command = [
            sys.executable,
            "-m",
            "optbench",
            "run",
            *without_option(argv, "--gpus"),
            "--shard",
            f"{n}/{len(gpus)}",
            "--no-html",
        ]
        device = visible[gpu].strip() if visible else str(gpu)
        child_env = {
            **env,
            "CUDA_VISIBLE_DEVICES": device,
            "OPTBENCH_RUN_ID": run_id,
            "OPTBENCH_RUNS_AT_ONCE": str(len(gpus)),
        }
        with open(log, "w", encoding="utf-8") as f:
            proc = start(command, cwd=root, env=child_env, stdout=f, stderr=subprocess.STDOUT)
        children.append((n, gpu, run_id, log, proc))
        print(f"optbench: shard {n}/{len(gpus)} on GPU {gpu}: run {run_id}, log {log}", flush=True)
    return children


def _wait_for_shards(children: list[Shard], count: int, time_budget: float | None) -> list[int]:
    """Each shard's exit status, in order (with ``time_budget``, one still running
    :data:`STOP_GRACE_S` past it is interrupted, then killed: :func:`_wait`). On an interrupt here,
    which the shards got too, waits for them all to end, then raises it."""
    deadline = None if time_budget is None else time.monotonic() + time_budget + STOP_GRACE_S
    try:
        return [
            _wait(proc, deadline, f"shard {n}/{count} on GPU {gpu}")
            for n, gpu, *_, proc in children
        ]
    except BaseException:  # an interrupt: the children got it too; let them end
        for *_, proc in children:
            proc.wait()
        raise
