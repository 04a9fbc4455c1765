"""The headline's table of HF + torch.compile against our fastest steps, run by run: one row per
optbench run that measured the HF anchor (``bench_anchors.HFCompileStep``) and our best-* steps at
one size, with the fastest of those without FP8 matmuls and of those with them in that run, each
with x HF (the anchor's median wall ms per step over ours). Both sides of a ratio come from one
process's run on one GPU, which the row names; the step table's x HF row shows only the run its
column is taken from, which must have measured each variant's reference too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from models.variants import VARIANTS, switches
from optbench.reporting.data import (
    Run,
    anchor_records,
    grid_records,
    run_cells,
    run_gpu,
    step_iqr_ms,
    step_ms,
)
from optbench.store.records import Record

ROWS = 8  # the newest runs shown per machine
KINDS = ("bf16", "FP8")  # the columns of our steps: without FP8 matmuls, with them
# Our steps compared: the best-* combinations (a shard of a sweep that ran none of them has no
# row: its fastest single switch is no answer to "how far ahead of HF are we").
BEST = "best"


@dataclass(frozen=True)
class HFRun:
    """One optbench run's anchor at ``size`` and our fastest step of each kind (:data:`KINDS`)
    beside it: kind -> (variant, its record); a kind the run did not measure is absent."""

    size: str
    commit: str
    run: str
    gpu: str
    anchor: Record
    fastest: dict[str, tuple[str, Record]]


def _kind(variant: str) -> str:
    """'FP8' for a variant with FP8 matmuls, else 'bf16'; a variant stored before it left the
    catalog by its name (every FP8 variant's holds 'fp8')."""
    if variant not in VARIANTS:
        return "FP8" if "fp8" in variant else "bf16"
    return "bf16" if switches(variant).get("fp8", "off") == "off" else "FP8"


def _fastest(by_variant: Mapping[str, Record]) -> dict[str, tuple[str, Record]]:
    """The fastest of each kind among one run's ok best-* step records of one size."""
    fastest: dict[str, tuple[str, Record]] = {}
    for variant, rec in by_variant.items():
        kind = _kind(variant)
        if variant.startswith(BEST) and (
            kind not in fastest or step_ms(rec) < step_ms(fastest[kind][1])
        ):
            fastest[kind] = (variant, rec)
    return fastest


def hf_runs(history: list[Run], limit: int | None = ROWS) -> list[HFRun]:
    """Each optbench run of ``history`` (one machine's commits) with an ok anchor at a size and one
    of our best-* steps at that size, newest first, at most ``limit`` (None: all)."""
    found = []
    for commit in history:
        for run_id, records in commit.by_run.items():
            gpu = run_gpu(records)
            steps = grid_records(records.values(), "variants")
            for size, anchor in anchor_records(records.values()).items():
                if fastest := _fastest(steps.get(size, {})):
                    found.append(HFRun(size, commit.commit, run_id, gpu, anchor, fastest))
    return sorted(found, key=lambda r: r.run, reverse=True)[:limit]


def newest_per_size(rows: list[HFRun]) -> list[HFRun]:
    """The first row of each size in ``rows`` (newest first: :func:`hf_runs`'s order)."""
    seen: dict[str, HFRun] = {}
    for row in rows:
        seen.setdefault(row.size, row)
    return list(seen.values())


def _cell(row: HFRun, kind: str) -> str:
    if kind not in row.fastest:
        return "–"
    variant, rec = row.fastest[kind]
    return f"{variant} {step_ms(rec):.2f} ms: {step_ms(row.anchor) / step_ms(rec):.3f}×"


def hf_table(rows: list[HFRun]) -> tuple[str, list[str], list[list[str]]]:
    """(caption, header, rows) of the table (module docstring)."""
    caption = (
        "HF + torch.compile against our fastest best-* steps, run by run (newest first): the "
        "anchor's "
        "median wall ms per step [IQR], and our fastest bf16 and FP8 steps of the same run with "
        "× HF (HF ms / ours); each row one optbench run on one GPU (its UUID's first 8 hex "
        "digits); –: the run measured none of that kind."
    )
    header = [
        "size",
        "run",
        "commit",
        "GPU",
        "HF + torch.compile",
        *(f"fastest {k}" for k in KINDS),
    ]
    body = [
        [
            r.size,
            *run_cells(r.run, r.commit, r.gpu),
            f"{step_ms(r.anchor):.2f} ms [{step_iqr_ms(r.anchor):.2f}]",
            *(_cell(r, k) for k in KINDS),
        ]
        for r in rows
    ]
    return caption, header, body
