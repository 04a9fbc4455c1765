"""``optbench report``: asv's site and optbench's HTML pages of charts beside it (and, with
``--headline``, the headline page docs/results.md, :mod:`optbench.reporting.headline`).

Pages under ``html/optbench/``, a section per machine each (an emulated machine is labelled
"(emulated)" and never shares a chart with a real one):

- ``speedup.html``: training-step speedup of each optimization vs its own reference
  (models.variants.reference: eager unless the variant names another), per model size (wall clock);
  the leave-one-out ablation of best-kernels per size;
- ``memory.html``: per size, each training step's time against its memory, then the table of
  each step's measured memory beside its estimate (:mod:`optbench.reporting.memory`);
- ``throughput.html``: tokens/s and MFU per size (wall clock); MFU = step FLOPs / step seconds / the
  hardware profile's peak TFLOPS for the step's precision (bf16 unless the record says otherwise);
  none for an emulated run (its times are the real GPU's, its profile the emulated card's);
- ``roofline.html``: each kernel's cold-L2 device time over its roofline floor, max(flops/peak,
  bytes/bandwidth), with the warm-L2 time beside it; a cold time at or below the floor is listed as
  a measurement problem, not drawn; none for an emulated run;
- ``history.html``: per machine, the change points of each GPU's series
  (:mod:`optbench.gate.changepoints`) and a chart of the metrics that changed, the changes the
  regression gate flags between consecutive commits on one GPU (a difference between two GPUs is
  counted, never listed), then per benchmark a small chart per metric of its time over commits
  (each run's median and IQR), changes banded;
- ``compare.html``: two commits side by side (optbench.gate.compare): table and chart of head/base
  changes.

``index.html`` leads with each machine's headline and newest change points
(:mod:`optbench.reporting.dashboard`) and a thumbnail of each page.

Figures come from :mod:`optbench.reporting.data`, charts from :mod:`optbench.reporting.charts`;
legends and columns name the commit each figure comes from. A publish draws only the charts whose
inputs changed and reuses the pages of a store whose records did not change
(:mod:`optbench.reporting.cache`, in ``<html>/.cache/``), with the bytes a first publish writes;
asv's site is republished only where asv's results, configuration or branches changed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from html import escape
from pathlib import Path
from string import Template

from models.variants import ABLATED
from optbench.gate.ab import PAIRING_DIR
from optbench.gate.changepoints import MIN_COMMITS, MIN_MAGNITUDE
from optbench.gate.compare import (
    COLUMNS,
    CROSS_GPU,
    HOST_BOUND,
    compare,
    compared,
    resolve,
    rows,
    shown,
    verdict,
)
from optbench.reporting import charts
from optbench.reporting.cache import ReportCache, files_digest
from optbench.reporting.charts import Chart
from optbench.reporting.convergence import convergence_rows, convergence_table
from optbench.reporting.dashboard import (
    CHANGE_POINT_COLUMNS,
    HEADLINE_COLUMNS,
    NEWEST_CHANGE_POINTS,
    change_point_row,
    change_point_summary,
    change_points_newest_first,
    headline_rows,
)
from optbench.reporting.data import (
    ABLATION_CAPTION,
    ABLATION_HEADER,
    Run,
    TimeHistory,
    ablation_rows,
    ablations,
    at_commit,
    by_size,
    floor_ratios,
    fullest,
    mfu,
    named_speedups,
    peak_profile,
    runs,
    steps,
    time_histories,
    tokens_per_s,
)
from optbench.reporting.gate_calls import CAPTION as GATE_CAPTION
from optbench.reporting.gate_calls import HEADER as GATE_HEADER
from optbench.reporting.gate_calls import gate_calls, gate_row
from optbench.reporting.headline import HEADLINE_PAGE, write_headline
from optbench.reporting.hf_runs import hf_runs, hf_table, newest_per_size
from optbench.reporting.memory import MEMORY_NOTE, TRADES, memory_columns, memory_rows
from optbench.reporting.memory import time_against_memory as memory_points
from optbench.run.console import table
from optbench.store.store import (
    MACHINE_KEY,
    RECORDS_DIR,
    REPO_ROOT,
    ResultStore,
    asv_results_dir,
    results_dir,
)

MAX_PANELS = 24  # history charts per benchmark and machine

# name -> (title, what the page shows: its first line, how it is made: folded under it)
PAGES: dict[str, tuple[str, str, str]] = {
    "speedup": (
        "Training-step speedup vs each variant's reference, and the ablation of best-kernels",
        "Speedup of each optimization over its own reference, per model size, then best-kernels "
        "with each switch left out in turn.",
        "Wall clock, ms per optimizer step: reference median / optimization median, both from one "
        "run, each variant's reference named under its bars (eager for the best-* combinations); "
        "higher is better. The ablation: per size, best-kernels with each switch left out in "
        "turn, from one run.",
    ),
    "memory": (
        "Memory of each training step",
        "Per size, each step's time against its memory (what checkpointing and the cross-entropy "
        "variants trade), then each step's measured memory beside its estimate.",
        MEMORY_NOTE,
    ),
    "throughput": (
        "Tokens/s and MFU per size",
        "Tokens per second and model FLOPs utilization of each optimization, per size.",
        "Wall clock: tokens per step / median step seconds; MFU = FLOPs per step / median step "
        "seconds / the hardware profile's peak TFLOPS for the step's precision (bf16 by "
        "default); n/a for an emulated run.",
    ),
    "roofline": (
        "Kernel time over its roofline floor",
        "Each kernel's cold-L2 device time over the least time its FLOPs and bytes allow.",
        "Bars: cold-L2 device time (median ms per call, each call on inputs not in L2: graph "
        "replays rotating over input sets larger than the L2) / max(FLOPs / peak, bytes / "
        "bandwidth) of the hardware profile; 1× is the floor, lower is better. A cold time at or "
        "below 1× cannot come from HBM: it is a measurement problem, marked ✗ at 1× and listed, "
        "not drawn as a bar. Dashes: warm-L2 time (back-to-back calls on one input set), which "
        "may beat the floor where the data fits in L2 (shapes marked 'fits L2'). n/a for an "
        "emulated run.",
    ),
    "history": (
        "Each metric over commits",
        "Per machine: the change points of each GPU's series and a chart of the metrics that "
        "changed, the changes the regression gate flags on one GPU, then every benchmark's "
        "metrics over commits.",
        "A chart per metric measured at two commits or more, by the record's primary clock (wall "
        "where it has no device time): each run's median ms with its samples' IQR, commits in the "
        "order of their first run, a line through each commit's geometric mean. Bands mark what "
        "the regression gate (optbench compare) flags from the machine's previous commit on one "
        "GPU: red a regression, green an improvement, gray a change it reports but does not gate; "
        "a difference between runs of two GPUs is no change (lent GPUs of one kind differ by more "
        "than many changes): counted, not listed or banded. Hatched purple bands span the commit "
        "range of each change point: asv's step detection over each GPU's own series (the median "
        f"of its runs per commit; never two GPUs in one series), on series of at least "
        f"{MIN_COMMITS} commits, kept where the step exceeds both segments' mean absolute "
        f"deviation and {MIN_MAGNITUDE:.0%}; significance = step / the larger of the two. At most "
        f"{MAX_PANELS} charts per benchmark: those flagged or with a change point, then those "
        "measured most recently, then the longest histories; asv's graphs hold every metric.",
    ),
    "compare": (
        "Two commits side by side",
        "What changed between two commits (by default each machine's two newest).",
        "optbench.gate.compare: each time's runs against its run-to-run noise, peak memory beyond "
        "the threshold; head/base of the changes beyond what each metric's noise lets the gate "
        "detect.",
    ),
}

# The HTML root (html/) seen from optbench's pages (html/optbench/): PAGE's ``root``, the prefix of
# its links to optbench/index.html and asv/index.html ("" on the landing page, html/index.html).
PAGES_ROOT = "../"
PAGE = Template("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>$title</title>
<style>
body { font-family: sans-serif; max-width: 1500px; margin: 1em auto; padding: 0 1em; }
img { max-width: 100%; } .note { color: #555; }
table { border-collapse: collapse; font-size: small; }
td, th { border: 1px solid #ccc; padding: 2px 6px; }
.REGRESSION { color: #b00; font-weight: bold; } .improvement { color: #070; }
.thumbs { display: flex; flex-wrap: wrap; gap: 12px; }
.thumbs figure { margin: 0; width: 320px; font-size: small; }
.thumbs img { width: 320px; height: 200px; object-fit: contain; border: 1px solid #ccc; }
</style>
<script>
// On load: body data-images-ok="1" when every image decoded,
// data-errors = count of script/resource errors.
let errors = 0;
addEventListener("error", () => { errors += 1; }, true);
addEventListener("load", () => {
  const images = Array.from(document.images);
  document.body.dataset.images = images.length;
  const decoded = images.every((i) => i.complete && i.naturalWidth > 0);
  document.body.dataset.imagesOk = decoded ? "1" : "0";
  document.body.dataset.errors = errors;
});
</script></head>
<body><p><a href="${root}optbench/index.html">optbench report</a> ·
<a href="${root}asv/index.html">asv benchmarks</a></p>
<h1>$title</h1>
$body
</body></html>
""")

