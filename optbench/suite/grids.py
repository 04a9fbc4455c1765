"""Every grid case of a suite, measured in two processes: the training steps in one, the rest in the
other.

asv keys a ``setup_cache`` by the line that defines it: every grid class inherits one of two
(``benchmarks/common.py``), so asv starts two processes per run, and each calls
:func:`measure_suite` for its kinds (:data:`PROCESSES`): torch, CUDA, inductor and Liger-Kernel are
imported once per process, the steps' high-precision references are built once per size
(``optbench.suite.workloads``) and the GPU stays warm between grids. Each asv track process then
reads one metric of one case from what :func:`measure_suite` kept.

The training steps have a process of their own, which has done nothing else when they start:
host-bound steps (eager, ~60-80 ms of launches at 100M) read about 1.3x slower in a process that
measured the kernel grids first. The price of sharing is isolation: a case that ends its process
(the watchdog's hard stop, a crash in C) ends that process's remaining grids too (every record
measured before it is stored), and one that leaves the CUDA context unusable marks the rest of them
not measured (``optbench.run.runner.run_grid``). So a case that has ended its process on this
machine before (in any commit: its compile outlasting its budget, as max-autotune's does on an
H100) is measured after every other grid of its process.
"""

from __future__ import annotations

import itertools
import re
from functools import partial
from typing import TYPE_CHECKING, Any

from optbench.store.settings import current
from optbench.suite import catalog

if TYPE_CHECKING:
    from optbench.run.runner import Case

#: Benchmark kinds measured by :func:`measure_suite` (the 'cpu' classes are timed by asv itself).
GRID_KINDS = ("kernel", "matmul", "step", "anchor", "convergence", "distributed")
#: The kinds each grid process measures: our training steps, and everything else.
PROCESSES = {"steps": ("step",), "other": tuple(k for k in GRID_KINDS if k != "step")}
#: The fields of a record that asv's track methods read (samples stay in the store: asv reads the
#: kept records once per track call).
KEPT_FIELDS = ("status", "reason", "metrics", "peak_mem_bytes", "summary", "compile_seconds")


def cases(name: str, grid: list[list[str]], device: str) -> list[Case]:
    """The cases of benchmark ``name`` over asv's ``grid`` (one list per parameter, in its
    param_names' order)."""
    from optbench.run.runner import Case

    entry = catalog.benchmark(name)
    combos = [dict(zip(entry.param_names, combo)) for combo in itertools.product(*grid)]
    if entry.kind == "kernel":
        from optbench.suite.workloads import kernel_work

        return [
            Case(p, partial(kernel_work, entry.op, p["shape"], p["impl"], device)) for p in combos
        ]
    if entry.kind == "matmul":
        from optbench.suite.workloads import matmul_work

        return [Case(p, partial(matmul_work, int(p["n"]), p["mode"], device)) for p in combos]
    if entry.kind == "step":
        from optbench.suite.workloads import step_work

        return [Case(p, partial(step_work, entry.size, p["variant"], device)) for p in combos]
    if entry.kind == "anchor":
        from optbench.suite.anchors import hf_step_work

        return [Case(p, partial(hf_step_work, p["size"], device)) for p in combos]
    if entry.kind == "convergence":
        from optbench.suite.convergence import convergence_work

        return [
            Case(p, partial(convergence_work, entry.size, p["variant"], device)) for p in combos
        ]
    if entry.kind == "distributed":
        from optbench.suite.distributed import distributed_work

        one_gpu: dict[str, float] = {}  # variant -> tokens/s at 1 GPU, as this run measures it
        return [
            Case(
                p,
                partial(
                    distributed_work,
                    entry.size,
                    p["variant"],
                    int(p["world_size"]),
                    device,
                    one_gpu,
                ),
            )
            for p in combos
        ]
    raise ValueError(f"{name}: a {entry.kind!r} benchmark has no grid cases")


def _skips(keys: list[str], reason: str) -> dict[str, dict[str, Any]]:
    return dict.fromkeys(keys, {"status": "skipped", "reason": reason})


def measure_suite(
    names: list[str] | None = None, kinds: tuple[str, ...] = GRID_KINDS
) -> dict[str, dict[str, Any]]:
    """Measure, in this process, every case of this run's suite (``optbench.store.settings``) that
    ``$OPTBENCH_SELECT`` selects (less, with ``$OPTBENCH_SKIP_EXISTING``, those measured in an
    earlier run of this commit on this machine, but for the references of the rest:
    ``catalog.with_references``), grid after grid in the catalog's order (a case that has ended its
    process on this machine before: after every grid, :func:`_ended_its_process_here`; a
    multi-GPU grid then whole, whose cases share its 1-GPU figures), and return what asv's
    track methods read (:data:`KEPT_FIELDS`) by record key, for every case of ``names``
    (default: every grid benchmark of the catalog of one of ``kinds``; asv lists them all): a case
    outside the suite, unselected, or not started before the run's time budget ended is a skip with
    its reason. Imports nothing heavy where nothing is selected. Once something is, the process gets
    SIGTERM when its parent ends (``signals.die_with_parent``): an interrupt, which the runner
    records as such."""
    from optbench.store.store import record_key

    settings = current()
    suite, select = settings.suite, settings.select
    names = names or [b.name for b in catalog.BENCHMARKS.values() if b.kind in kinds]
    existing = _existing() if settings.skip_existing else set()
    kept: dict[str, dict[str, Any]] = {}
    device, ended, last = None, set(), []
    for name in names:
        entry = catalog.benchmark(name)
        keys = [
            record_key(name, dict(zip(entry.param_names, combo)))
            for combo in itertools.product(*entry.asv_params())
        ]
        ours = {record_key(name, params) for params in entry.cases(suite)}
        # asv lists every class with every suite's grid: the rest is skipped
        outside = f"not in the {suite!r} suite (optbench run --suite, or OPTBENCH_SUITE)"
        kept.update(_skips([k for k in keys if k not in ours], outside))
        keys = [k for k in keys if k in ours]
        if not keys:
            continue
        selected = [k for k in keys if not select or re.search(select, k)]
        # a case measured again beside a new one whose reference it is: both in this run
        chosen = catalog.with_references([k for k in selected if k not in existing], selected)
        kept.update(_skips(keys, f"not selected in this run (OPTBENCH_SELECT={_short(select)})"))
        left = [k for k in keys if k in existing and k not in chosen]
        kept.update(_skips(left, SKIPPED_EXISTING))
        if chosen:
            from optbench.measure.signals import die_with_parent
            from optbench.run.runner import default_device

            if device is None:  # a grid process ends with the one that started it (asv, ab)
                die_with_parent()
                device, ended = default_device(), _ended_its_process_here()
            late = [k for k in chosen if k in ended]
            if late and entry.kind == "distributed":  # one call: the efficiency's 1-GPU figures
                late = chosen
            now = [k for k in chosen if k not in late]
            if late:
                last.append((name, entry.grid(suite), late))
            if now:
                kept.update(_measure_grid(name, entry.grid(suite), now, device))
    for name, grid, chosen in last:
        kept.update(_measure_grid(name, grid, chosen, device))
    return kept


