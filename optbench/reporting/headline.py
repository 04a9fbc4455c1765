"""The headline page, docs/results.md: Markdown tables of each real GPU machine's newest figures
(``optbench report --headline``), generated whole; README links to it.

Per machine: the training-step table (each variant vs its own reference, from one run; the HF anchor
and x HF where measured), x HF run by run, each step's memory, the leave-one-out ablation of
best-kernels per size, the convergence check's verdicts, kernel speedups vs the op's baseline
(device time, geometric mean over shapes), multi-GPU scaling, where the 1B best steps' time goes
(from stored profiles), and the regression gate's newest calls (their time to a verdict). Each
size and kernel comes from the run that measured the most of it
(:func:`optbench.reporting.data.fullest`); the commits and dates used close the section.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from models.variants import ABLATED
from optbench.reporting.convergence import convergence_rows, convergence_table
from optbench.reporting.data import (
    ABLATION_CAPTION,
    ABLATION_HEADER,
    Run,
    ablation_rows,
    ablations,
    anchor_steps,
    by_size,
    distributed_steps,
    fullest,
    hf_ratio,
    kernel_speedups,
    runs,
    runs_at_once,
    scaling_rows,
    step_failures,
    step_iqr_ms,
    step_ms,
    step_pairs,
    step_reference,
    step_table,
    steps,
    vs_label,
)
from optbench.reporting.floors import floor_markdown, floor_reports
from optbench.reporting.gate_calls import CAPTION as GATE_CAPTION
from optbench.reporting.gate_calls import HEADER as GATE_HEADER
from optbench.reporting.gate_calls import gate_calls, gate_row
from optbench.reporting.hf_runs import hf_runs, hf_table
from optbench.reporting.memory import MEMORY_NOTE, memory_columns, memory_rows
from optbench.reporting.suite_runs import CAPTION as SUITE_CAPTION
from optbench.reporting.suite_runs import HEADER as SUITE_HEADER
from optbench.reporting.suite_runs import suite_row, suite_runs
from optbench.run.console import table
from optbench.store.records import Record
from optbench.store.store import ResultStore, StoredRun, write_text_atomic
from optbench.suite.catalog import ANCHOR_BENCHMARK

HEADLINE_PAGE = "docs/results.md"


def _step_rows(found: list[tuple[str, Run, object]]) -> list[list[str]]:
    """The step table's rows, a column per (size, run) of found: variants that are their own
    reference (eager first), ms per step [IQR]; then each other variant vs its reference (named in
    its row): the speedup and its ms per step from one run (:func:`step_pairs`), 'n/a' where no run
    of the commit measured the variant beside its reference, the status where the variant ran and
    did not end ok (:func:`step_failures`: 'wrong', 'oom', ...), '–' where it did not run."""
    measured = [
        (
            steps(run).get(size, {}),
            step_pairs(run).get(size, {}),
            step_failures(run).get(size, {}),
        )
        for size, run, _ in found
    ]
    variants = sorted(
        dict.fromkeys(v for by_v, _, failed in measured for v in (*by_v, *failed)),
        key=lambda v: (v != "eager", step_reference(v) != v),
    )

    def cell(
        variant: str,
        by_v: dict[str, Record],
        pairs: dict[str, tuple[Record, float | None]],
        failed: dict[str, str],
    ) -> str:
        if variant not in by_v:
            return failed.get(variant, "–")
        rec = by_v[variant]
        if step_reference(variant) == variant:
            return f"{step_ms(rec):.1f} ms [{step_iqr_ms(rec):.1f}]"
        rec, x = pairs[variant]
        return f"{'n/a' if x is None else f'{x:.2f}×'} ({step_ms(rec):.1f} ms)"

    return [
        [
            f"{v} (ms per step [IQR])" if step_reference(v) == v else vs_label(v),
            *(cell(v, *column) for column in measured),
        ]
        for v in variants
    ]


def _size_header(size: str, run: Run, by_variant: dict[str, Record]) -> str:
    """'<size> @ `<commit>`', and how many runs shared the host where more than one
    (:func:`runs_at_once`)."""
    at_once = runs_at_once(run, by_variant.values())
    return f"{size} @ `{run.commit[:8]}`" + (f", {at_once} runs at once" if at_once > 1 else "")


def _ablation_markdown(history: list[Run]) -> tuple[list[str], dict[str, str]]:
    """Markdown leave-one-out tables per size (:func:`ablation_rows`) and the {commit: date} they
    come from."""
    found = by_size(fullest(history, ablations))
    parts = [
        f"Leave-one-out ablation of {ABLATED} at {size} @ `{run.commit[:8]}` "
        f"({ABLATION_CAPTION}):\n\n" + table(ABLATION_HEADER, ablation_rows(run, by_v), "markdown")
        for size, run, by_v in found
    ]
    return parts, {run.commit: run.date for _, run, _ in found}


def x_hf_cell(ratio: tuple[float, str, str] | None) -> str:
    """A :func:`optbench.reporting.data.hf_ratio` as '1.22× vs <our variant>', and where the two
    steps come from unless the same run; 'n/a' for None."""
    if ratio is None:
        return "n/a"
    x, variant, where = ratio
    return f"{x:.2f}× vs {variant}" + ("" if where == "same run" else f" ({where})")


def _hf_rows(found: list[tuple[str, Run, object]]) -> tuple[list[list[str]], str]:
    """The step table's HF rows (the anchor's ms per step, x HF) per column, and the note naming the
    HF setup; ([], '') where no column's run measured the anchor."""
    anchors = [anchor_steps(run).get(size) for size, run, _ in found]
    if not any(anchors):
        return [], ""
    ratios = [hf_ratio(run, size) for size, run, _ in found]
    hf = [
        "HF + torch.compile (ms per step [IQR])",
        *(f"{step_ms(a):.1f} ms [{step_iqr_ms(a):.1f}]" if a else "n/a" for a in anchors),
    ]
    x_hf = ["× HF (HF ms / our fastest's ms)", *map(x_hf_cell, ratios)]
    setups = dict.fromkeys(
        f"{a.info.get('setup')} (transformers {a.info.get('transformers')})" for a in anchors if a
    )
    note = (
        f"× HF: the median wall-clock ms per step of `{ANCHOR_BENCHMARK}` ({'; '.join(setups)}) "
        "over that of our fastest variant at the size, named in the cell: both of the column's "
        "commit, from one run unless the cell says otherwise; n/a where the anchor was not "
        "measured at that commit."
    )
    return [hf, x_hf], note