Part = Chart | str  # a chart, or HTML

EMULATED_PEAKS = (
    "n/a: this run emulated {target} on {gpu}; its times are that GPU's, so no {what} against "
    "the {target}'s peaks."
)


def note(text: str) -> str:
    """An HTML paragraph saying why a chart is missing."""
    return f'<p class="note">{escape(text)}</p>'


def emulated_note(run: Run, what: str) -> str:
    """The note of a figure (``what``) that an emulated run cannot give."""
    return note(
        EMULATED_PEAKS.format(
            target=run.info["emulate"], gpu=run.info.get("gpu_name") or "its GPU", what=what
        )
    )


def _step_chart(
    history: list[Run],
    extract: Callable[[Run], dict],
    what: str,
    ylabel: str,
    ref: float | None = None,
) -> list[Part]:
    """A group of bars per optimization, a bar per size (from the run measuring the most of that
    size)."""
    found = by_size(fullest(history, extract))
    if not found:
        return [note("No training-step results for this chart.")]
    by_column = {at_commit(size, run): value for size, run, value in found}
    title = f"{history[-1].label}\n{what}; legend: size @ commit"
    return [Chart(charts.step_bars, (title, by_column, ylabel, ref))]


def ablation_parts(history: list[Run]) -> list[Part]:
    """Per size, the leave-one-out table of best-kernels from the run that measured the most of
    it."""
    found = by_size(fullest(history, ablations))
    if not found:
        return [note(f"No leave-one-out ablation of {ABLATED} (optbench run --suite ablation).")]
    return [
        f"<h3>Leave-one-out ablation of {escape(ABLATED)}</h3><p>{escape(ABLATION_CAPTION)}.</p>",
        *(
            f"<h4>{escape(at_commit(size, run))}</h4>"
            + table(ABLATION_HEADER, ablation_rows(run, by_v), "html")
            for size, run, by_v in found
        ),
    ]


