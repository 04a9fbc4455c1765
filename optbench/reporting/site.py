"""``optbench report``: asv's site and optbench's HTML pages of charts beside it (and, with
``--headline``, the headline page docs/results.md, :mod:`optbench.reporting.headline`).

Pages under ``html/optbench/``, a section per machine each (an emulated machine is labelled
"(emulated)" and never shares a chart with a real one):

- ``speedup.html``: training-step speedup of each optimization vs its own reference
  (models.variants.reference: eager unless the variant names another), per model size (wall clock);
  the leave-one-out ablation of best-kernels per size;
- ``memory.html``: peak device memory of one training step per optimization and size (GiB);
- ``throughput.html``: tokens/s and MFU per size (wall clock); MFU = step FLOPs / step seconds / the
  hardware profile's peak TFLOPS for the step's precision (bf16 unless the record says otherwise);
  none for an emulated run (its times are the real GPU's, its profile the emulated card's);
- ``roofline.html``: each kernel's cold-L2 device time over its roofline floor, max(flops/peak,
  bytes/bandwidth), with the warm-L2 time beside it; a cold time at or below the floor is listed as
  a measurement problem, not drawn; none for an emulated run;
- ``history.html``: per benchmark, a small chart per metric of its time over commits (each run's
  median and IQR), the changes the regression gate flags between consecutive commits marked, and the
  change points of each GPU's series (:mod:`optbench.core.changepoints`) banded and listed;
- ``compare.html``: two commits side by side (optbench.gate.compare): table and chart of head/base
  changes.

Figures come from :mod:`optbench.reporting.data`, charts from :mod:`optbench.reporting.charts`;
legends and columns name the commit each figure comes from.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from html import escape
from pathlib import Path
from string import Template

from matplotlib.figure import Figure

from models.variants import ABLATED
from optbench.core.changepoints import MIN_COMMITS, MIN_MAGNITUDE, ChangePoint, short_unit
from optbench.core.console import table
from optbench.core.store import REPO_ROOT, ResultStore, asv_results_dir, results_dir
from optbench.gate.compare import COLUMNS, compare, compared, resolve, rows, shown, verdict
from optbench.reporting import charts
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
    step_peaks,
    steps,
    time_histories,
    tokens_per_s,
)
from optbench.reporting.headline import HEADLINE_PAGE, write_headline

MAX_PANELS = 24  # history charts per benchmark and machine

PAGES: dict[str, tuple[str, str]] = {
    "speedup": (
        "Training-step speedup vs each variant's reference, and the ablation of best-kernels",
        "Wall clock, ms per optimizer step: reference median / optimization median, both from one "
        "run, each variant's reference named under its bars (eager for the best-* combinations); "
        "higher is better. Then per size, best-kernels with each switch left out in turn, from "
        "one run.",
    ),
    "memory": (
        "Peak memory per training step",
        "Peak device memory above the starting point during one optimizer step, GiB (a peak: no "
        "clock).",
    ),
    "throughput": (
        "Tokens/s and MFU per size",
        "Wall clock: tokens per step / median step seconds; MFU = FLOPs per step / median step "
        "seconds / the hardware profile's peak TFLOPS for the step's precision (bf16 by "
        "default); n/a for an emulated run.",
    ),
    "roofline": (
        "Kernel time over its roofline floor",
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
        "Per benchmark, a chart per metric measured at two commits or more, by the record's "
        "primary clock (wall where it has no device time): each run's median ms with its samples' "
        "IQR, commits in the order of their first run, a line through each commit's geometric "
        "mean. Bands mark what the regression gate (optbench compare) flags from the machine's "
        "previous commit: red a regression, green an improvement, gray a change it reports but "
        "does not gate. Hatched purple bands span the commit range of each change point: asv's "
        "step detection over each GPU's own series (the median of its runs per commit; never two "
        f"GPUs in one series), on series of at least {MIN_COMMITS} commits, kept where the step "
        f"exceeds both segments' mean absolute deviation and {MIN_MAGNITUDE:.0%}; significance = "
        f"step / the larger of the two. At most {MAX_PANELS} charts per benchmark: those flagged "
        "or with a change point, then those measured most recently, then the longest histories; "
        "asv's graphs hold every metric.",
    ),
    "compare": (
        "Two commits side by side",
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

Part = Figure | str  # a chart, or HTML

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
    return [
        charts.step_bars(
            f"{history[-1].label}\n{what}; legend: size @ commit", by_column, ylabel, ref=ref
        )
    ]


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
    return _step_chart(
        history,
        step_peaks,
        "peak extra device memory of one training step, above what was allocated before it — GiB "
        "(a peak, no clock; a step that replays a CUDA graph allocated its memory at capture: 0)",
        "peak memory (GiB)",
    )


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
    fig = charts.throughput(
        f"{history[-1].label}\ntokens/s and MFU per optimization and size — wall clock; MFU "
        f"vs {peak}; legend: size @ commit",
        tokens,
        util,
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
    fig = charts.roofline(
        f"{history[-1].label}\nkernel device time / roofline floor — × (median ms per call / "
        "floor ms)\nbars: cold L2, dashes: warm L2; panels: op metric @ commit",
        [(at_commit(panel, run), shapes) for panel, (run, shapes) in found],
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


def history_parts(store: ResultStore, history: list[Run]) -> list[Part]:
    """The gate's flagged changes as a table (oldest commit first), the change points
    (:func:`change_point_parts`), then per benchmark a grid of :func:`charts.history_grid`: at most
    :data:`MAX_PANELS` charts, those flagged or with a change point first, then those measured most
    recently, then the longest histories."""
    machine = history[-1].machine
    found = time_histories(store, machine)
    if not found:
        return [note("No metric was measured at two commits or more.")]
    order = {commit: i for i, commit in enumerate(store.commits(machine))}
    flagged = sorted(
        ((s, point) for s in found for point in s.flagged), key=lambda sp: order[sp[1].commit]
    )
    parts: list[Part] = [
        f"<p>{len(flagged)} changes flagged between consecutive commits in {len(found)} metrics "
        "measured at two commits or more.</p>"
    ]
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
    parts += change_point_parts(found, order)
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
        )
        chosen = chosen[:MAX_PANELS]
        commits = sorted({p.commit for s in chosen for p in s.commits}, key=order.__getitem__)
        parts.append(f"<h3>{escape(benchmark)}</h3>")
        if len(series) > len(chosen):
            parts.append(
                note(
                    f"{len(chosen)} of its {len(series)} metrics: those flagged or with "
                    "a change point, then those measured most recently, then the "
                    "longest histories (asv's graphs hold every metric)."
                )
            )
        parts.append(
            charts.history_grid(
                f"{history[-1].label}: {benchmark}, ms per call by commit", chosen, commits
            )
        )
    return parts


CHANGE_POINT_COLUMNS = [
    "benchmark",
    "params metric (clock)",
    "GPU / machine",
    "last commit before → first after",
    "after/before",
    "significance (step / L1 error)",
]


def change_point_row(s: TimeHistory, cp: ChangePoint) -> list[str]:
    """A change point's cells (:data:`CHANGE_POINT_COLUMNS`): GPU UUIDs and commits shortened to 12
    characters (``optbench.core.changepoints.short_unit``)."""
    significance = "∞" if math.isinf(cp.significance) else f"{cp.significance:.1f}"
    return [
        s.benchmark,
        s.label,
        short_unit(cp.unit),
        f"{cp.before[:12]} → {cp.after[:12]}",
        f"{cp.ratio:.3f}×",
        significance,
    ]


def change_point_parts(found: list[TimeHistory], order: dict[str, int]) -> list[Part]:
    """How many series of a metric on one GPU were searched, and the change points found as a table
    ordered by their first commit after (``order``: a commit's position on the machine)."""
    points = sorted(
        ((s, cp) for s in found for cp in s.change_points),
        key=lambda scp: (order[scp[1].after], scp[0].key, scp[1].unit),
    )
    searched = sum(s.searched_units() for s in found)
    parts: list[Part] = [
        f"<p>{len(points)} change points in {searched} series of a metric on one "
        f"GPU measured at {MIN_COMMITS} commits or more (the only ones "
        "searched).</p>"
    ]
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
    listed = [c for c in changes if shown(c)]
    parts: list[Part] = [
        f"<p>{escape(base[:12])} → {escape(head[:12])}: {len(listed)} of "
        f"{sum(map(compared, changes))} metrics with results at both commits changed "
        "beyond what their noise lets the gate detect, or fail at head.</p>"
    ]
    if listed:
        parts.append(table(COLUMNS, rows(listed), "html", marks=[verdict(c) for c in listed]))
    ratios = sorted(
        (c for c in listed if c.ratio is not None and math.isfinite(c.ratio) and c.ratio > 0),
        key=lambda c: -abs(math.log(c.ratio)),
    )[:limit]
    if ratios:
        parts.append(
            charts.changes(
                f"{history[-1].label}, {base[:8]} → {head[:8]}: significant changes, head/base − 1 "
                "in %\ntimes: median ms by the clock in brackets; memory: peak bytes",
                [f"{' '.join(r[:3])} ({r[3] or 'memory'})" for r in rows(ratios)],
                ratios,
            )
        )
    return parts


def _section(run: Run, parts: list[Part], out: Path, stem: str) -> str:
    html = [f"<h2>{escape(run.label)}</h2>"]
    for i, part in enumerate(parts):
        if isinstance(part, Figure):
            name = f"{stem}-{i}.png"
            part.savefig(out / name, dpi=80)
            html.append(f'<p><img src="{name}" alt="{escape(run.label)}"></p>')
        else:
            html.append(part)
    return "\n".join(html)


def write_page(
    out: Path, name: str, found: dict[str, list[Run]], chart: Callable[[list[Run]], list[Part]]
) -> None:
    """One page: its description, then per machine the parts chart() gives for its runs."""
    from optbench.core.hardware import slugify

    title, description = PAGES[name]
    body = [f"<p>{escape(description)}</p>"]
    body += [_section(h[-1], chart(h), out, f"{name}-{slugify(m)}") for m, h in found.items()]
    if not found:
        body.append(note("No optbench results."))
    page = PAGE.substitute(title=escape(title), body="\n".join(body), root=PAGES_ROOT)
    (out / f"{name}.html").write_text(page, encoding="utf-8")


def write_index(out: Path, found: dict[str, list[Run]]) -> None:
    links = "".join(
        f'<li><a href="{name}.html">{escape(title)}</a>: {escape(what)}</li>'
        for name, (title, what) in PAGES.items()
    )
    machines = table(
        ["machine", "commits", "newest commit", "date"],
        [[h[-1].label, len(h), h[-1].commit[:12], h[-1].date] for h in found.values()],
        "html",
    )
    asv = '<li><a href="../asv/index.html">asv benchmarks</a></li>'
    body = f"<ul>{links}{asv}</ul><h2>Machines</h2>{machines}"
    page = PAGE.substitute(title="optbench report", body=body, root=PAGES_ROOT)
    (out / "index.html").write_text(page, encoding="utf-8")


def asv_publish(results: Path, html: Path) -> None:
    """asv's site into ``<html>/asv/`` (asv empties that folder first, so it holds nothing else); a
    printed note instead where asv has nothing to do."""
    from optbench.core.asv_atomic import asv

    if results.resolve() != (REPO_ROOT / "results").resolve():
        print(
            "optbench report: asv publish skipped: asv reads asv.conf.json's results_dir, not "
            f"{results}"
        )
    elif not any(p.name != "machine.json" for p in asv_results_dir(results).glob("*/*.json")):
        print(f"optbench report: asv publish skipped: no asv results in {asv_results_dir(results)}")
    elif asv(["publish", "--no-pull", "--html-dir", str((html / "asv").resolve())]) != 0:
        print("optbench report: asv publish failed (see above); writing optbench's pages anyway")


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


def publish(
    results: Path | str | None = None,
    html: Path | str | None = None,
    pair: tuple[str, str] | None = None,
) -> Path:
    """asv publish into ``<html>/asv/``, then optbench's pages under ``<html>/optbench/`` and a
    landing page ``<html>/index.html`` linking both; returns optbench's index.html. asv's pages need
    an HTTP server (``asv preview``, or ``python3 -m http.server -d html``); optbench's open from
    disk.

    Each tree is written whole into a new folder beside them (``<html>/.publish-*``), then swapped
    in by renames (:func:`swap_in`) and the previous one removed: a publish that fails or is killed
    at any point leaves every tree as it was or as the new one, never a part (asv's as it was where
    asv writes none).

    ``pair`` (BASE, HEAD) picks the commits of the compare page (default: each machine's two
    newest).
    """
    results = Path(results) if results is not None else results_dir()
    html = Path(html) if html is not None else REPO_ROOT / "html"
    html.mkdir(parents=True, exist_ok=True)
    _remove_stale_stages(html)
    stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=html))
    try:
        _write_trees(results, stage, pair)
        for name in ("asv", "optbench"):
            if (stage / name).exists():
                swap_in(stage / name, html / name)
        os.replace(stage / "index.html", html / "index.html")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return html / "optbench" / "index.html"