def _hf_runs_markdown(history: list[Run]) -> tuple[list[str], dict[str, str]]:
    """The table of x HF run by run (:mod:`optbench.reporting.hf_runs`) with its caption, and the
    {commit: date} of its rows' anchors (the newest of each commit); ([], {}) without an anchor."""
    paired = hf_runs(history)
    if not paired:
        return [], {}
    caption, header, rows = hf_table(paired)
    used: dict[str, str] = {}
    for r in paired:
        used.setdefault(r.commit, r.anchor.date)
    return [caption, table(header, rows, "markdown")], used


def _kernel_markdown(history: list[Run]) -> tuple[list[str], dict[str, str]]:
    """The kernel speedup table with its caption, and the {commit: date} of its runs; ([], {})
    without kernel results."""
    ops = fullest(history, kernel_speedups)
    if not ops:
        return [], {}
    body = [
        [
            op,
            impl,
            f"{statistics.geometric_mean(v):.2f}×",
            f"{min(v):.2f}–{max(v):.2f}×",
            str(len(v)),
            f"`{run.commit[:8]}`",
        ]
        for op, (run, impls) in ops.items()
        for impl, v in impls.items()
    ]
    caption = (
        "Kernel speedup vs eager (device time, forward+backward where the kernel has one; "
        "geometric mean over shapes):"
    )
    header = ["kernel", "implementation", "speedup", "range over shapes", "shapes", "commit"]
    return [caption, table(header, body, "markdown")], {
        run.commit: run.date for run, _ in ops.values()
    }


def _convergence_markdown(history: list[Run]) -> tuple[list[str], dict[str, str]]:
    """The convergence verdicts (:mod:`optbench.reporting.convergence`) with their caption, and
    the {commit: date} of their records; ([], {}) without a convergence record."""
    rows = convergence_rows(history)
    if not rows:
        return [], {}
    caption, header, body = convergence_table(rows)
    used = {r.commit: r.record.date for r in rows}
    return [caption, table(header, body, "markdown")], used


