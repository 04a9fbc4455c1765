"""Runs a grid of benchmark cases: each is checked against its baseline, then timed and sized.

A case that the machine cannot run is *skipped* with its reason; a wrong result is recorded as
*wrong* and never timed; an out-of-memory error, a case over its time budget or any other error is
recorded as such and the grid goes on; a case that the alarm cannot interrupt (blocked in C code) is
stopped by a :func:`watchdog`, which ends the process if it must. A case that the run's time budget
cuts short is not measured, and not stored. A case that leaves the CUDA context unusable (an illegal
memory access) is recorded as *crashed*, and the cases after it as not measured: the grid returns
what it measured, so that asv still reports the rest. An interrupt (SIGINT, or SIGTERM: Ctrl-C, a
cancel, the end of the parent process, :func:`die_with_parent`) stops the grid: the case it stopped
is recorded as *interrupted*, the run is marked partial
(:meth:`optbench.store.store.ResultStore.mark_partial`) and the interrupt goes on up. Every record
is saved to the result store as soon as it exists, so a run that dies keeps what it measured. A
record holds the seconds of each phase of its case (``build_seconds`` with its
``build_compile_seconds``, ``check_seconds``, ``compile_seconds``: torch.compile's seconds in the
build and the check, what the case costs to compile; ``timing_seconds`` with its
``timing_compile_seconds``, ``memory_seconds``, ``free_seconds``: giving back what it held); each
case's start and end, with those seconds, also go to the run's progress file
(:mod:`optbench.run.progress`), which ``optbench run`` follows. On a GPU a record also holds its
case's own ``memory`` (:class:`optbench.measure.memory.CaseMeter`: the peak over its build, warm-up
and timing, not its check; what stays resident) beside each metric's per-call peak.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import glob
import math
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from optbench.measure.signals import Interrupted, interruptible
from optbench.run import progress
from optbench.store import settings
from optbench.store.records import INTERRUPTED, NOT_MEASURED
from optbench.store.store import (
    IN_PROGRESS,
    MACHINE_KEY,
    REPO_ROOT,
    ResultStore,
    current_run_id,
    record_key,
)


class WrongResult(AssertionError):
    """An optimization disagrees with its baseline beyond tolerance: it must not be timed."""


@dataclass
class Work:
    """What one case measures once its inputs are built.

    ``timed`` maps a metric name (e.g. ``"fwd"``, ``"fwdbwd"``, ``"step"``) to the callable timed
    for it; ``rotation`` maps a metric to that callable over each of several input sets (``timed``'s
    first), which the device time rotates over for a cold L2
    (:func:`optbench.measure.timing.measure`; the first set alone gives the warm-L2 figure); a
    metric without one is timed on its one callable; ``memory`` names the metrics whose peak extra
    memory is measured (after ``before_memory``, e.g. dropping gradients so that their allocation
    counts, and with the bytes already allocated recorded beside it as ``mem_base_bytes``, of which
    ``mem_before_bytes`` were allocated before the case was built: what earlier cases of the process
    left); ``check`` runs before any timing and raises :class:`WrongResult` when the result is
    wrong; ``flops``/``bytes`` per metric feed the roofline (floor) at report time; ``info`` is
    free-form (dtype, tokens per call, ...); ``timing`` overrides the timer's warm-up and sampling
    budgets per metric (:func:`optbench.measure.timing.measure`); ``measured`` maps a metric to a
    timing taken outside this process (a ``Measurement.to_dict()``, e.g. by the ranks of a torchrun
    launch, ``optbench.suite.distributed``), stored as it is beside those of ``timed``;
    ``checked_in`` names an earlier run of the same commit whose check stands for this case's
    (``Settings.checked_in``: the case built no check), stored as the record's ``checked_in``.
    """

    timed: dict[str, Callable[[], Any]]
    check: Callable[[], Mapping[str, Any]] | None = None
    memory: tuple[str, ...] = ()
    flops: dict[str, float] = field(default_factory=dict)
    bytes: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    graph: bool = True
    before_memory: Callable[[], None] | None = None
    # metric -> keywords of timing.measure
    timing: dict[str, dict[str, Any]] = field(default_factory=dict)
    # metric -> one per set
    rotation: dict[str, tuple[Callable[[], Any], ...]] = field(default_factory=dict)
    # metric -> Measurement.to_dict()
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the run of this commit whose check of this case stands for this one's (check is then None)
    checked_in: str | None = None


@dataclass
class Case:
    """One parameter combination; ``build`` raises NotImplementedError(reason) to skip."""

    params: dict[str, str]
    build: Callable[[], Work]


# Paths whose changes leave the measured code as it was: results, docs and notes committed after a
# run.
UNMEASURED_PATHS = ("results", "docs", "NOTES.md", "README.md")


def measured_commit(ref: str = "HEAD", cwd: str | Path = REPO_ROOT) -> str:
    """The newest commit at or before ``ref`` that changed anything outside
    :data:`UNMEASURED_PATHS`: the commit whose code ``ref`` measures. Results are stored under it,
    so runs of one code state in several sessions add up even where results or notes were committed
    between them."""
    excludes = [f":(exclude){path}" for path in UNMEASURED_PATHS]
    out = subprocess.run(
        ["git", "log", "-1", "--format=%H", ref, "--", ".", *excludes],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def current_commit() -> str:
    """The commit being measured: asv's ``ASV_COMMIT``, else :func:`measured_commit` of HEAD, else
    'unknown'."""
    if settings.current().asv_commit:
        return settings.current().asv_commit
    try:
        return measured_commit() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def current_machine() -> str:
    """Results-folder name of this machine: the run's (``optbench run`` sets it), else under a plain
    ``asv run`` asv's machine (:func:`asv_machine`), else detected."""
    from optbench.measure.machine import machine_name

    current = settings.current()
    if current.machine:
        return current.machine
    return (asv_machine() if current.asv else None) or machine_name(emulate=current.emulate)