def speedup_parts(history: list[Run]) -> list[Part]:
    chart = _step_chart(
        history,
        named_speedups,
        "training-step speedup vs each variant's own reference "
        "(named under its bars), measured in the same run — wall clock, ms per step (reference / "
        "optimized); no bar: reference not measured in that run",
        "speedup vs its reference (×)",
        ref=1.0,
    )
    return [*chart, *ablation_parts(history)]


def memory_parts(history: list[Run]) -> list[Part]:
    """Per size, ms per step against memory (:func:`optbench.reporting.memory.time_against_memory`;
    checkpointing and the cross-entropy variants named), then the table of each step's measured
    memory beside its estimate; each size from the run that measured the most of it."""
    sizes = by_size(fullest(history, steps))
    if not sizes:
        return [note("No training-step results.")]
    panels = [(at_commit(size, run), *memory_points(run, size, by_v)) for size, run, by_v in sizes]
    drawn = [panel for panel in panels if panel[2]]
    chart: Part = (
        Chart(
            charts.time_against_memory,
            (
                f"{history[-1].label}\nms per step (wall clock) against memory, per size @ "
                f"commit; named: {', '.join(TRADES)} and eager",
                drawn,
                ("eager", *TRADES),
            ),
        )
        if drawn
        else note("No step with a memory figure to show (see the table).")
    )
    return [chart, table(memory_columns(sizes), memory_rows(sizes), "html"), note(MEMORY_NOTE)]


def throughput_parts(history: list[Run]) -> list[Part]:
    tokens: dict[str, dict[str, float]] = defaultdict(dict)
    util: dict[str, dict[str, float]] = defaultdict(dict)
    for size, run, variants in by_size(fullest(history, steps)):
        for variant, rec in variants.items():
            if (t := tokens_per_s(rec)) is not None:
                tokens[variant][at_commit(size, run)] = t
            if (u := mfu(rec, peak_profile(run))) is not None:
                util[variant][at_commit(size, run)] = 100 * u
    if not tokens:
        return [note("No training-step results with tokens per step.")]
    profile = peak_profile(history[-1])
    peak = f"the {profile.key} profile's peak TFLOPS" if profile else "no peak (n/a)"
    fig = Chart(
        charts.throughput,
        (
            f"{history[-1].label}\ntokens/s and MFU per optimization and size — wall clock; MFU "
            f"vs {peak}; legend: size @ commit",
            dict(tokens),
            dict(util),
        ),
    )
    if util:
        return [fig]
    if history[-1].emulated:
        return [fig, emulated_note(history[-1], "MFU")]
    return [fig, note("MFU: the hardware profile has no peak for this step's precision.")]


def roofline_parts(history: list[Run]) -> list[Part]:
    if history[-1].emulated:
        return [emulated_note(history[-1], "roofline fraction")]
    found = sorted(fullest(history, floor_ratios).items())
    if not found:
        return [note("No kernel results with a device time and known ceilings.")]
    fig = Chart(
        charts.roofline,
        (
            f"{history[-1].label}\nkernel device time / roofline floor — × (median ms per call / "
            "floor ms)\nbars: cold L2, dashes: warm L2; panels: op metric @ commit",
            [(at_commit(panel, run), shapes) for panel, (run, shapes) in found],
        ),
    )
    suspects = [
        [
            at_commit(panel, run),
            shape,
            impl,
            f"{r.cold:.2f}×",
            "yes" if r.fits_l2 else "no" if r.fits_l2 is not None else "not recorded",
        ]
        for panel, (run, shapes) in found
        for shape, by_impl in shapes.items()
        for impl, r in by_impl.items()
        if r.suspect
    ]
    if not suspects:
        return [fig]
    return [
        fig,
        note(
            f"Measurement problems: {len(suspects)} cold-L2 device times at or below their "
            "roofline floor (not drawn; ✗ in the chart). A time from HBM cannot beat the floor: "
            "the L2 was warm or the byte count is wrong."
        ),
        table(
            [
                "op metric @ commit",
                "shape",
                "implementation",
                "cold time / floor",
                "input set fits L2",
            ],
            suspects,
            "html",
        ),
    ]


