"""Compile warm-up: before a run that starts with empty compile caches, the run's cases that
torch.compile builds are each built once in parallel processes, so that inductor's and Triton's
on-disk caches (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``: one pair for every process of a
run, ``optbench.store.settings.process_env``) hold their generated code when the run's serial grid
processes reach them. A case then still traces its model with dynamo, and loads inductor's output
instead of generating and compiling it.

What the warm-up leaves is the code alone, never a choice measured on a shared GPU: inductor's
autotuning of a kernel's launch configs at its first call (``*.best_config`` files in its cache)
timed each config beside the other warm-up processes, so those files are removed once the warm-up
ends (:func:`forget_autotuning`) and the run's first call of each kernel tunes it alone, as in a
cold run; a max-autotune compile, whose choice of matmul template is part of the code it caches, is
not warmed at all.

A warm-up process builds its case the way a round of ``optbench ab`` that reuses a check does
(``Settings.checked_in``: no check and no reference; the run checks every case itself), calls
each of its timed callables once (forward and backward, a graphed step's capture: every compile
its check or timing would make), synchronizes and leaves. It stores nothing and reports nothing
but its exit status: one that fails costs the run only its speed-up, since the serial run
compiles that case itself and reports whatever went wrong there.

Compile seconds in a warmed run's records are those of warm caches: its machine record says
``prewarmed`` (:data:`PREWARMED`), not ``cold``, so ``optbench compare`` does not judge them
(``optbench run --no-prewarm`` measures cold compiles).

Processes run at once up to :data:`THREADS_PER_PROCESS` CPUs each (inductor's compile workers
take that many) and as the cases' device-memory estimates (``optbench.suite.memory_estimate``)
fit in the usable memory, those that took longest in earlier cold runs first; a process that
outlasts :data:`CASE_LIMIT_S` or the warm-up's share of the run's time budget
(:data:`BUDGET_SHARE`) is ended.

    python -m optbench.suite.prewarm KEY     (one warm-up process: what :func:`warm` starts)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from optbench.store.settings import VARIABLES
from optbench.store.store import split_key
from optbench.suite import catalog

#: info.compile_cache of a run whose caches started empty and were filled by its warm-up
PREWARMED = "prewarmed"
#: CPUs per warm-up process: its own work, and inductor's compile workers
THREADS_PER_PROCESS = 2
#: device bytes a warm-up process holds beside its case's estimate: CUDA's context, inductor's
#: autotuning buffers
PROCESS_BYTES = 2e9
#: the longest a warm-up process may take (a cold 1B compile takes 20-30 s on an H200)
CASE_LIMIT_S = 240.0
#: the most of a run's time budget (what is left of it when the warm-up starts) the warm-up takes
BUDGET_SHARE = 0.25
#: a warm-up process's checked_in setting: the run itself checks every case
RUN_CHECKS = "the run itself"
POLL_S = 0.2


def compiles(key: str, device: str) -> bool:
    """Whether the grid case ``key`` builds anything with torch.compile on ``device`` that a
    warm-up may compile first: a kernel case of impl 'compile', a training step whose options
    compile (those a variant adds to its baseline included) in a mode that autotunes no matmul
    templates (not max-autotune)."""
    name, params = split_key(key)
    entry = catalog.benchmark(name)
    if entry.kind == "kernel":
        return params.get("impl") == "compile"
    if entry.kind != "step":
        return False
    from models.step import UnsupportedOptions
    from optbench.suite.workloads import step_options

    try:
        mode = step_options(entry.size, params["variant"], device)[1].compile
    except (UnsupportedOptions, ValueError, KeyError):
        return False
    return mode is not None and "max-autotune" not in mode


def skip_reason(key: str, profile) -> str | None:
    """Why the run will skip grid case ``key`` on hardware ``profile``
    (``optbench.suite.plan.skip_reason``), without building it; None where it runs."""
    from optbench.suite.plan import skip_reason as plan_skip_reason

    return plan_skip_reason(profile, *split_key(key))


def wanted(
    cache_label: str | None, cache_empty: bool, device: str, keys: list[str], profile
) -> list[str]:
    """The cases of ``keys`` a run should warm up: those that compile (:func:`compiles`) and that
    it does not skip on ``profile`` (:func:`skip_reason`), where the run is on a GPU, its caches
    start empty (its ``Settings.compile_cache`` 'cold', or unset with ``cache_empty``) and two or
    more of its cases are such (one gains nothing from running alone first)."""
    from optbench.run.compile_cache import COLD

    cold = cache_label == COLD or (cache_label is None and cache_empty)
    if not cold or not device.startswith("cuda"):
        return []
    chosen = [key for key in keys if compiles(key, device) and skip_reason(key, profile) is None]
    return chosen if len(chosen) > 1 else []


@dataclass
class Warmup:
    """What a warm-up did: its seconds, the cases whose process ended well, and those that did not
    (key -> why: the exit status or the limit, and the last line of its output); each process's
    seconds."""

    seconds: float = 0.0
    warmed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    took: dict[str, float] = field(default_factory=dict)

    def line(self, processes: int) -> str:
        """The console's line of this warm-up, ``processes`` at a time."""
        text = (
            f"optbench: compile warm-up: {len(self.warmed)} of "
            f"{len(self.warmed) + len(self.failed)} compiled cases built, {processes} at a time, "
            f"in {self.seconds:.1f} s"
        )
        if self.took:
            longest = max(self.took, key=self.took.__getitem__)
            text += f" (the longest: {longest}, {self.took[longest]:.1f} s)"
        if self.failed:
            first = next(iter(self.failed.items()))
            text += (
                f"; not warmed (each compiles in the run instead): {len(self.failed)}, first "
                f"{first[0]}: {first[1]}"
            )
        return text