def _headline(
    history: list[Run],
    profiles: list[dict],
    gate: list[list[str]],
    suites: list[StoredRun] | None = None,
) -> str:
    """The tables of one machine (the module docstring's), each size and kernel from the run
    measuring the most of it; where its 1B best steps' time goes, from its ``profiles`` with
    floors; how long its newest suite runs took, ``suites`` (:mod:`suite_runs`); the regression
    gate's newest calls, ``gate`` (:mod:`gate_calls`' rows)."""
    parts, used = [f"**{history[-1].label}**"], {}
    found = by_size(fullest(history, step_table))
    if found:
        body = _step_rows(found)
        hf_rows, hf_note = _hf_rows(found)
        parts += [
            "Training-step speedup of each variant vs its own reference, named in its row (the "
            "best-* combinations vs eager), reference median / variant median from one run, and "
            "ms per optimizer step (wall clock; n/a: the reference was not measured in that run; "
            "wrong, oom, timeout, error, crashed: the variant ran and did not end ok, its record "
            "says why; "
            "–: not run; "
            "a host-bound eager step, as at 100M, moves within and between runs, see its IQR: "
            "there compare the optimized steps' own times; 'N runs at once': shards of "
            "`run --gpus` shared the host's CPUs, and its host-bound steps read slower than "
            "measured alone):",
            table(
                [
                    "optimization",
                    *(_size_header(size, run, steps(run)[size]) for size, run, _ in found),
                ],
                body + hf_rows,
                "markdown",
            ),
            *([hf_note] if hf_note else []),
        ]
        used.update((run.commit, run.date) for _, run, _ in found)
    hf_parts, hf_used = _hf_runs_markdown(history)
    parts += hf_parts
    for commit, date in hf_used.items():
        used.setdefault(commit, date)
    sizes = by_size(fullest(history, steps))
    if sizes:
        parts += [
            "Memory of each training step, GB per variant and size, measured beside "
            "`optbench.suite.memory_estimate`'s estimate. " + MEMORY_NOTE,
            table(memory_columns(sizes), memory_rows(sizes), "markdown"),
        ]
        used.update((run.commit, run.date) for _, run, _ in sizes)
    for section in (_ablation_markdown, _convergence_markdown, _kernel_markdown):
        more, more_used = section(history)
        parts += more
        for commit, date in more_used.items():
            used.setdefault(commit, date)
    scaling = fullest(history, distributed_steps)
    if scaling:
        parts += [
            "Multi-GPU training steps at 1B (`--suite multigpu`, torchrun, one process per GPU; "
            "per-GPU batch as on one GPU): ms per optimizer step of the slowest rank (wall clock), "
            "the ms of it its device ran anything (torch.profiler; where this is well under the "
            "step, the host holds the step up), tokens/s per GPU, scaling efficiency: tokens/s per "
            "GPU over the same variant's 1-GPU figure from the same run, and the slowest rank's "
            "collectives per step (torch.profiler): ms exposed (no other kernel running) / ms in "
            "all:",
            table(
                [
                    "variant",
                    "GPUs",
                    "ms/step",
                    "device busy ms",
                    "tokens/s per GPU",
                    "efficiency",
                    "communication ms, exposed / all",
                    "commit",
                ],
                scaling_rows(scaling),
                "markdown",
            ),
        ]
        used.update((run.commit, run.date) for run, _ in scaling.values())
    if profiles:
        caption, header, rows = floor_markdown(profiles)
        parts += [caption, table(header, rows, "markdown")]
        used.update((r["meta"]["commit"], r["meta"]["date"]) for r in profiles)
    if suites:
        parts += [SUITE_CAPTION, table(SUITE_HEADER, [suite_row(r) for r in suites], "markdown")]
        for run in suites:  # a commit another table dated keeps that date
            used.setdefault(run.commit, run.date)
    if gate:
        parts += [GATE_CAPTION, table(GATE_HEADER, gate, "markdown")]
    dated = sorted(used.items(), key=lambda commit_date: commit_date[1])
    parts.append("Measured at " + ", ".join(f"`{c[:12]}` ({d})" for c, d in dated) + ".")
    return "\n\n".join(parts)


def headline_table(store: ResultStore, machine: str | None = None) -> str:
    """Markdown headline of each real GPU machine (or of ``machine``), from its newest runs: step
    speedup of each variant vs its own reference per size (wall clock) with the HF anchor's step and
    x HF where measured (:func:`hf_ratio`), kernel speedups vs eager (device time)."""
    chosen = [
        (m, h)
        for m, h in runs(store).items()
        if (m == machine if machine else h[-1].info.get("gpu_name") and not h[-1].emulated)
    ]
    if not chosen:
        return "_No GPU results yet._"
    return "\n\n".join(
        _headline(
            h,
            floor_reports(store, m),
            [gate_row(c) for c in gate_calls(store, m)],
            suite_runs(store, m),
        )
        for m, h in chosen
    )


def write_headline(path: Path | str, store: ResultStore | None = None) -> None:
    """Write the headline page ``path`` whole: a title, how it is made, :func:`headline_table`."""
    text = (
        "# Headline figures\n\nGenerated by `optbench report --headline` from the stored results "
        "(do not edit by hand); each figure names its run, commit and machine.\n\n"
        + headline_table(store or ResultStore())
    )
    write_text_atomic(Path(path), text + "\n")