@dataclass(frozen=True)
class Histories:
    """Each machine's :func:`optbench.reporting.data.time_histories` (``found``) and the position of
    each of its commits in the store's order (``order``): what the history page and the index
    read."""

    found: dict[str, list[TimeHistory]]
    order: dict[str, dict[str, int]]

    @classmethod
    def of(cls, store: ResultStore, machines: list[str], cache: ReportCache) -> Histories:
        return cls(
            {m: time_histories(store, m, cache=cache) for m in machines},
            {m: {c: i for i, c in enumerate(store.commits(m))} for m in machines},
        )


def _grid(title: str, series: list[TimeHistory], order: dict[str, int]) -> Chart:
    """A :func:`charts.history_grid` of ``series`` over the commits they were measured at."""
    commits = sorted({p.commit for s in series for p in s.commits}, key=order.__getitem__)
    return Chart(charts.history_grid, (title, series, commits))


def history_parts(histories: Histories, history: list[Run]) -> list[Part]:
    """The change points (:func:`change_point_parts`) and a chart of the metrics that changed (a
    change point, or a verdict of the gate on one GPU; those of the newest change first, at most
    :data:`MAX_PANELS`), the gate's verdicts as a table (oldest commit first) with the count of the
    differences between GPUs it does not list, then per benchmark a grid of
    :func:`charts.history_grid`: at most :data:`MAX_PANELS` charts, those flagged or with a change
    point first, then those measured most recently, then the longest histories."""
    machine, label = history[-1].machine, history[-1].label
    found, order = histories.found[machine], histories.order[machine]
    if not found:
        if len(history) < 2:
            return [note("No metric was measured at two commits or more.")]
        return [
            '<p class="note">No metric was measured at two commits or more outside the rounds of '
            "optbench ab, whose records this trend leaves out (timed in lockstep, or without their "
            'check); <a href="index.html#machines">the machines table</a> counts their commits '
            "too.</p>"
        ]
    parts = change_point_parts(found, order)

    def newest_change(s: TimeHistory) -> int:
        return max(
            [order[p.commit] for p in s.flagged] + [order[cp.after] for cp in s.change_points]
        )

    changed = sorted((s for s in found if s.flagged or s.change_points), key=newest_change)
    if changed:
        parts.append(
            _grid(
                f"{label}\nthe metrics with a change point or a verdict of the gate on one GPU, "
                "newest change first: ms per call by commit",
                changed[::-1][:MAX_PANELS],
                order,
            )
        )
    flagged = sorted(
        ((s, point) for s in found for point in s.flagged), key=lambda sp: order[sp[1].commit]
    )
    parts.append(
        f"<p>{len(flagged)} changes flagged by the regression gate between consecutive commits on "
        f"one GPU, in {len(found)} metrics measured at two commits or more; "
        f"{sum(s.cross_gpu for s in found)} differences beyond the threshold between runs on "
        "different GPUs only are no change and are not listed.</p>"
    )
    if flagged:
        parts.append(
            table(
                ["commit", "benchmark", "params metric (clock)", "head/base", "verdict"],
                [
                    [
                        point.commit[:12],
                        s.benchmark,
                        s.label,
                        "" if point.ratio is None else f"{point.ratio:.3f}×",
                        point.verdict,
                    ]
                    for s, point in flagged
                ],
                "html",
                marks=[point.verdict for _, point in flagged],
            )
        )
    by_benchmark: dict[str, list[TimeHistory]] = defaultdict(list)
    for s in found:
        by_benchmark[s.benchmark].append(s)
    for benchmark, series in sorted(by_benchmark.items()):
        chosen = sorted(
            series,
            key=lambda s: (
                not (s.flagged or s.change_points),
                -order[s.commits[-1].commit],
                -len(s.commits),
            ),
        )[:MAX_PANELS]
        parts.append(f"<h3>{escape(benchmark)}</h3>")
        if len(series) > len(chosen):
            parts.append(
                note(
                    f"{len(chosen)} of its {len(series)} metrics: those flagged or with "
                    "a change point, then those measured most recently, then the "
                    "longest histories (asv's graphs hold every metric)."
                )
            )
        parts.append(_grid(f"{label}\n{benchmark}: ms per call by commit", chosen, order))
    return parts


def change_point_parts(found: list[TimeHistory], order: dict[str, int]) -> list[Part]:
    """How many series of a metric on one GPU were searched, and the change points found as a table
    (:data:`optbench.reporting.dashboard.CHANGE_POINT_COLUMNS`), newest first (``order``: a commit's
    position on the machine)."""
    points = change_points_newest_first(found, order)
    parts: list[Part] = [f"<p>{escape(change_point_summary(found, len(points)))}</p>"]
    if points:
        parts.append(
            table(CHANGE_POINT_COLUMNS, [change_point_row(s, cp) for s, cp in points], "html")
        )
    return parts


