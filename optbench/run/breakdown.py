"""Where the time of an ``optbench run`` went: seconds per phase summed over the run, from its
progress events (:mod:`optbench.run.progress`), printed at its end and stored as the record
``__breakdown__`` of its run file.

Phases (each case's from its record's fields, :func:`optbench.run.runner.measure_case`):

- compile warm-up: a run that starts with empty compile caches builds its compiled cases once, in
  parallel, before asv starts (``optbench.suite.prewarm``; its ``prewarm`` event);
- process start-up: per grid process, from its start to its first case (``startup_seconds``: the
  interpreter, asv's runner, imports of the benchmark modules and torch, the grid's cases, machine
  info);
- build: inputs, models and eager references, less torch.compile's part (``build_seconds`` less
  ``build_compile_seconds``; CUDA's context falls in a process's first);
- torch.compile: dynamo and inductor compiling (with max-autotune's autotuning) while the build (a
  captured step's warm-up calls) or the check ran (``compile_seconds``: torch's own compile timers,
  ``torch._dynamo.utils.compilation_time_metrics``);
- check, the rest: the reference and candidate calls and comparison (Triton's @autotune of our
  kernels runs at their first launch, so it falls here);
- timing, torch.compile: compiles while the timed calls ran (a recompile of a call the check did not
  make);
- timing: warm-up, CUDA-graph capture and samples (``measure`` does not split them: one phase);
- memory sizing: the peak-memory pass of the metrics that have one;
- freeing: giving back what the case held (its objects, the collector where a cycle holds device
  memory, the allocator's cached blocks: ``free_seconds``);
- other in cases: the rest of each case's seconds;
- asv and other overhead: the run's wall time (asv's run, start to end) minus all of the above:
  asv's discovery, its track processes, the benchmark classes outside the suite, saving records, the
  CPU suite's asv-timed classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

KEY = "__breakdown__"

PHASES = {
    "prewarm": "compile warm-up (compiled cases built in parallel, before asv)",
    "startup": "process start-up (imports, torch, machine info)",
    "build": "build (inputs, models, eager references)",
    "compile": "torch.compile in build and check (dynamo, inductor, autotuning)",
    "check_rest": "check: the rest (reference, candidate, comparison)",
    "timing_compile": "timing: torch.compile (recompiles)",
    "timing": "timing (warm-up, capture, samples)",
    "memory": "memory sizing",
    "free": "freeing the case's memory",
    "case_other": "other in cases",
    "overhead": "asv and other overhead (discovery, track processes, asv-timed classes)",
}


def _f(event: Mapping[str, Any], field: str) -> float:
    value = event.get(field)
    return float(value) if value is not None else 0.0


def phases(events: Iterable[Mapping[str, Any]], wall_s: float) -> dict[str, float]:
    """Seconds per phase (:data:`PHASES`, in its order) over a run's events; ``overhead`` is
    ``wall_s`` minus the rest."""
    out = dict.fromkeys(PHASES, 0.0)
    for e in events:
        if e.get("event") == "prewarm":
            out["prewarm"] += _f(e, "seconds")
        elif e.get("event") == "process":
            out["startup"] += _f(e, "startup_seconds")
        elif e.get("event") == "end":
            build, built = _f(e, "build_seconds"), _f(e, "build_compile_seconds")
            # compile_seconds holds the build's compile too, once the build has ended (a case cut
            # inside its build has build_compile_seconds only)
            check, compiled = _f(e, "check_seconds"), max(_f(e, "compile_seconds") - built, 0.0)
            timing, recompiled = _f(e, "timing_seconds"), _f(e, "timing_compile_seconds")
            out["build"] += max(build - built, 0.0)
            out["compile"] += min(built, build) + min(compiled, check)
            out["check_rest"] += max(check - compiled, 0.0)
            out["timing_compile"] += min(recompiled, timing)
            out["timing"] += max(timing - recompiled, 0.0)
            out["memory"] += _f(e, "memory_seconds")
            out["free"] += _f(e, "free_seconds")
            inside = _f(e, "build_seconds") + check + timing + _f(e, "memory_seconds")
            inside += _f(e, "free_seconds")
            out["case_other"] += max(_f(e, "seconds") - inside, 0.0)
    out["overhead"] = wall_s - sum(v for k, v in out.items() if k != "overhead")
    return out


def rows(split: Mapping[str, float], wall_s: float) -> list[tuple[str, str, str]]:
    """(phase, seconds, share of the wall time) per phase, then the total."""

    def share(seconds: float) -> str:
        return f"{seconds / wall_s:.1%}" if wall_s > 0 else "-"

    return [
        *((PHASES[k], f"{v:.1f}", share(v)) for k, v in split.items()),
        ("total (wall time)", f"{wall_s:.1f}", share(wall_s)),
    ]


def render(
    split: Mapping[str, float], wall_s: float, title: str = "where the time of asv's run went"
):
    """The compact rich table of :func:`rows` (``optbench.run.console.table``) less the phases of
    0.0 s, which its title then says it leaves out."""
    from optbench.run.console import table

    shown = [row for row in rows(split, wall_s) if row[1] != "0.0"]
    if len(shown) <= len(split):
        title += " (phases of 0.0 s left out)"
    return table(
        ("phase", "seconds", "share"), shown, title=title, right=("seconds", "share"), compact=True
    )


def record(
    events: list[Mapping[str, Any]],
    wall_s: float,
    *,
    commit: str,
    machine: str,
    run_id: str,
    date: str,
) -> dict[str, Any]:
    """The ``__breakdown__`` record of a run: seconds per phase, the wall time, how many grid
    processes and cases. ``date``: when the run started (a run's date is its records' earliest)."""
    split = phases(events, wall_s)
    return {
        "key": KEY,
        "commit": commit,
        "machine": machine,
        "run": run_id,
        "date": date,
        "wall_seconds": round(wall_s, 3),
        "phases": {k: round(v, 3) for k, v in split.items()},
        "processes": sum(e.get("event") == "process" for e in events),
        "cases": sum(e.get("event") == "end" for e in events),
    }