def unmeasured(name: str) -> list[tuple[str, ...]]:
    """The combinations of asv's grid of benchmark ``name`` (``Benchmark.asv_params``: every
    suite's) that this run leaves out by its settings, each a tuple of its parameter values: those
    outside its suite, and those ``$OPTBENCH_SELECT`` does not select. :func:`measure_suite` records
    them as skips; asv skips them before their ``setup``, without a word (the grid classes'
    ``skip_params``, ``benchmarks/common.py``), so a run's output never lists them."""
    settings = current()
    kept = set(catalog.measured_combos(name, settings.suite, settings.select))
    combos = itertools.product(*catalog.benchmark(name).asv_params())
    return [combo for combo in map(tuple, combos) if combo not in kept]


def _short(select: str | None, width: int = 80) -> str | None:
    """``select`` cut to ``width`` characters (a shard's selection names every key it holds)."""
    if select is None or len(select) <= width:
        return select
    return f"{select[: width - 20]}... ({len(select)} chars)"


SKIPPED_EXISTING = "measured in an earlier run of this commit on this machine (--skip-existing)"


def _existing() -> set[str]:
    """Keys of the cases this commit has a record of on this machine
    (``ResultStore.measured_keys``)."""
    from optbench.run.runner import current_commit, current_machine
    from optbench.store.store import ResultStore

    return ResultStore(current().results).measured_keys(current_machine(), current_commit())


def _ended_its_process_here() -> set[str]:
    """Keys of the cases this machine has a stored record of, in any commit, that the watchdog
    ended the process in (``optbench.run.runner.watchdog``): a timeout whose reason says so."""
    from optbench.run.runner import PROCESS_ENDED, current_machine
    from optbench.store.store import ResultStore

    store, machine = ResultStore(current().results), current_machine()
    return {
        key
        for run in store.machine_runs(machine)
        for key, rec in run.results().items()
        if rec.get("status") == "timeout" and PROCESS_ENDED in (rec.get("reason") or "")
    }


def _kind_budget_s(kind: str) -> float:
    """The least budget a case of ``kind`` gets: a distributed or convergence case's own (each
    module's ``CASE_BUDGET_S``: their cases do more than a single-GPU case's budget allows), else
    0 (the settings' alone)."""
    if kind == "distributed":
        from optbench.suite.distributed import CASE_BUDGET_S

        return CASE_BUDGET_S
    if kind == "convergence":
        from optbench.suite.convergence import CASE_BUDGET_S

        return CASE_BUDGET_S
    return 0.0


def _measure_grid(
    name: str, grid: list[list[str]], chosen: list[str], device: str
) -> dict[str, dict[str, Any]]:
    """The kept records of the ``chosen`` keys of one grid (skips, without building anything, where
    the run's time budget has ended)."""
    from optbench.run import progress
    from optbench.run.runner import NOT_STARTED, out_of_run_time, run_grid
    from optbench.store.store import record_key

    entry = catalog.benchmark(name)
    if out_of_run_time():
        not_started = {"status": "skipped", "reason": NOT_STARTED}
        for key in chosen:  # the run's progress counts them as done
            progress.case_ended(key, name, not_started)
        return dict.fromkeys(chosen, not_started)
    budget_s = max(current().case_budget_s, _kind_budget_s(entry.kind))
    todo = [c for c in cases(name, grid, device) if record_key(name, c.params) in chosen]
    records = run_grid(name, todo, device=device, budget_s=budget_s)
    kept = {}
    for key, rec in records.items():
        kept[key] = {f: rec.get(f) for f in KEPT_FIELDS}
        kept[key]["metrics"] = {
            m: _without_samples(t) for m, t in (rec.get("metrics") or {}).items()
        }
    if entry.kind == "convergence":  # the figures this process measured, for the track methods
        from optbench.suite.convergence import summary

        for key, rec in records.items():
            kept[key]["summary"] = summary(entry.size, rec["params"]["variant"]) or {}
    return kept


def _without_samples(measurement: Any) -> Any:
    """A stored measurement (clock -> timing) without its samples: what a track method reads of
    it."""
    if not isinstance(measurement, dict):
        return measurement
    return {
        clock: ({k: v for k, v in t.items() if k != "samples_ms"} if isinstance(t, dict) else t)
        for clock, t in measurement.items()
    }