def _write_trees(results: Path, html: Path, pair: tuple[str, str] | None) -> None:
    """asv's site, optbench's pages and the landing page into the empty folder ``html``."""
    asv_publish(results, html)
    out = html / "optbench"
    out.mkdir()
    store = ResultStore(results)
    found = runs(store)
    parts = {
        "speedup": speedup_parts,
        "memory": memory_parts,
        "throughput": throughput_parts,
        "roofline": roofline_parts,
        "history": partial(history_parts, store),
        "compare": partial(compare_parts, store, pair),
    }
    for n, name in enumerate(PAGES, 1):
        started = time.perf_counter()
        write_page(out, name, found, parts[name])
        print(
            f"optbench report: page {n} of {len(PAGES)}, {name}.html, "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
    write_index(out, found)
    landing = (
        '<ul><li><a href="optbench/index.html">optbench report</a>: charts, compare, history</li>'
        '<li><a href="asv/index.html">asv benchmarks</a> (served: <code>asv preview</code> or '
        "<code>python3 -m http.server -d html</code>)</li></ul>"
    )
    page = PAGE.substitute(title="optbench", body=landing, root="")
    (html / "index.html").write_text(page, encoding="utf-8")


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
    print(f"optbench report: {publish(args.results, args.html, args.compare)}")
    if args.headline:
        write_headline(REPO_ROOT / HEADLINE_PAGE, ResultStore(args.results))
        print(f"optbench report: headline written to {REPO_ROOT / HEADLINE_PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
