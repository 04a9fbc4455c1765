"""What the report leads with per machine (index.html): the headline, each size's fastest training
step with its speedup over eager, over HF + torch.compile and its memory, and the newest change
points (:mod:`optbench.gate.changepoints`), whose rows the history page lists in full.
"""

from __future__ import annotations

import math

from optbench.gate.changepoints import MIN_COMMITS, ChangePoint, short_unit
from optbench.reporting.data import (
    Run,
    TimeHistory,
    by_size,
    fullest,
    hf_ratio,
    step_iqr_ms,
    step_ms,
    step_table,
    steps,
)
from optbench.reporting.headline import x_hf_cell
from optbench.reporting.memory import step_memory

HEADLINE_COLUMNS = [
    "size @ commit",
    "fastest step",
    "ms per step [IQR]",
    "× eager (same run)",
    "× HF + torch.compile",
    "peak GB",
]
NEWEST_CHANGE_POINTS = 5  # on the index, per machine

CHANGE_POINT_COLUMNS = [
    "benchmark",
    "params metric (clock)",
    "GPU",
    "last commit before → first after",
    "step (after/before)",
    "significance (step / L1 error)",
]


def headline_rows(history: list[Run]) -> list[list[str]]:
    """A row per size (from the run that measured the most pairs of it and the HF anchor,
    :func:`optbench.reporting.data.step_table`): the fastest step of that run (wall clock), its
    median ms and IQR, eager's median over it from one run (:meth:`Run.pair`; n/a where no run of
    the commit measured both), x HF (:func:`optbench.reporting.data.hf_ratio`), and its memory as
    memory.html shows it, from its latest record
    (:meth:`optbench.reporting.memory.StepMemory.cell`)."""
    rows = []
    for size, run, _ in by_size(fullest(history, step_table)):
        by_variant = steps(run)[size]
        variant = min(by_variant, key=lambda v: step_ms(by_variant[v]))
        rec, eager = run.pair(by_variant[variant], variant="eager") or (by_variant[variant], None)
        rows.append(
            [
                f"{size} @ {run.commit[:8]}",
                variant,
                f"{step_ms(rec):.1f} [{step_iqr_ms(rec):.1f}]",
                "n/a" if eager is None else f"{step_ms(eager) / step_ms(rec):.2f}×",
                x_hf_cell(hf_ratio(run, size)),
                step_memory(run, size, variant, by_variant[variant]).cell(),
            ]
        )
    return rows


def change_point_row(s: TimeHistory, cp: ChangePoint) -> list[str]:
    """A change point's cells (:data:`CHANGE_POINT_COLUMNS`): GPU UUIDs and commits shortened to 12
    characters (:func:`optbench.gate.changepoints.short_unit`)."""
    significance = "∞" if math.isinf(cp.significance) else f"{cp.significance:.1f}"
    return [
        s.benchmark,
        s.label,
        short_unit(cp.unit),
        f"{cp.before[:12]} → {cp.after[:12]}",
        f"{cp.ratio:.3f}× ({cp.ratio - 1:+.1%})",
        significance,
    ]


def change_points_newest_first(
    found: list[TimeHistory], order: dict[str, int]
) -> list[tuple[TimeHistory, ChangePoint]]:
    """Every change point of ``found``, by its first commit after (``order``: a commit's position
    on the machine), newest first."""
    return sorted(
        ((s, cp) for s in found for cp in s.change_points),
        key=lambda scp: (-order[scp[1].after], scp[0].key, scp[1].unit),
    )


def change_point_summary(found: list[TimeHistory], points: int) -> str:
    """How many change points were found in how many series, and which series are searched."""
    searched = sum(s.searched_units() for s in found)
    return (
        f"{points} change points in {searched} series searched (a series: one metric on one GPU, "
        f"searched once it has {MIN_COMMITS} commits)."
    )