def asv_machine(path: Path | None = None) -> str | None:
    """The machine a plain ``asv run`` stores under: the one machine of asv's machine file
    (``~/.asv-machine.json``), so that optbench's records of that run sit beside asv's; None where
    the file names none or several."""
    import json

    path = path or Path.home() / ".asv-machine.json"
    try:
        machines = [k for k in json.loads(path.read_text()) if k != "version"]
    except (OSError, ValueError):
        return None
    return machines[0] if len(machines) == 1 else None


def default_device() -> str:
    """'cuda' where a GPU is visible, else 'cpu' (imports torch)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _allocated(device: str) -> int | None:
    """Bytes allocated on ``device`` now (CUDA), else None."""
    import torch

    return torch.cuda.memory_allocated() if str(device).startswith("cuda") else None


def _free_device_memory(baseline: int | None = None) -> None:
    """Give back what a case left on the device. Reference counting has freed its acyclic garbage
    already; the collector (a full pass costs 0.1-0.3 s in a process that has imported inductor)
    runs only where the bytes allocated stay above ``baseline`` (those at the case's start; None:
    always), as when a cycle holds a model. Then the allocator's cached blocks go back to the
    driver."""
    import gc

    import torch

    if (
        baseline is None
        or not torch.cuda.is_available()
        or torch.cuda.memory_allocated() > baseline
    ):
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def exception_notes(exc: BaseException) -> list[str]:
    """What the case's own code added to ``exc`` on its way out (a launch: how far its ranks got),
    and to the exceptions it replaced (a timeout raised again while the first was handled)."""
    notes, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        notes.extend(getattr(exc, "__notes__", []))
        exc = exc.__context__
    return notes


class CaseTimeout(BaseException):
    """A case ran past its time budget (raised from SIGALRM, wherever the case's Python code was).

    A BaseException, as KeyboardInterrupt is, so that library code's ``except Exception`` does not
    swallow it: inductor's max-autotune treats a failing choice as slow and goes on, so an Exception
    raised inside its autotuning would only skip that choice and the compile would run on far past
    the budget."""


_REFIRE_S = 5.0  # if library code swallows the first CaseTimeout, it is raised again this often


@contextmanager
def deadline(seconds: float, what: str = "its budget") -> Iterator[None]:
    """Raise :class:`CaseTimeout` in the code running inside once ``seconds`` have passed, and every
    few seconds after, until it leaves. Interrupts Python-level work (compilation, autotuning,
    timing loops), not a kernel already running nor a wait in C code (:func:`watchdog` stops those);
    a no-op off the main thread or without ``setitimer``. An outer timer (e.g. a harness's own) is
    re-armed with what remains of it."""
    if (
        seconds <= 0
        or not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"over {what} of {seconds:g} s")

    outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
    previous = signal.signal(signal.SIGALRM, expire)
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, seconds, _REFIRE_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - start), 1e-3))


# How long past its budget a case may run before the watchdog kills this process's child processes,
# and as long again before it ends the process. The alarm re-fires every few seconds, so a case
# still running this long after its budget is blocked in C code (e.g. waiting on inductor's compile
# workers). Twice this is the 60 s that ``optbench run --time-budget`` keeps after the run's
# deadline (cli.ASV_WRAP_UP_S), so that a case cut by the run's deadline ends within the time budget
# even then.
HARD_STOP_GRACE_S = 30.0
# the exit status of a process that the watchdog ended (coreutils' timeout uses it too)
HARD_STOP_EXIT = 124
# in the reason of a case the watchdog ended its process in (what optbench.suite.grids looks for)
PROCESS_ENDED = "the process was ended"
WATCHDOG_THREAD = "optbench-watchdog"


@contextmanager
def watchdog(seconds: float, hard_stop: Callable[[], None]) -> Iterator[list[int]]:
    """Hard stop of code that :func:`deadline`'s alarm cannot interrupt, as when the main thread
    waits in C on inductor's compile workers. :data:`HARD_STOP_GRACE_S` after ``seconds`` a thread
    kills this process's child processes (which unblocks a wait on them, so that the alarm lands);
    if the code is still running as long after that, it calls ``hard_stop`` and ends the process
    with :data:`HARD_STOP_EXIT`. Yields the ids of the processes it killed; the thread is stopped
    when the code leaves. A no-op for ``seconds <= 0``."""
    killed: list[int] = []
    if seconds <= 0:
        yield killed
        return
    done = threading.Event()

    def watch() -> None:
        if done.wait(seconds + HARD_STOP_GRACE_S):
            return
        killed.extend(_kill_child_processes())
        if done.wait(HARD_STOP_GRACE_S):
            return
        try:
            hard_stop()
        finally:
            print(
                f"optbench: ended the process: a case ran {2 * HARD_STOP_GRACE_S:g} s past its "
                f"budget of {seconds:g} s and the alarm could not interrupt it",
                file=sys.stderr,
                flush=True,
            )
            os._exit(HARD_STOP_EXIT)

    thread = threading.Thread(target=watch, name=WATCHDOG_THREAD, daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        done.set()
        thread.join()


def _children(pid: int) -> list[int]:
    """Ids of the child processes of ``pid``: from /proc, else (a kernel that does not list them)
    ``pgrep -P``."""
    listed = glob.glob(f"/proc/{pid}/task/*/children")
    if not listed:
        try:
            return [
                int(c)
                for c in subprocess.run(
                    ["pgrep", "-P", str(pid)], capture_output=True
                ).stdout.split()
            ]
        except OSError:
            return []
    children: list[int] = []
    for path in listed:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            children += [int(c) for c in Path(path).read_text().split()]
    return children


def _kill_child_processes() -> list[int]:
    """SIGKILL the processes below this one (children, theirs, ...); returns their ids."""
    found, parents = [], [os.getpid()]
    while parents:
        children = _children(parents.pop())
        found += children
        parents += children
    for pid in found:
        with contextlib.suppress(OSError):  # already gone
            os.kill(pid, signal.SIGKILL)
    return found


def _restart_compile_workers() -> None:
    """After the watchdog killed inductor's compile workers, whose pool then stays closed: have
    inductor start new ones for later cases."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is not None:
        async_compile.shutdown_compile_workers()


# Epoch seconds after which no case of this run starts and a running one is stopped (``optbench run
# --time-budget``): the run ends in time for asv to write its results, inside a runner's job limit.
RUN_DEADLINE_ENV = settings.VARIABLES["deadline"]
# A case is not started with less than this (or its own budget, where smaller) left of the run's
# time budget: cut short, it would show nothing. Small beside a case's budget (120-180 s), so that
# little of a run's budget goes unused, and large enough for a kernel case or an eager step up to 1B
# on an H100.
_MIN_CASE_S = 30.0


def run_time_left() -> float | None:
    """Seconds left of the run's time budget; None without one."""
    deadline = settings.current().deadline
    return deadline - time.time() if deadline is not None else None


def out_of_run_time(budget_s: float = math.inf) -> bool:
    """Whether too little of the run's time budget is left to start a case of ``budget_s`` seconds:
    less than
    :data:`_MIN_CASE_S` or ``budget_s``, whichever is smaller."""
    left = run_time_left()
    return left is not None and left < min(budget_s, _MIN_CASE_S)


NOT_STARTED = f"{NOT_MEASURED}: the run's time budget ended before this case"
CUT_SHORT = NOT_MEASURED + ": the run's time budget ended {seconds:.1f} s into this case"


def measure_case(
    case: Case,
    *,
    device: str,
    budget_s: float,
    budget_name: str = "its budget",
    on_hard_stop: Callable[[dict[str, Any]], Any] | None = None,
    key: str = "",
) -> dict[str, Any]:
    """Build, check, time and size one case within ``budget_s`` seconds; returns its record body
    (status, metrics, ...). A case over its budget, even inside a compilation, is recorded as a
    timeout; where the :func:`watchdog` must end the process, it first passes that record to
    ``on_hard_stop``. In a lockstep pair (:mod:`optbench.measure.lockstep`) each metric is timed in
    turns with the partner, which must be timing the same ``key``; the record's ``lockstep`` says
    on which CPU and whether the pairing held."""
    rec: dict[str, Any] = {
        "params": case.params,
        "status": "ok",
        "metrics": {},
        "peak_mem_bytes": {},
        "mem_base_bytes": {},
    }
    start = time.perf_counter()

    def hard_stop() -> None:
        if on_hard_stop is not None:
            on_hard_stop(
                {
                    **rec,
                    "status": "timeout",
                    "seconds": round(time.perf_counter() - start, 3),
                    "reason": f"over {budget_name} of {budget_s:g} s, and the alarm could not "
                    f"interrupt it: {PROCESS_ENDED} {2 * HARD_STOP_GRACE_S:g} s "
                    "after the budget",
                }
            )

    # outside the deadline, so that a late alarm cannot skip its stop
    with watchdog(budget_s, hard_stop) as killed:
        try:
            with deadline(budget_s, budget_name):
                _build_check_time(case, rec, device, key)
        # raised outside the body (a late alarm): recorded like any timeout
        except CaseTimeout as exc:
            rec.update(status="timeout", reason=str(exc))
    if killed:
        _restart_compile_workers()
        rec["reason"] = (
            f"{rec.get('reason', rec['status'])}; the alarm could not interrupt it until its child "
            f"processes ({len(killed)}) were killed, {HARD_STOP_GRACE_S:g} s after the budget"
        )
    rec["seconds"] = round(time.perf_counter() - start, 3)
    return rec


def compile_seconds() -> float | None:
    """Seconds torch.compile has spent compiling in this process so far: dynamo's frame compiles
    (inductor's forward graphs and their autotuning inside) and the backward graphs compiled at a
    first backward, by torch's own timers (``torch._dynamo.utils.compilation_time_metrics``); 0
    before dynamo is loaded, None where those timers hold entries but none of these (a torch that
    names them otherwise)."""
    utils = sys.modules.get("torch._dynamo.utils")
    metrics = getattr(utils, "compilation_time_metrics", None)
    if not metrics:
        return 0.0
    found = [
        sum(times)
        for name, times in list(metrics.items())
        if name.endswith("compile_inner") or name.endswith("_backward_impl")
    ]
    return sum(found) if found else None


@contextmanager
def timed_phase(
    rec: dict[str, Any], field: str, compile_field: str | None = None
) -> Iterator[None]:
    """Add the seconds the code inside takes to ``rec[field]`` (also where it raises), and where
    ``compile_field`` is given, the seconds torch.compile spent compiling in it
    (:func:`compile_seconds`) to ``rec[compile_field]``."""
    compiled, t0 = (compile_seconds() if compile_field else None), time.perf_counter()
    try:
        yield
    finally:
        rec[field] = round(rec.get(field, 0.0) + time.perf_counter() - t0, 3)
        now = compile_seconds() if compile_field else None
        if compile_field and compiled is not None and now is not None:
            rec[compile_field] = round(rec.get(compile_field, 0.0) + now - compiled, 3)


def _check(work: Work, rec: dict[str, Any]) -> None:
    """The case's check, with its compilation and autotuning, into ``rec``; where an earlier run
    checked the case (``work.checked_in``, named in ``rec``), one call of each timed callable
    compiles it here instead, so that compile_seconds count the same work either way."""
    if work.checked_in is not None:
        rec["checked_in"] = work.checked_in
    with timed_phase(rec, "check_seconds", compile_field="compile_seconds"):
        if work.check is not None:
            rec["check"] = dict(work.check())
        else:
            for fn in work.timed.values():
                fn()


def _build_check_time(case: Case, rec: dict[str, Any], device: str, key: str) -> None:
    from optbench.measure.lockstep import partner
    from optbench.measure.machine import gpu_state
    from optbench.measure.memory import CaseMeter, peak_memory
    from optbench.measure.timing import measure

    work, phase, baseline = None, "build", _allocated(device)
    if partner() is not None:  # the whole record, whatever its end, is the paired design's
        rec["lockstep"] = {}
    # what earlier cases of this process still hold: not this case's own memory
    if baseline is not None:
        rec["mem_before_bytes"] = baseline
    try:
        # inputs, models, references
        with timed_phase(rec, "build_seconds", compile_field="build_compile_seconds"):
            meter = CaseMeter(device)  # (a process's first case makes CUDA's context here)
            with meter.metering(), meter.counting():
                # (a step captured in a CUDA graph compiles here, in its warm-up calls)
                work = case.build()
        rec["compile_seconds"] = rec.get("build_compile_seconds", 0.0)
        rec.update(flops=work.flops, bytes=work.bytes, info=work.info)
        if work.check is not None or work.checked_in is not None:
            phase = "check"
            _check(work, rec)
        # by name: a callable bound to a name here would hold the case's model or inputs (device
        # memory) past `del work` until this frame ends, after the memory is given back
        for name in work.timed:
            phase = f"timing {name!r}"
            pair = partner()
            with (
                timed_phase(rec, "timing_seconds", compile_field="timing_compile_seconds"),
                meter.counting(),
                pair.session(f"{key} {name}") if pair else nullcontext() as turns,
            ):
                rec["metrics"][name] = measure(
                    work.rotation.get(name, work.timed[name]),
                    device=device,
                    graph=work.graph,
                    turns=turns,
                    **work.timing.get(name, {}),
                ).to_dict()
                if pair is not None and turns is not None:
                    rec["lockstep"][name] = {"cpu": pair.cpu, "paired": turns.paired}
                # the clock, power and heat the figure was taken at
                if str(device).startswith("cuda"):
                    rec.setdefault("gpu_state", {})[name] = gpu_state()
            if name in work.memory:
                with timed_phase(rec, "memory_seconds"):
                    if work.before_memory is not None:
                        work.before_memory()
                    rec["mem_base_bytes"][name] = _allocated(device)
                    rec["peak_mem_bytes"][name] = peak_memory(work.timed[name], device=device)
        if work.timed:  # a case timed elsewhere only (work.measured) used no memory here
            rec["memory"] = meter.result()
        rec["metrics"].update(work.measured)  # timed elsewhere (after the check passed there)
    except (Exception, CaseTimeout) as exc:  # noqa: BLE001 - recorded, the grid goes on
        rec.update(_failure(exc, phase))
    finally:
        with timed_phase(rec, "free_seconds"):
            del work
            try:
                _free_device_memory(baseline)
            except CaseTimeout:
                raise
            # e.g. an illegal memory access: the CUDA context is gone
            except Exception as exc:  # noqa: BLE001
                rec.update(
                    status="crashed",
                    context_lost=True,
                    reason=(
                        f"the CUDA context became unusable in this case: {type(exc).__name__}: "
                        f"{exc}"
                    )[:1000],
                )


def _failure(exc: BaseException, phase: str) -> dict[str, Any]:
    """The record fields of a case that raised ``exc`` in its ``phase`` (called where it is
    caught): its status (skipped, wrong, timeout, oom or error), its reason and what explains
    it."""
    if isinstance(exc, NotImplementedError):
        return {"status": "skipped", "reason": str(exc) or type(exc).__name__}
    if isinstance(exc, WrongResult):
        return {"status": "wrong", "reason": str(exc)}
    if isinstance(exc, CaseTimeout):
        notes = exception_notes(exc)
        reason = "; ".join([f"{exc}, in its {phase}", *notes])
        return {
            "status": "timeout",
            "reason": reason,
            **({"timeout_notes": notes} if notes else {}),
        }
    if _is_oom(exc):
        # the allocator's whole account (allocated, in private pools, reserved but unused) stays
        # beside the short reason: what explains an OOM where the case fitted before
        message = (str(exc).splitlines() or [type(exc).__name__])[0]
        return {
            "status": "oom",
            "reason": f"{message[:300]}, in its {phase}",
            "oom_message": message[:2000],
        }
    return {
        "status": "error",
        "reason": f"{type(exc).__name__}: {exc}"[:2000],
        "traceback": traceback.format_exc()[-4000:],
    }


def interrupt_reason(exc: KeyboardInterrupt, key: str | None, seconds: float | None) -> str:
    """What an interrupt record says: the signal (KeyboardInterrupt where none is known) and the
    case it stopped, with how long that case had run, or that it came between cases."""
    what = f"interrupted by {exc.signal if isinstance(exc, Interrupted) else 'KeyboardInterrupt'}"
    return f"{what} {seconds:.1f} s into {key}" if key is not None else f"{what} between cases"


def run_grid(
    benchmark: str,
    cases: Iterable[Case],
    *,
    device: str | None = None,
    budget_s: float = 120.0,
    store: ResultStore | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """Measure every case of ``benchmark`` and save each record as it comes; returns records by
    key."""

    from optbench.measure.emulate import apply_emulation
    from optbench.measure.machine import machine_info

    device = device or default_device()
    if str(device).startswith("cuda"):
        # caps memory and features to an emulated target's (no-op without OPTBENCH_EMULATE)
        apply_emulation()
    store = store or ResultStore()
    commit, machine = current_commit(), current_machine()
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    info = machine_info()
    info["emulate"] = settings.current().emulate
    run = current_run_id()
    store.save(
        machine,
        commit,
        [{"key": MACHINE_KEY, "info": info, "date": now, "commit": commit, "run": run}],
    )
    records: dict[str, dict[str, Any]] = {}
    running: list[tuple[str, float]] = []  # the case measured now (key, start), until it is stored
    try:
        with interruptible():
            shared = {
                "benchmark": benchmark,
                "commit": commit,
                "machine": machine,
                "date": now,
                "run": run,
                "pid": os.getpid(),
            }
            _run_cases(
                benchmark,
                cases,
                shared=shared,
                device=device,
                budget_s=budget_s,
                store=store,
                log=log,
                records=records,
                running=running,
            )
    except KeyboardInterrupt as exc:
        key, seconds = None, None
        if running:
            key, seconds = running[0][0], time.perf_counter() - running[0][1]
        reason = interrupt_reason(exc, key, seconds)
        store.mark_partial(machine, commit, reason, [key] if key is not None else [])
        if key is not None:
            progress.case_ended(
                key,
                benchmark,
                {"status": INTERRUPTED, "reason": reason},
                measured={"seconds": round(seconds or 0.0, 3)},
            )
        log(f"{benchmark}: {reason}; the run is partial")
        raise
    return records


def _run_cases(
    benchmark: str,
    cases: Iterable[Case],
    *,
    shared: dict[str, Any],
    device: str,
    budget_s: float,
    store: ResultStore,
    log: Callable[[str], None],
    records: dict[str, dict[str, Any]],
    running: list[tuple[str, float]],
) -> None:
    """The loop of :func:`run_grid`: each case's record into ``records`` (``shared``: the fields
    every record of the grid shares); ``running`` holds the case whose record is not stored yet,
    with its start."""
    commit, machine = shared["commit"], shared["machine"]
    lost_in: str | None = None  # the case after which this process can no longer use the GPU
    for case in cases:
        key = record_key(benchmark, case.params)
        progress.process_started(benchmark)  # this process's start-up ends at its first case
        head = {"key": key, **shared}
        # not stored, as an unselected case is not: a later run measures it
        if out_of_run_time(budget_s):
            records[key] = {
                **head,
                "params": case.params,
                "status": "skipped",
                "reason": NOT_STARTED,
            }
            progress.case_ended(key, benchmark, records[key])
            log(f"{key}: skipped {NOT_STARTED}")
            continue
        # stored, so that a later run of the grid (or a --select of it) can fill them in
        if lost_in is not None:
            rec = {
                **head,
                "params": case.params,
                "status": "crashed",
                "reason": f"{NOT_MEASURED}: the CUDA context was lost in {lost_in}",
            }
            store.save(machine, commit, [rec])
            records[key] = rec
            progress.case_ended(key, benchmark, rec)
            continue
        running[:] = [(key, time.perf_counter())]
        # Stays in the store only if the process dies inside this case (a CUDA illegal memory access
        # cannot be caught and leaves the context unusable): the next reader sees which case and why
        # the grid stopped. An interrupt replaces it (ResultStore.mark_partial).
        store.save(
            machine,
            commit,
            [
                {
                    **head,
                    "params": case.params,
                    "status": "crashed",
                    "reason": f"{IN_PROGRESS}; later cases of its grid were not measured in "
                    "that run",
                }
            ],
        )
        rec = _measure(benchmark, case, head, device=device, budget_s=budget_s, store=store)
        running.clear()
        records[key] = rec
        if rec.get("context_lost"):
            lost_in = key
        log(f"{key}: {rec['status']} {rec.get('reason', '')[:120]}")


def _measure(
    benchmark: str,
    case: Case,
    head: dict[str, Any],
    *,
    device: str,
    budget_s: float,
    store: ResultStore,
) -> dict[str, Any]:
    """Measure one case within ``budget_s`` (or what is left of the run's time budget, where less)
    and store its record (:func:`_keep`); its start and end go to the run's progress. An interrupt
    goes on up, with no 'end' event (:func:`run_grid` reports it); another exception past the
    measurement's handlers leaves the end :data:`optbench.run.progress.ABORTED`."""
    key = head["key"]
    left = run_time_left()
    cut = left is not None and left < budget_s  # the run's budget ends first
    keep = partial(_keep, store, head, cut=cut)

    def hard_stop(body: dict[str, Any]) -> None:
        progress.case_ended(key, benchmark, keep(body))  # the watchdog ends the process next

    progress.case_started(key, benchmark)
    try:
        budget_name = "what was left of the run's time budget" if cut else "its budget"
        body = measure_case(
            case,
            device=device,
            budget_s=left if cut else budget_s,
            on_hard_stop=hard_stop,
            budget_name=budget_name,
            key=key,
        )
        rec = keep(body)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # past the measurement's handlers: the case ended all the same
        progress.case_ended(key, benchmark, None, exc)
        raise
    progress.case_ended(key, benchmark, rec, measured=body)
    return rec


def _keep(
    store: ResultStore, head: dict[str, Any], body: dict[str, Any], *, cut: bool
) -> dict[str, Any]:
    """Store the record of a measured case and return it. A timeout of a case that the run's time
    budget cut short (``cut``) says nothing about the case: it is not stored, as a case not started
    is not (its placeholder is removed), and is returned as skipped, with what the case said on its
    way out (its timeout's notes: a distributed case's, how far its ranks got)."""
    rec = {**head, **body}
    if cut and rec["status"] == "timeout":
        store.drop(head["machine"], head["commit"], [head["key"]])
        return {
            **head,
            "params": rec["params"],
            "status": "skipped",
            "reason": "; ".join(
                [CUT_SHORT.format(seconds=rec["seconds"]), *rec.get("timeout_notes", [])]
            ),
        }
    store.save(head["machine"], head["commit"], [rec])
    return rec