def compare_parts(
    store: ResultStore, pair: tuple[str, str] | None, history: list[Run], limit: int = 50
) -> list[Part]:
    """Table and chart of base → head (default: the two newest commits by date) on one machine."""
    machine = history[-1].machine
    if pair is None:
        if len(history) < 2:
            return [note("Only one commit: nothing to compare.")]
        base, head = history[-2].commit, history[-1].commit
    else:
        base, head = (resolve(store, machine, ref) for ref in pair)
        if base is None or head is None:
            return [note(f"No results of both {pair[0]} and {pair[1]} on this machine.")]
    changes = compare(store, base, head, [machine])
    # what the gate judges first, and failures; moves it does not judge (seen only across GPUs, or
    # a host-bound time on a GPU, which ab's lockstep rounds decide) are counted, not listed
    listed = [c for c in changes if shown(c) and (c.gated or not c.significant)]
    trends = [c for c in changes if c.significant and not c.gated]
    across = sum(c.reason == CROSS_GPU for c in trends)
    host = sum(c.reason == HOST_BOUND for c in trends)
    parts: list[Part] = [
        f"<p>{escape(base[:12])} → {escape(head[:12])}: {len(listed)} of "
        f"{sum(map(compared, changes))} metrics with results at both commits changed on one GPU "
        "beyond what their noise lets the gate detect, or fail at head"
        + (
            f"; {across} difference{'s' * (across != 1)} beyond the threshold between runs on "
            "different GPUs only, not gated and not listed"
            if across
            else ""
        )
        + (
            f"; {host} host-bound time{'s' * (host != 1)} moved beyond the threshold, not gated "
            "(ab's lockstep rounds decide them) and not listed"
            if host
            else ""
        )
        + ".</p>"
    ]
    if listed:
        parts.append(table(COLUMNS, rows(listed), "html", marks=[verdict(c) for c in listed]))
    ratios = sorted(
        (c for c in listed if c.ratio is not None and math.isfinite(c.ratio) and c.ratio > 0),
        key=lambda c: -abs(math.log(c.ratio)),
    )[:limit]
    if ratios:
        parts.append(
            Chart(
                charts.changes,
                (
                    f"{history[-1].label}, {base[:8]} → {head[:8]}: significant changes, head/base "
                    "− 1 in %\ntimes: median ms by the clock in brackets; memory: peak bytes",
                    [f"{' '.join(r[:3])} ({r[3] or 'memory'})" for r in rows(ratios)],
                    ratios,
                ),
            )
        )
    return parts


class Output:
    """optbench's pages as written into one folder, each file with the key of its cache entry: the
    manifest from which a publish of the same records writes the same files again."""

    def __init__(self, folder: Path, cache: ReportCache) -> None:
        self.folder, self.cache = folder, cache
        self.files: dict[str, str] = {}  # name -> cache key
        self.charts = 0
        self.drawn = 0

    def _write(self, name: str, key: str, data: bytes) -> None:
        (self.folder / name).write_bytes(data)
        self.files[name] = key

    def chart(self, name: str, chart: Chart) -> None:
        """The PNG of ``chart``: the one kept for its inputs, else drawn."""
        key = ReportCache.key("chart", chart)
        made = self.cache.made
        self._write(name, key, self.cache.make(key, chart.png))
        self.charts += 1
        self.drawn += self.cache.made - made

    def text(self, name: str, text: str) -> None:
        data = text.encode("utf-8")
        key = ReportCache.key("file", data)
        self._write(name, key, self.cache.make(key, lambda: data))

    def manifest(self) -> bytes:
        """The files written and every cache entry used to make them."""
        used = sorted(self.cache.used)
        return json.dumps({"files": self.files, "used": used}, sort_keys=True).encode()

    def restore(self, manifest: bytes) -> bool:
        """Write the files of a :meth:`manifest` from the cache; False, writing nothing, where one
        is no longer kept."""
        found = json.loads(manifest)
        data = {name: self.cache.get(key) for name, key in found["files"].items()}
        if any(d is None for d in data.values()):
            return False
        for name, d in data.items():
            assert d is not None
            self._write(name, found["files"][name], d)
        self.cache.used.update(found["used"])
        return True


def _slug(machine: str) -> str:
    """The machine as its PNGs and anchors name it (``optbench.measure.hardware.slugify``, imported
    where a page is written: it imports torch, which a publish of unchanged records never needs)."""
    from optbench.measure.hardware import slugify

    return slugify(machine)


def _section(run: Run, parts: list[Part], out: Output, stem: str) -> tuple[str, list[str]]:
    """A machine's section of a page (its HTML, anchored by the machine's slug) and the names of its
    charts' PNGs, ``<stem>-<part>.png``."""
    html = [f'<h2 id="{_slug(run.machine)}">{escape(run.label)}</h2>']
    images = []
    for i, part in enumerate(parts):
        if isinstance(part, Chart):
            name = f"{stem}-{i}.png"
            out.chart(name, part)
            images.append(name)
            html.append(f'<p><img src="{name}" alt="{escape(run.label)}"></p>')
        else:
            html.append(part)
    return "\n".join(html), images


