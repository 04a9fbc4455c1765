"""How long whole runs of a suite took on one machine, for the headline page: each ``optbench run``
of many cases (its ``__breakdown__`` record, ``optbench.run.breakdown``) as a table row, newest
first.

A row says what the run measured (its commit, its cases and how many ended ok), what its compile
caches started from (``info.compile_cache``: cold, prewarmed, restored or local), how many runs
shared its host (``info.runs_at_once``), its wall time
and the phases that move it most (the compile warm-up, torch.compile inside the cases, the timing),
and its GPU.
"""

from __future__ import annotations

from optbench.run.breakdown import KEY as BREAKDOWN
from optbench.store.store import ResultStore, StoredRun
from optbench.suite.catalog import suite_cases

NEWEST = 8  # rows shown
# runs of fewer cases (a --select, a probe's run) are not suite runs; a shard of `run --gpus`
# counts its cases times the shards
LEAST_CASES = 30
CAPTION = (
    f"The newest runs of {LEAST_CASES} cases or more (optbench run, a shard of `run --gpus` "
    f"counted as its cases times the shards; the full suite has {len(suite_cases('full'))} "
    "today), newest first: its cases that ended ok, skipped (the GPU cannot run them, or the "
    "time budget ended) and otherwise (failed, interrupted), what its compile caches started from "
    "(cold: empty; prewarmed: empty, then its compiled cases built once each in parallel before "
    "the run, `--no-prewarm` to leave out; restored: a carried cache; local: the machine's own), "
    "how many runs shared its host at once (the shards of `run --gpus`, one per GPU), its wall "
    "time, and of it the compile warm-up, torch.compile inside the cases (recompiles in their "
    "timing too) and the timing, in seconds"
    " (–: no warm-up; its breakdown, stored with the run, has every phase):"
)
HEADER = (
    "run",
    "commit",
    "ok / skipped / other",
    "caches",
    "at once",
    "wall s",
    "warm-up",
    "compile",
    "timing",
    "GPU",
)


def suite_runs(store: ResultStore, machine: str, newest: int = NEWEST) -> list[StoredRun]:
    """The ``newest`` runs on ``machine`` whose breakdown counts :data:`LEAST_CASES` cases or more
    (times the runs at once: a shard of ``run --gpus``), newest first (a run id starts with its UTC
    time)."""
    found = [
        run
        for run in store.machine_runs(machine)
        if (run.records.get(BREAKDOWN) or {}).get("cases", 0)
        * int(run.info.get("runs_at_once") or 1)
        >= LEAST_CASES
    ]
    return sorted(found, key=lambda run: run.run_id, reverse=True)[:newest]


def suite_row(run: StoredRun) -> list[str]:
    """One run's table cells (:data:`HEADER`)."""
    split = run.records[BREAKDOWN]
    phases = split.get("phases", {})
    statuses = [rec.get("status") for rec in run.results().values()]
    ok, skipped = statuses.count("ok"), statuses.count("skipped")
    caches = str(run.info.get("compile_cache") or "-").split(" ")[0]  # 'restored <key>'
    return [
        run.run_id[-6:],
        run.commit[:8],
        f"{ok} / {skipped} / {len(statuses) - ok - skipped}",
        caches,
        str(run.info.get("runs_at_once") or 1),
        f"{split['wall_seconds']:.1f}",
        f"{phases['prewarm']:.1f}" if phases.get("prewarm") else "–",
        f"{phases.get('compile', 0.0) + phases.get('timing_compile', 0.0):.1f}",
        f"{phases.get('timing', 0.0):.1f}",
        str(run.info.get("gpu_uuid") or "none").removeprefix("GPU-")[:8],
    ]