def slots(cpus: int | None = None, runs_at_once: int = 1) -> int:
    """How many warm-up processes a run starts at once on ``cpus`` CPUs (default this machine's)
    that it shares with ``runs_at_once`` runs, itself among them (``run --gpus``)."""
    return max(1, (cpus or os.cpu_count() or 1) // (THREADS_PER_PROCESS * max(runs_at_once, 1)))


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a warm-up process: the run's (its caches, code and settings), its check
    left to the run (:data:`RUN_CHECKS`), no progress file (it is not one of the run's cases) and
    :data:`THREADS_PER_PROCESS` compile workers (inductor leaves their count out of its cache
    keys)."""
    out = dict(env)
    out.pop(VARIABLES["progress"], None)
    out[VARIABLES["checked_in"]] = RUN_CHECKS
    out["TORCHINDUCTOR_COMPILE_THREADS"] = str(THREADS_PER_PROCESS)
    out[VARIABLES["prewarm_parent"]] = str(os.getpid())
    return out


def forget_autotuning(inductor_cache: Path) -> int:
    """Remove the launch configs inductor's autotuning chose and kept in ``inductor_cache``
    (``*.best_config``); how many. After a warm-up they were all timed beside other processes."""
    found = list(inductor_cache.rglob("*.best_config")) if inductor_cache.is_dir() else []
    for path in found:
        path.unlink(missing_ok=True)
    return len(found)


def _tail(output: IO[bytes]) -> str:
    """The last non-empty line of a warm-up process's output, cut to 200 characters."""
    output.seek(0)
    lines = [line for line in output.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip()[:200] if lines else "no output"


def warm(
    keys: Iterable[str],
    env: Mapping[str, str],
    *,
    need: Mapping[str, float],
    usable: float,
    processes: int,
    deadline: float | None = None,
    first: Mapping[str, float] | None = None,
    command: Callable[[str], list[str]] | None = None,
    report: Callable[[Warmup, list[str]], None] | None = None,
) -> Warmup:
    """Run a warm-up process for each of ``keys`` (``command(key)``, default ``python -m
    optbench.suite.prewarm KEY``) in ``env`` (:func:`worker_env` of it), at most ``processes`` at
    once and, but for the first, as long as their ``need`` (device bytes) adds up to ``usable`` at
    most; in the order of ``first`` (the longest first: seconds a case took in an earlier cold run),
    then of ``need`` (the largest first); each is ended after :data:`CASE_LIMIT_S` or at
    ``deadline`` (time.time seconds), and none starts after it; every one still running is ended
    where this raises. ``report(result so far, the keys running)`` follows each start and end.
    Then the autotuning they did is forgotten (:func:`forget_autotuning` of the environment's
    ``TORCHINDUCTOR_CACHE_DIR``)."""
    first = first or {}
    pool = _Pool(
        worker_env(env),
        command or (lambda key: [sys.executable, "-m", "optbench.suite.prewarm", key]),
        float("inf") if deadline is None else deadline,
    )
    pending = sorted(keys, key=lambda k: (-first.get(k, 0.0), -need.get(k, 0.0)))
    started = time.time()
    try:
        while pending or pool.running:
            changed = pool.start(pending, need, usable, processes)
            if time.time() >= pool.end:
                pool.result.failed.update(dict.fromkeys(pending, "not started: its time ended"))
                pending.clear()
            time.sleep(POLL_S)
            if (pool.reap() or changed) and report:
                report(pool.result, list(pool.running))
    finally:
        pool.stop()
        if env.get("TORCHINDUCTOR_CACHE_DIR"):
            forget_autotuning(Path(env["TORCHINDUCTOR_CACHE_DIR"]))
    pool.result.seconds = time.time() - started
    return pool.result


@dataclass
class _Pool:
    """:func:`warm`'s processes: those running (key -> process, its start, its output) and what
    the ended ones did."""

    environ: dict[str, str]
    command: Callable[[str], list[str]]
    end: float  # time.time seconds: none starts after it, each still running is ended at it
    running: dict[str, tuple[subprocess.Popen, float, IO[bytes]]] = field(default_factory=dict)
    result: Warmup = field(default_factory=Warmup)

    def start(
        self, pending: list[str], need: Mapping[str, float], usable: float, processes: int
    ) -> bool:
        """Start the processes of ``pending`` (removed from it) that fit, in its order; whether
        any started."""
        in_use = sum(need.get(k, 0.0) for k in self.running)
        began = False
        for key in list(pending):
            if time.time() >= self.end or len(self.running) >= processes:
                break
            if self.running and in_use + need.get(key, 0.0) > usable:
                continue
            output = tempfile.TemporaryFile()
            proc = subprocess.Popen(
                self.command(key), env=self.environ, stdout=output, stderr=output
            )
            self.running[key] = (proc, time.time(), output)
            in_use += need.get(key, 0.0)
            pending.remove(key)
            began = True
        return began

    def reap(self) -> bool:
        """Record each process that ended, or end it past :data:`CASE_LIMIT_S` or the end; whether
        any did."""
        ended = False
        for key, (proc, began, output) in list(self.running.items()):
            code = proc.poll()
            if code is None and time.time() < min(began + CASE_LIMIT_S, self.end):
                continue
            self.result.took[key] = time.time() - began
            if code is None:
                proc.kill()
                proc.wait()
                self.result.failed[key] = f"ended after {time.time() - began:.0f} s"
            elif code == 0:
                self.result.warmed.append(key)
            else:
                self.result.failed[key] = f"exit {code}: {_tail(output)}"
            output.close()
            del self.running[key]
            ended = True
        return ended

    def stop(self) -> None:
        """End every process still running."""
        for proc, _, output in self.running.values():
            proc.kill()
            proc.wait()
            output.close()
        self.running.clear()


def warm_case(key: str) -> None:
    """Build grid case ``key`` here without its check (:data:`RUN_CHECKS` in this process's
    settings) and call each of its timed callables once; then wait for the device."""
    import torch

    from optbench.measure.emulate import apply_emulation
    from optbench.run.runner import default_device
    from optbench.suite.grids import cases

    device = default_device()
    if device.startswith("cuda"):
        apply_emulation()
    name, params = split_key(key)
    entry = catalog.benchmark(name)
    (case,) = cases(name, [[params[p]] for p in entry.param_names], device)
    work = case.build()
    for fn in work.timed.values():
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    """One warm-up process: ``python -m optbench.suite.prewarm KEY``. Leaves without the
    interpreter's teardown (inductor's compile workers, the CUDA context) once its case is
    warmed."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m optbench.suite.prewarm KEY", file=sys.stderr)
        return 2
    from optbench.measure.signals import die_with_parent
    from optbench.store.settings import current

    parent = current().prewarm_parent
    die_with_parent(parent=int(parent) if parent else None)  # before torch's imports
    warm_case(args[0])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