Images = dict[tuple[str, str], list[str]]  # (page, machine) -> its section's PNGs


def write_page(
    out: Output,
    name: str,
    found: dict[str, list[Run]],
    chart: Callable[[list[Run]], list[Part]],
    images: Images,
) -> None:
    """One page: what it shows, how it is made (folded), then per machine the parts chart() gives
    for its runs; each section's PNGs go to ``images``."""
    title, lead, more = PAGES[name]
    body = [
        f"<p>{escape(lead)}</p>",
        f"<details><summary>How this page is made</summary><p>{escape(more)}</p></details>",
    ]
    for m, h in found.items():
        section, images[name, m] = _section(h[-1], chart(h), out, f"{name}-{_slug(m)}")
        body.append(section)
    if not found:
        body.append(note("No optbench results."))
    out.text(
        f"{name}.html", PAGE.substitute(title=escape(title), body="\n".join(body), root=PAGES_ROOT)
    )


HEADLINE_NOTE = (
    "Each size's fastest training step (wall clock, median ms per optimizer step [IQR]) in the run "
    "that measured the most of the size; × eager: eager's median over it, same run; × HF: "
    "HF + torch.compile's over our fastest; peak GB: the step's memory as memory.html shows it "
    "(MB where named; † where the record has no case peak: the extra memory of one step call "
    "above what the process held before it, weights and optimizer state not counted; "
    "– for a step replayed from a CUDA graph whose record has no case peak: its per-call figure "
    "reads ~0 by how it is measured; ° measured by the case meter before its version 2, which read "
    "a step after a CUDA-graph case of its process low)."
)


def newest_run_link(found: dict[str, list[Run]]) -> list[str]:
    """A line leading to the machine of the newest run where the page's order (real GPUs first,
    :func:`optbench.reporting.data.runs`) does not put it first: the run a user just made on
    their own machine, a CPU say, would sit below every GPU's section. The newest is that of the
    newest record (an ab round's records are not in a Run, though its machine record is)."""

    dated = [
        (rec.date, machine, run)
        for machine, history in found.items()
        for run in history
        for key, rec in run.records.items()
        if key != MACHINE_KEY
    ]
    if not dated:
        return []
    date, machine, run = max(dated, key=lambda d: d[0])
    if machine == next(iter(found)):
        return []
    return [
        f'<p>Newest run: <a href="#{_slug(machine)}">{escape(run.label)}</a>, commit '
        f"{escape(run.commit[:12])}, {escape(date)}.</p>"
    ]


INDEX_GATE_CALLS = 3  # the index shows the gate's newest calls; docs/results.md shows more


def write_index(
    out: Output,
    found: dict[str, list[Run]],
    histories: Histories,
    images: Images,
    gate: dict[str, list[list[str]]],
) -> None:
    """The index: per machine its headline (:func:`optbench.reporting.dashboard.headline_rows`),
    x HF of the newest run of each size, the convergence check's verdicts, the regression gate's
    newest calls (``gate``: :mod:`optbench.reporting.gate_calls`' rows), its newest change points
    and a thumbnail of each page's first chart for it; then every machine's commits."""
    links = " · ".join(
        f'<a href="{name}.html">{escape(title)}</a>' for name, (title, _, _) in PAGES.items()
    )
    body = [
        f'<p>{links} · <a href="../asv/index.html">asv benchmarks</a></p>',
        *newest_run_link(found),
        note(HEADLINE_NOTE),
    ]
    for m, history in found.items():
        slug = _slug(m)
        body.append(f'<h2 id="{slug}">{escape(history[-1].label)}</h2>')
        rows = headline_rows(history)
        body.append(
            table(HEADLINE_COLUMNS, rows, "html") if rows else note("No training-step results.")
        )
        if paired := newest_per_size(hf_runs(history, limit=None)):
            caption, header, hf_rows = hf_table(paired)
            body += [note(f"The newest of each size. {caption}"), table(header, hf_rows, "html")]
        if verdicts := convergence_rows(history):
            caption, header, rows = convergence_table(verdicts)
            body += [note(caption), table(header, rows, "html")]
        if gate.get(m):
            body += [note(GATE_CAPTION), table(GATE_HEADER, gate[m], "html")]
        points = change_points_newest_first(histories.found[m], histories.order[m])
        summary = change_point_summary(histories.found[m], len(points))
        body.append(
            f'<p>{escape(summary)} <a href="history.html#{slug}">Every metric over commits</a>.</p>'
        )
        if points:
            newest = points[:NEWEST_CHANGE_POINTS]
            body.append(
                table(CHANGE_POINT_COLUMNS, [change_point_row(s, cp) for s, cp in newest], "html")
            )
        thumbs = "".join(
            f'<figure><a href="{page}.html#{slug}"><img src="{images[page, m][0]}" '
            f'alt="{escape(title)}"></a><figcaption>{escape(title)}</figcaption></figure>'
            for page, (title, _, _) in PAGES.items()
            if images.get((page, m))
        )
        body.append(f'<div class="thumbs">{thumbs}</div>')
    body.append('<h2 id="machines">Machines</h2>')
    body.append(
        table(
            ["machine", "commits", "newest commit", "date"],
            [[h[-1].label, len(h), h[-1].commit[:12], h[-1].date] for h in found.values()],
            "html",
        )
    )
    out.text(
        "index.html",
        PAGE.substitute(title="optbench report", body="\n".join(body), root=PAGES_ROOT),
    )


