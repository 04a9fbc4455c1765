"""Live progress of an ``optbench run``: what runs, how many cases are done and left, elapsed time
and ETA.

asv captures a benchmark process's output and prints it only once that process ends, and one process
measures a whole suite (``setup_cache``), so its output cannot show progress. Instead every
benchmark process appends one JSON line per event to the run's progress file (the setting
``progress``, ``$OPTBENCH_PROGRESS``; ``optbench run`` makes it ``results/<machine>/progress/<run
id>.jsonl``), opened in append mode and flushed per line:

- ``{"event": "process", "benchmark", "startup_seconds"}``: once per process, as its first case
  starts. The start-up is the time from the process's start (``/proc/self/stat``, against
  ``/proc/uptime``: 10 ms ticks) to that moment: the interpreter, asv's runner, the imports of the
  benchmark modules and torch, building the grid's cases, the machine info. CUDA's context, made at
  the first allocation, falls in the first case's build.
- ``{"event": "start", "key", "benchmark"}`` before a case and ``{"event": "end", "key", "status",
  "seconds", "build_seconds", "check_seconds", "compile_seconds", ..., "figure"}`` after it,
  whatever its outcome (status ``interrupted`` where an interrupt stopped it; ``aborted`` where it
  raised past the runner's handlers otherwise). A case that the run's time budget left out ends with
  ``"not_started": true`` and no seconds. ``figure`` (an ok case only, :func:`figure`): the median
  ms of each of its metrics by its record's primary clock.

The run's own process appends ``{"event": "prewarm", "seconds", "warmed", "failed"}`` once its
compile warm-up (``optbench.suite.prewarm``) has ended, before any case.

Every event carries ``t`` (Unix time) and ``pid``. The ``optbench run`` process follows the file
while asv runs (:class:`Follower`): on a terminal, a rich progress bar with the running case,
done/total, elapsed time and ETA, and one line per finished case above it; elsewhere (CI logs) the
line per finished case alone (:func:`case_line`). asv's own output goes to a log file, shown as well
where asked for (:func:`run_followed`). Done/total/ETA come from the events by one pure
function, :func:`tally`: the ETA sums, over the cases left, how long each took on this machine
before (:func:`expected_seconds`: the median of its stored records), and for a case never run here
the mean seconds per finished case of this run (it leaves out each process's start-up and asv's own
time). Before a run, :func:`estimate_note` says the same of the whole run and whether its time
budget will likely cut cases.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optbench.run.compile_cache import COLD
from optbench.store import settings

# The fields of a case's record that its 'end' event carries (the phases of
# optbench.run.breakdown).
PHASE_FIELDS = (
    "build_seconds",
    "build_compile_seconds",
    "check_seconds",
    "compile_seconds",
    "timing_seconds",
    "timing_compile_seconds",
    "memory_seconds",
    "free_seconds",
)
ABORTED = "aborted"  # the end of a case whose measurement raised past the runner (not an interrupt)

_warned = False


def emit(event: str, **fields: Any) -> None:
    """Append one event to the run's progress file (no-op where the run has none). A failing write
    warns once on stderr and never stops a measurement."""
    path = settings.current().progress
    if path is not None:
        append_event(path, event, **fields)


def append_event(path: Path, event: str, **fields: Any) -> None:
    """Append one event to the progress file ``path`` (:func:`emit`, for a process that is not
    one of the run's: the run's own, before its cases)."""
    global _warned
    line = json.dumps(
        {"event": event, "t": round(time.time(), 3), "pid": os.getpid(), **fields}, default=str
    )
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
    except OSError as exc:
        if not _warned:
            _warned = True
            print(f"optbench: cannot write progress to {path}: {exc}", file=sys.stderr)


def process_age() -> float | None:
    """Seconds since this process started, by the kernel's clock (``/proc``: 10 ms ticks); None
    without /proc."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        # field 22, starttime (after pid, comm, state)
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        return max(uptime - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


_startup_reported = False


def process_started(benchmark: str) -> None:
    """The 'process' event with this process's start-up, once per process (at its first case)."""
    global _startup_reported
    if _startup_reported:
        return
    _startup_reported = True
    age = process_age()
    emit("process", benchmark=benchmark, startup_seconds=None if age is None else round(age, 3))


def case_started(key: str, benchmark: str) -> None:
    emit("start", key=key, benchmark=benchmark)


def case_ended(
    key: str,
    benchmark: str,
    rec: Mapping[str, Any] | None,
    exc: BaseException | None = None,
    measured: Mapping[str, Any] | None = None,
) -> None:
    """The 'end' event of a case: status and reason from its record ``rec``, seconds and phases from
    what was ``measured`` (the record as measured, before a cut-short case became a skip; default
    ``rec``). Without a record (the measurement raised ``exc``), status :data:`ABORTED`; a case
    without seconds was not started."""
    timed = measured if measured is not None else rec or {}
    status, reason = (
        (rec.get("status"), str(rec.get("reason", "")))
        if rec is not None
        else (ABORTED, f"{type(exc).__name__}: {exc}" if exc is not None else "")
    )
    shown = figure(rec) if rec is not None else None
    emit(
        "end",
        key=key,
        benchmark=benchmark,
        status=status,
        seconds=timed.get("seconds"),
        reason=reason[:300],
        **({"not_started": True} if timed.get("seconds") is None and rec is not None else {}),
        **{f: timed[f] for f in PHASE_FIELDS if timed.get(f) is not None},
        **({"figure": shown} if shown else {}),
    )


def figure(rec: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a case's line shows of its record ``rec``: ``{"clock", "ms": {metric: median ms}}``,
    each metric timed by the record's primary clock (by wall time where none is: a CPU); for a
    convergence case ``{"deviation", "tolerance"}`` (nats: its verdict's two figures); None for a
    case that is not ok or has neither."""
    from optbench.store.records import Record

    view = Record.of(rec)
    if not view.ok:
        return None
    info = view.info
    if {"rms_deviation", "tolerance"} <= info.keys():
        return {"deviation": info["rms_deviation"], "tolerance": info["tolerance"]}
    clock = view.primary_clock
    if not any(view.timing(m, clock) for m in view.metrics):
        clock = "wall"
    ms = {m: t.median_ms for m in view.metrics if (t := view.timing(m, clock)) is not None}
    return {"clock": clock, "ms": ms} if ms else None


def milliseconds(ms: float) -> str:
    """``ms`` as a case's line shows it: whole ms from 100 up, else three significant digits."""
    return f"{ms:.0f}" if abs(ms) >= 100 else f"{ms:.3g}"


def planned_cases(benchmarks: Iterable[Any], suite: str, select: str | None = None) -> list[str]:
    """Record keys of the cases of ``suite`` that report progress, in order: those of the grids
    (measured by run_grid; the CPU suite's asv-timed classes, kind 'cpu', report none) that
    ``select`` matches where given. ``benchmarks``: the catalog's entries
    (``optbench.suite.catalog.BENCHMARKS.values()``)."""
    from optbench.store.store import record_key

    keys = [
        record_key(b.name, params)
        for b in benchmarks
        if b.kind != "cpu"
        for params in b.cases(suite)
    ]
    return [k for k in keys if not select or re.search(select, k)]


def asv_timed(benchmarks: Iterable[Any], suite: str, select: str | None = None) -> list[str]:
    """The benchmarks of ``suite`` that asv times itself (no grid, so no progress events), those
    with a case whose record key ``select`` matches where given."""
    from optbench.store.store import record_key

    return [
        b.name
        for b in benchmarks
        if b.kind == "cpu"
        and any(not select or re.search(select, record_key(b.name, p)) for p in b.cases(suite))
    ]


def expected_seconds(
    runs: Iterable[Any], keys: Iterable[str], cold: bool | None = None
) -> dict[str, float]:
    """Seconds per case of ``keys``, the median over every stored record of it that ran (ok, wrong
    or timeout) in ``runs`` (``optbench.store.store.StoredRun``: one machine's); with ``cold``
    given, over the runs that started from a compile cache in the same state (``cold``: none,
    :data:`optbench.run.compile_cache.COLD`; else restored or local) where any of them ran the
    case, since a cold torch.compile takes several times a warm one; a case never run here is
    absent."""
    wanted: set[str] = set(keys)
    alike: dict[str, list[float]] = {}
    other: dict[str, list[float]] = {}
    for run in runs:
        same = cold is None or (run.info.get("compile_cache") == COLD) == cold
        for key, rec in run.results().items():
            if (
                key in wanted
                and rec.get("status") in ("ok", "wrong", "timeout")
                and rec.get("seconds")
            ):
                (alike if same else other).setdefault(key, []).append(float(rec["seconds"]))
    return {key: statistics.median(alike.get(key) or other[key]) for key in {*alike, *other}}


def estimate_note(
    planned: Sequence[str],
    expected: Mapping[str, float],
    budget_s: float | None,
    reserved_s: float,
    asv_timed: Sequence[str] = (),
) -> str:
    """One line before a run: the seconds its ``planned`` grid cases took here before
    (:func:`expected_seconds`), how many never ran here, and, with a time budget of ``budget_s`` of
    which ``reserved_s`` is kept for asv's start and wrap-up, whether the budget will likely cut
    cases (those never run count as the median of the others). The classes asv times itself
    (``asv_timed``) leave no records to estimate from: the line says they come on top."""
    on_top = f"; asv's own timing of {', '.join(asv_timed)} comes on top" if asv_timed else ""
    if not planned:
        return f"optbench: no grid case to estimate{on_top}"
    known = [expected[k] for k in planned if k in expected]
    if not known:
        return (
            f"optbench: none of the {len(planned)} cases has run on this machine before: "
            f"no estimate{on_top}"
        )
    unknown = len(planned) - len(known)
    total = sum(known) + unknown * statistics.median(known)
    note = (
        f"optbench: expected ~{total:.0f} s of grid cases from this machine's stored runs "
        f"({len(known)} of {len(planned)} measured here before"
        + (f"; {unknown} never, counted at the median" if unknown else "")
        + ")"
        + on_top
    )
    if budget_s is not None and total > budget_s - reserved_s:
        note += (
            f"; the time budget leaves {budget_s - reserved_s:.0f} s for cases once "
            f"{reserved_s:.0f} s are kept for asv's start and wrap-up: it will likely cut some"
        )
    return note


@dataclass(frozen=True)
class Tally:
    """Where a run stands: cases done of total, the one running (None between cases), seconds
    elapsed, the mean seconds per finished case and the ETA (None while it has nothing to go on:
    :func:`tally`)."""

    done: int
    total: int
    running: str | None
    elapsed_s: float
    mean_s: float | None
    eta_s: float | None
    statuses: Mapping[str, int]

    @property
    def left(self) -> int:
        return self.total - self.done


def tally(
    events: Iterable[Mapping[str, Any]],
    total: int,
    elapsed_s: float,
    planned: Sequence[str] = (),
    expected: Mapping[str, float] | None = None,
    now: float | None = None,
) -> Tally:
    """Done/total/ETA from a run's events in order. ``total``: the cases planned; cases seen beyond
    those count too. The mean leaves out cases that the time budget did not start (no seconds). ETA:
    with ``planned`` (the keys, in order) and ``expected`` (:func:`expected_seconds`), the sum over
    the planned cases not yet ended of their expected seconds, a case without one at the mean (None
    while there is no mean), the running one less the time it has run by ``now`` (Unix time); else
    the mean times the cases left."""
    finished: dict[str, Mapping[str, Any]] = {}
    running: str | None = None
    started: dict[str, float] = {}
    for event in events:
        if event.get("event") == "start":
            running = event.get("key")
            if event.get("t") is not None:
                started[running] = float(event["t"])
        elif event.get("event") == "end":
            finished[event.get("key")] = event
            if running == event.get("key"):
                running = None
    seen = len(finished) + (running is not None and running not in finished)
    total = max(total, seen)
    seconds = [e["seconds"] for e in finished.values() if e.get("seconds") is not None]
    mean = statistics.fmean(seconds) if seconds else None
    statuses: dict[str, int] = {}
    for e in finished.values():
        statuses[str(e.get("status"))] = statuses.get(str(e.get("status")), 0) + 1
    if planned and expected is not None:
        left = [k for k in planned if k not in finished]
        if any(k not in expected for k in left) and mean is None:
            eta = None
        else:
            eta = 0.0
            for k in left:
                eta += (
                    max(expected.get(k, mean) - (now - started[k]), 0.0)
                    if k == running and now is not None and k in started
                    else expected.get(k, mean)
                )
    else:
        eta = None if mean is None else mean * (total - len(finished))
    return Tally(len(finished), total, running, elapsed_s, mean, eta, statuses)


def ended(events: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The last 'end' event of each case that ``events`` (in order) end, by key, in the order they
    first ended."""
    last: dict[str, Mapping[str, Any]] = {}
    for event in events:
        if event.get("event") == "end":
            last[event.get("key")] = event
    return last


def clock(seconds: float | None) -> str:
    """``seconds`` as m:ss or h:mm:ss; '?' for None."""
    if seconds is None:
        return "?"
    s = round(max(seconds, 0.0))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def case_line(event: Mapping[str, Any], t: Tally) -> str:
    """The line of one finished case: done/total, key, status (with its reason where not ok), its
    figure (:func:`figure`), the seconds it took, elapsed, ETA."""
    shown = event.get("figure") or {}
    measured = ", ".join(f"{m} {milliseconds(v)} ms" for m, v in (shown.get("ms") or {}).items())
    if "deviation" in shown:
        dev, tol = shown["deviation"], shown["tolerance"]
        measured = f"loss curve {dev:.3g} nats from eager seeds' mean (RMS), tolerance {tol:.3g}"
    took = "" if event.get("seconds") is None else f", took {event['seconds']:.1f} s"
    reason = (
        f" ({event['reason'][:80]})"
        if event.get("status") not in ("ok", None) and event.get("reason")
        else ""
    )
    return (
        f"optbench: [{t.done}/{t.total}] {event.get('key')}: {event.get('status')}{reason}"
        + (f", {measured}" if measured else "")
        + (f" ({shown['clock']})" if shown.get("clock") else "")
        + f"{took}; elapsed {clock(t.elapsed_s)}, ETA {clock(t.eta_s)}"
    )


def parse_events(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The events of progress-file lines; a line cut short, or not JSON, is left out."""
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every whole event of a progress file."""
    return parse_events(path.read_bytes().splitlines()) if path.exists() else []


class Follower:
    """Follows a run's progress file from the ``optbench run`` process while asv runs: a thread
    reads the lines appended since its last look (every ``poll_s``) and shows them (``live``: rich's
    progress bar, with a line per finished case printed above it, gone once the run ends; else that
    line alone, on stdout). :meth:`print` shows another line (asv's output) without breaking the
    bar. Before the first grid case the bar names the classes asv times itself (``asv_timed``),
    which it may be timing then."""

    def __init__(
        self,
        path: Path,
        total: int,
        *,
        live: bool,
        console: Any = None,
        poll_s: float = 0.5,
        planned: Sequence[str] = (),
        expected: Mapping[str, float] | None = None,
        asv_timed: Sequence[str] = (),
    ) -> None:
        self.path, self.total, self.live, self.poll_s = Path(path), total, live, poll_s
        self.planned, self.expected = list(planned), expected  # for the ETA (tally)
        # before the first grid case: asv starts, and may time its own classes first (a CPU
        # suite's bench_cpu comes before bench_step: most of its minute)
        self._starting = "asv: starting" + (
            f", timing {', '.join(asv_timed)} itself" if asv_timed else ""
        )
        self.events: list[dict[str, Any]] = []
        # From the file's end as it is now: a run id given again (OPTBENCH_RUN_ID) appends to an
        # earlier file.
        self._offset, self._partial = (self.path.stat().st_size if self.path.exists() else 0), b""
        self._stop = threading.Event()
        self._lock, self._out = threading.Lock(), threading.Lock()
        self._thread: threading.Thread | None = None
        self._started = time.perf_counter()
        self._progress = self._task = None
        if live:
            import rich.progress as rp

            self._progress = rp.Progress(
                rp.SpinnerColumn(),
                rp.TextColumn("{task.description}"),
                rp.BarColumn(),
                rp.MofNCompleteColumn(),
                rp.TextColumn("elapsed"),
                rp.TimeElapsedColumn(),
                rp.TextColumn("ETA {task.fields[eta]}"),
                console=console,
                transient=True,
            )
            self._task = self._progress.add_task(self._starting, total=total or None, eta="?")

    def __enter__(self) -> Follower:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._started = time.perf_counter()
        if self._progress is not None:
            self._progress.start()
        self._thread = threading.Thread(target=self._follow, name="optbench-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following, after showing what the file holds by now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()
        if self._progress is not None:
            self._progress.stop()

    def print(self, line: str) -> None:
        """Show one line of other output (above the bar where live)."""
        # asv's lines (main thread) and case lines (following thread) whole, one at a time
        with self._out:
            if self._progress is not None:
                self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
            else:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()

    def tally(self) -> Tally:
        with self._lock:
            return self._tally()

    def _tally(self) -> Tally:
        return tally(
            self.events,
            self.total,
            time.perf_counter() - self._started,
            self.planned,
            self.expected,
            time.time(),
        )

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self) -> list[dict[str, Any]]:
        """Read and show the events appended since the last poll; returns them."""
        with self._lock:
            new = self._read()
            for event in new:
                self.events.append(event)
                if event.get("event") == "end":
                    self.print(case_line(event, self._tally()))
            if self._progress is not None:
                t = self._tally()
                between = (
                    "asv: after the grids"
                    if t.total and t.done >= t.total
                    else "asv: between grids"
                    if t.done
                    else self._starting
                )
                self._progress.update(
                    self._task,
                    completed=t.done,
                    total=t.total or None,
                    eta=clock(t.eta_s),
                    description=t.running or between,
                )
        return new

    def _read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return parse_events(lines)


# How long the processes of a run have to end once an interrupt is passed on to them (a grid process
# records the case it stopped), before they are killed.
STOP_GRACE_S = 20.0
# Runs a command bound to the process that started it (``python -c BOUND <parent pid> command...``):
# :func:`exec_bound`.
BOUND = (
    "import sys; from optbench.run.progress import exec_bound; "
    "exec_bound(int(sys.argv[1]), sys.argv[2:])"
)


class RunInterrupted(KeyboardInterrupt):
    """A followed run stopped by SIGINT or SIGTERM (``signal``: its name), once its processes ended:
    ``stopped`` maps the cases that were running then to the process measuring them."""

    def __init__(self, signal_name: str, stopped: Mapping[str, int]) -> None:
        super().__init__(signal_name)
        self.signal, self.stopped = signal_name, dict(stopped)


def exec_bound(parent: int, argv: Sequence[str]) -> None:
    """Become the command ``argv`` (``exec``), which gets SIGINT when its parent, process
    ``parent``, ends, however it ends (``optbench.measure.signals.die_with_parent``; Linux): as on
    Ctrl-C, asv then ends the benchmark process it runs (SIGTERM, which a grid process records as an
    interrupt) before it exits. Where ``parent`` has ended already, the signal comes at once."""
    from optbench.measure.signals import die_with_parent

    die_with_parent(signal.SIGINT, parent)
    os.execvp(argv[0], list(argv))


def running_cases(events: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The cases started and not ended in ``events`` (in order), each with the process measuring
    it."""
    running: dict[str, int] = {}
    for event in events:
        if event.get("event") == "start":
            running[event.get("key")] = event.get("pid")
        elif event.get("event") == "end":
            running.pop(event.get("key"), None)
    return running


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: signal 0 is all there is to go on
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def _signal(pid: int, signum: int, group: bool = False) -> None:
    """Send ``signum`` to process ``pid`` (``group``: to its process group); nothing where it has
    ended."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, signum)


def _wait_gone(pids: Iterable[int], until: float) -> None:
    """Wait until no process of ``pids`` runs, or until the monotonic time ``until``."""
    while any(alive(pid) for pid in pids) and time.monotonic() < until:
        time.sleep(0.05)


def stop_processes(
    proc: subprocess.Popen, measuring: Iterable[int], signum: int, grace_s: float = STOP_GRACE_S
) -> None:
    """End ``proc`` (asv, the leader of its own process group), its group and the processes
    ``measuring`` (those of the cases running): ``signum`` (the signal that stopped the run, which
    they record) to ``measuring`` first, and as long as ``grace_s`` for them to record what they
    stopped and end; then SIGINT to ``proc``'s group (asv ends the process it runs, then itself)
    and as long again; then SIGKILL to whatever still runs."""
    measuring = [pid for pid in measuring if pid != proc.pid]
    for pid in measuring:
        _signal(pid, signum)
    _wait_gone(measuring, time.monotonic() + grace_s)
    _signal(proc.pid, signal.SIGINT, group=True)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    _signal(proc.pid, signal.SIGKILL, group=True)
    for pid in measuring:
        if alive(pid):
            _signal(pid, signal.SIGKILL)
    proc.wait()


def run_followed(
    command: Sequence[str],
    env: Mapping[str, str],
    follower: Follower,
    cwd: Path,
    log: Path,
    echo: bool = False,
    grace_s: float = STOP_GRACE_S,
) -> int:
    """Run ``command`` with its output (stdout and stderr, line by line) written to the file
    ``log`` (appended, flushed per line) and, with ``echo``, shown through ``follower`` too, while
    the follower follows the progress file; the command's exit status.

    The command's processes end with this one. The command runs in a process group of its own, bound
    to this process (:func:`exec_bound`: SIGINT when this process ends, even by SIGKILL; a grid
    process is bound to its parent in turn), so a terminal's Ctrl-C reaches this process alone;
    SIGINT or SIGTERM here is passed on (:func:`stop_processes`: the processes of the cases running
    then, from the progress file, first, with the same signal, so that they record the one that
    stopped the run), and once they have ended :class:`RunInterrupted` names those cases. Later
    signals are ignored meanwhile. Call it from the main thread."""
    from optbench.measure.signals import Interrupted, interruptible

    with follower, interruptible(), open(log, "a", encoding="utf-8") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", BOUND, str(os.getpid()), *command],
            cwd=cwd,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            process_group=0,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sink.write(line)
                sink.flush()
                if echo:
                    follower.print(line.rstrip("\n"))
            return proc.wait()
        except KeyboardInterrupt as exc:
            follower.poll()
            running = {
                key: pid
                for key, pid in running_cases(follower.events).items()
                if isinstance(pid, int) and alive(pid)
            }
            name = exc.signal if isinstance(exc, Interrupted) else "SIGINT"
            stop_processes(proc, running.values(), signal.Signals[name], grace_s)
            raise RunInterrupted(name, running) from exc