ASV_INPUTS = ".optbench-inputs"  # in asv's tree: the digest of what it was published from


def asv_publish(results: Path, html: Path) -> str | None:
    """asv's site into ``<html>/asv/`` (asv empties that folder first, so it holds nothing else),
    asv's own output shown only where it fails; None where asv published, else why not."""
    from optbench.asv.asv_atomic import asv

    if results.resolve() != (REPO_ROOT / "results").resolve():
        return f"skipped: asv reads asv.conf.json's results_dir, not {results}"
    if not any(p.name != "machine.json" for p in asv_results_dir(results).glob("*/*.json")):
        return f"skipped: no asv results in {asv_results_dir(results)}"
    if asv(["publish", "--no-pull", "--html-dir", str((html / "asv").resolve())], echo=False):
        return "asv publish failed (its output above)"
    return None


def _branch_heads(conf: Path) -> str:
    """The commits of the branches the asv configuration ``conf`` names (git rev-parse's output;
    '' without git)."""
    branches = json.loads(conf.read_text()).get("branches", [])
    try:
        return subprocess.run(
            ["git", "rev-parse", *branches], cwd=REPO_ROOT, capture_output=True, text=True
        ).stdout
    except OSError:
        return ""


def _asv_inputs(results: Path) -> str:
    """A digest of what asv's site is made from: the results root and asv's results in it,
    asv.conf.json, the commits of the branches it names, and the code (asv's version with it)."""
    conf = REPO_ROOT / "asv.conf.json"
    found = files_digest(asv_results_dir(results))
    heads = _branch_heads(conf)
    return ReportCache.key("asv", (str(results.resolve()), found, conf.read_bytes(), heads))


def _asv_site(results: Path, stage: Path) -> str:
    """asv's site into ``<stage>/asv/`` with the digest of its inputs (:func:`_asv_inputs`), unless
    the published one beside the stage was made from the same; what the publish says of it."""
    inputs, published = _asv_inputs(results), stage.parent / "asv"
    with contextlib.suppress(OSError):
        if (published / ASV_INPUTS).read_text() == inputs:
            return f"{published / 'index.html'} (unchanged)"
    problem = asv_publish(results, stage)
    if problem is None and (stage / "asv").is_dir():
        (stage / "asv" / ASV_INPUTS).write_text(inputs)
    return problem or str(published / "index.html")


STAGE_PREFIX = ".publish-"  # the folder in <html>/ that a publish writes its trees into first
STALE_STAGE_S = 3600.0  # a stage folder this old was left by a publish that was killed: removed


def _rename_exchange(new: Path, target: Path) -> bool:
    """Swap two paths in one step (Linux's ``renameat2(RENAME_EXCHANGE)``); False where
    unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    rename = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if rename is None:
        return False
    at_cwd, exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE (linux/fcntl.h, linux/fs.h)
    return rename(at_cwd, os.fsencode(new), at_cwd, os.fsencode(target), exchange) == 0


def swap_in(new: Path, target: Path) -> None:
    """Put the complete tree ``new`` at ``target``; the tree that was there ends up inside ``new``'s
    parent, to be removed with it. Readers see the old tree or the new one: in one step where the
    kernel swaps two paths (:func:`_rename_exchange`), else by two renames, between which ``target``
    is missing and the old tree whole beside ``new``."""
    if not target.exists():
        os.rename(new, target)
    elif not _rename_exchange(new, target):
        os.rename(target, new.with_name(f"{new.name}.old"))
        os.rename(new, target)


def _remove_stale_stages(html: Path) -> None:
    """Remove the stage folders that publishes killed midway left in ``html``."""
    for stage in html.glob(f"{STAGE_PREFIX}*"):
        with contextlib.suppress(OSError):
            if time.time() - stage.stat().st_mtime > STALE_STAGE_S:
                shutil.rmtree(stage)


CACHE = ".cache/report"  # the report's cache (optbench.reporting.cache), in the HTML root


def publish(
    results: Path | str | None = None,
    html: Path | str | None = None,
    pair: tuple[str, str] | None = None,
) -> Path:
    """asv publish into ``<html>/asv/``, then optbench's pages under ``<html>/optbench/`` and a
    landing page ``<html>/index.html`` linking both; returns optbench's index.html, and prints one
    line: where, how long, how many charts were drawn, and asv's site. asv's pages need an HTTP
    server (``asv preview``, or ``python3 -m http.server -d html``); optbench's open from disk.

    Each tree is written whole into a new folder beside them (``<html>/.publish-*``), then swapped
    in by renames (:func:`swap_in`) and the previous one removed: a publish that fails or is killed
    at any point leaves every tree as it was or as the new one, never a part (asv's as it was where
    asv writes none, or its inputs did not change).

    Only what changed is made again (:data:`CACHE`): a chart whose inputs were drawn before is
    reused, the pages of records that did not change are written as before, byte for byte what a
    first publish writes; the cache then keeps only what this publish used.

    ``pair`` (BASE, HEAD) picks the commits of the compare page (default: each machine's two
    newest).
    """
    started = time.perf_counter()
    results = Path(results) if results is not None else results_dir()
    html = Path(html) if html is not None else REPO_ROOT / "html"
    html.mkdir(parents=True, exist_ok=True)
    _remove_stale_stages(html)
    cache = ReportCache(html / CACHE)
    stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=html))
    try:
        said = _write_trees(results, stage, pair, cache)
        for name in ("asv", "optbench"):
            if (stage / name).exists():
                swap_in(stage / name, html / name)
        os.replace(stage / "index.html", html / "index.html")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    cache.prune()
    index = html / "optbench" / "index.html"
    print(f"optbench report: {index} in {time.perf_counter() - started:.1f} s; {said}", flush=True)
    return index


def _write_trees(
    results: Path, html: Path, pair: tuple[str, str] | None, cache: ReportCache
) -> str:
    """asv's site (:func:`_asv_site`), optbench's pages and the landing page into the empty folder
    ``html``; what the publish says of them. Without ``pair``, the pages of a store whose records
    are those of a publish kept in ``cache`` are written from its manifest."""
    asv_said = _asv_site(results, html)
    out = Output(html / "optbench", cache)
    out.folder.mkdir()
    store = ResultStore(results)
    records = [  # the pages read the records and the gate's pairing records
        (m, files_digest(store.root / m / RECORDS_DIR), files_digest(store.root / m / PAIRING_DIR))
        for m in store.machines()
    ]
    site = ReportCache.key("site", records)
    manifest = None if pair else cache.get(site)
    if manifest is not None and out.restore(manifest):
        pages = "records unchanged: the pages as before"
    else:
        _write_pages(store, out, pair, cache)
        if pair is None:
            cache.put(site, out.manifest())
        pages = f"{out.drawn} of {out.charts} charts drawn"
    landing = (
        '<ul><li><a href="optbench/index.html">optbench report</a>: charts, compare, history</li>'
        '<li><a href="asv/index.html">asv benchmarks</a> (served: <code>asv preview</code> or '
        "<code>python3 -m http.server -d html</code>)</li></ul>"
    )
    page = PAGE.substitute(title="optbench", body=landing, root="")
    (html / "index.html").write_text(page, encoding="utf-8")
    return f"{pages}; asv's site: {asv_said}"


def _write_pages(
    store: ResultStore, out: Output, pair: tuple[str, str] | None, cache: ReportCache
) -> None:
    """Every page of :data:`PAGES`, then the index."""
    found = runs(store)
    histories = Histories.of(store, list(found), cache)
    parts = {
        "speedup": speedup_parts,
        "memory": memory_parts,
        "throughput": throughput_parts,
        "roofline": roofline_parts,
        "history": partial(history_parts, histories),
        "compare": partial(compare_parts, store, pair),
    }
    images: Images = {}
    for name in PAGES:
        write_page(out, name, found, parts[name], images)
    gate = {m: [gate_row(c) for c in gate_calls(store, m, INDEX_GATE_CALLS)] for m in found}
    write_index(out, found, histories, images, gate)


def main(argv: list[str] | None = None) -> int:
    """``optbench report``: asv's site and optbench's pages; --headline rewrites docs/results.md.
    Exit 0; 2, with one line on stderr and nothing written, where a ref of ``--compare`` has no
    stored runs on any machine (``optbench.gate.compare.resolve``)."""
    p = argparse.ArgumentParser(
        prog="optbench report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--results", type=Path, help="results root (default $OPTBENCH_RESULTS or results/)"
    )
    p.add_argument(
        "--html", type=Path, help="HTML root (default html/); optbench's pages go to optbench/"
    )
    p.add_argument(
        "--compare", nargs=2, metavar=("BASE", "HEAD"), help="commits of the compare page"
    )
    p.add_argument(
        "--headline", action="store_true", help=f"rewrite the headline page {HEADLINE_PAGE}"
    )
    args = p.parse_args(argv)
    if args.compare:
        store = ResultStore(args.results)
        unknown = [
            ref
            for ref in args.compare
            if not any(resolve(store, machine, ref) for machine in store.machines())
        ]
        if unknown:
            print(
                f"optbench report: --compare {' '.join(args.compare)}: "
                f"{' and '.join(map(repr, unknown))} {'has' if len(unknown) == 1 else 'have'} "
                f"no stored runs on any machine (results in {store.root}); nothing written",
                file=sys.stderr,
            )
            return 2
    publish(args.results, args.html, args.compare)
    if args.headline:
        write_headline(REPO_ROOT / HEADLINE_PAGE, ResultStore(args.results))
        print(f"optbench report: headline written to {REPO_ROOT / HEADLINE_PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
