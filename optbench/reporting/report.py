"""optbench's report: HTML pages of matplotlib charts beside asv's site, and the README headline table.

Pages under ``html/optbench/``, one chart per machine each (an emulated machine is labelled "(emulated)"
and never shares a panel with a real one):

- ``speedup.html``: training-step speedup of each optimization vs its own reference (models.variants.reference:
  eager unless the variant names another), per model size (wall clock); the leave-one-out ablation of
  best-kernels per size;
- ``memory.html``: peak device memory of one training step per optimization and size (GiB);
- ``throughput.html``: tokens/s and MFU per size (wall clock); MFU = step FLOPs / step seconds / the
  hardware profile's peak TFLOPS for the step's precision (bf16 unless the record says otherwise); none for
  an emulated run (its times are the real GPU's, its profile the emulated card's);
- ``roofline.html``: each kernel's cold-L2 device time over its roofline floor, max(flops/peak,
  bytes/bandwidth), with the warm-L2 time beside it; a cold time at or below the floor is listed as a
  measurement problem, not drawn; none for an emulated run;
- ``history.html``: the headline speedups over the commits of each machine;
- ``compare.html``: two commits side by side (optbench.core.compare): table and chart of head/base changes.

A commit's run may hold part of the suite only, so each model size (steps) and each kernel panel comes
from the run that measured the most of it (variants, implementations, shapes), the newest of those by the
date of its records: a later run of a few cases does not hide a complete one. Legends and columns name
that commit.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from html import escape
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from models.variants import ABLATED, ABLATION, VARIANTS, ablation_note, reference
from optbench.core.compare import COLUMNS, compare, compared, resolve, rows, shown, verdict
from optbench.core.console import table
from optbench.core.records import Record
from optbench.core.store import DEVICE_CLOCK, MACHINE_KEY, REPO_ROOT, ResultStore, results_dir, write_text_atomic
from optbench.suite import catalog
from optbench.suite.catalog import ANCHOR_BENCHMARK

if TYPE_CHECKING:
    from optbench.core.hardware import HardwareProfile

ROOT = REPO_ROOT
GiB = 2**30
README_START, README_END = "<!-- headline:start -->", "<!-- headline:end -->"

PAGES: dict[str, tuple[str, str]] = {
    "speedup": ("Training-step speedup vs each variant's reference, and the ablation of best-kernels",
                "Wall clock, ms per optimizer step: reference median / optimization median, both from one run, "
                "each variant's reference named under its bars (eager for the best-* combinations); higher is "
                "better. Then per size, best-kernels with each switch left out in turn, from one run."),
    "memory": ("Peak memory per training step",
               "Peak device memory above the starting point during one optimizer step, GiB (a peak: no "
               "clock)."),
    "throughput": ("Tokens/s and MFU per size",
                   "Wall clock: tokens per step / median step seconds; MFU = FLOPs per step / median step "
                   "seconds / the hardware profile's peak TFLOPS for the step's precision (bf16 by "
                   "default); n/a for an emulated run."),
    "roofline": ("Kernel time over its roofline floor",
                 "Bars: cold-L2 device time (median ms per call, each call on inputs not in L2: graph replays "
                 "rotating over input sets larger than the L2) / max(FLOPs / peak, bytes / bandwidth) of the "
                 "hardware profile; 1× is the floor, lower is better. A cold time at or below 1× cannot come "
                 "from HBM: it is a measurement problem, marked ✗ at 1× and listed, not drawn as a bar. Dashes: "
                 "warm-L2 time (back-to-back calls on one input set), which may beat the floor where the data "
                 "fits in L2 (shapes marked 'fits L2'). n/a for an emulated run."),
    "history": ("Headline numbers over commits",
                "Speedup per commit, ordered by the date of the records: training steps vs each variant's "
                "reference (named in the legend) by wall clock, kernels vs eager by device time (geometric mean "
                "over shapes)."),
    "compare": ("Two commits side by side",
                "optbench.core.compare: each time's runs against its run-to-run noise, peak memory beyond the "
                "threshold; head/base of the changes beyond what each metric's noise lets the gate detect."),
}

PAGE = Template("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>$title</title>
<style>
body { font-family: sans-serif; max-width: 1500px; margin: 1em auto; padding: 0 1em; }
img { max-width: 100%; } .note { color: #555; }
table { border-collapse: collapse; font-size: small; } td, th { border: 1px solid #ccc; padding: 2px 6px; }
.REGRESSION { color: #b00; font-weight: bold; } .improvement { color: #070; }
</style>
<script>
// On load: body data-images-ok="1" when every image decoded, data-errors = count of script/resource errors.
let errors = 0;
addEventListener("error", () => { errors += 1; }, true);
addEventListener("load", () => {
  const images = Array.from(document.images);
  document.body.dataset.images = images.length;
  document.body.dataset.imagesOk = images.every((i) => i.complete && i.naturalWidth > 0) ? "1" : "0";
  document.body.dataset.errors = errors;
});
</script></head>
<body><p><a href="index.html">optbench report</a> · <a href="../index.html">asv benchmarks</a></p>
<h1>$title</h1>
$body
</body></html>
""")


@dataclass(frozen=True)
class Run:
    """The records of one machine at one commit."""

    machine: str
    commit: str
    records: dict[str, Record]

    @property
    def info(self) -> Mapping[str, Any]:
        return self.records[MACHINE_KEY].info if MACHINE_KEY in self.records else {}

    @property
    def date(self) -> str:
        return self.records[MACHINE_KEY].date if MACHINE_KEY in self.records else ""

    @property
    def emulated(self) -> bool:
        return bool(self.info.get("emulate"))

    @property
    def label(self) -> str:
        """Machine, GPU and '(emulated)' where the run emulated another profile."""
        gpu = self.info.get("gpu_name") or "CPU"
        return f"{self.machine} — {self.info['emulate']} on {gpu} (emulated)" if self.emulated else \
            f"{self.machine} — {gpu}"

    def profile(self) -> HardwareProfile | None:
        """Hardware profile of the run (the emulated one where emulating); None if unknown."""
        from optbench.core import hardware

        try:
            return hardware.lookup(self.info.get("emulate") or self.info.get("profile") or "cpu")
        except KeyError:
            return None


def runs(store: ResultStore) -> dict[str, list[Run]]:
    """Each machine's commits (the latest record of each case over the commit's runs), oldest first by the date
    of the commit's first run (a later rerun of an old commit does not make it the newest); real GPUs, then
    emulated, then CPUs."""
    found = {m: [Run(m, c, {k: Record.of(r) for k, r in store.load(m, c).items()}) for c in store.commits(m)]
             for m in store.machines()}
    return dict(sorted(((m, h) for m, h in found.items() if h),
                       key=lambda mh: (not mh[1][-1].info.get("gpu_name"), mh[1][-1].emulated, mh[0])))


def _size_order(size: str) -> float:
    m = re.fullmatch(r"([\d.]+)([MB])", size)
    return float(m[1]) * (1e6 if m[2] == "M" else 1e9) if m else 0.0


def _step_grid(run: Run, role: str) -> dict[str, dict[str, Record]]:
    """ok records of the step grids of ``role`` (``optbench.suite.catalog.Benchmark.role``) with a wall time, by
    size (smallest first), then variant."""
    found: dict[str, dict[str, Record]] = defaultdict(dict)
    for rec in run.records.values():
        entry = catalog.BENCHMARKS.get(rec.benchmark)
        if entry and entry.role == role and rec.ok and rec.timing("step", "wall"):
            found[entry.size][rec.params["variant"]] = rec
    return {size: found[size] for size in sorted(found, key=_size_order)}


def steps(run: Run) -> dict[str, dict[str, Record]]:
    """ok training-step records of the variant grids with a wall time by size ('tiny', '100M', ...), variant."""
    return _step_grid(run, "variants")


def ablations(run: Run) -> dict[str, dict[str, Record]]:
    """ok records of the leave-one-out ablation grids (bench_step.Ablation*) by size, then variant."""
    return _step_grid(run, "ablation")


def step_ms(rec: Record) -> float:
    """Median wall-clock ms per optimizer step."""
    return rec.timing("step", "wall").median_ms


def step_iqr_ms(rec: Record) -> float:
    """Interquartile range of the wall-clock ms per optimizer step within its run."""
    return rec.timing("step", "wall").iqr_ms


def step_reference(variant: str) -> str | None:
    """The variant a step variant is timed against (models.variants.reference); None where the variant is no
    longer defined (its reference unknown)."""
    return reference(variant) if variant == "eager" or variant in VARIANTS else None


def step_speedups(run: Run) -> dict[str, dict[str, float | None]]:
    """Speedup of each variant vs its own reference measured in the same run (reference median ms / variant
    median ms, wall clock) by size, then variant; None (n/a) where that reference was not measured there or is
    unknown, or measured in another run of the commit. Variants that are their own reference (eager, qknorm) have
    no entry."""
    found = {size: {v: step_ms(by_v[ref]) / step_ms(rec)
                    if (ref := step_reference(v)) in by_v and _run_of(by_v[ref]) == _run_of(rec) else None
                    for v, rec in by_v.items() if step_reference(v) != v}
             for size, by_v in steps(run).items()}
    return {size: speedups for size, speedups in found.items() if speedups}


def _vs(variant: str) -> str:
    """'<variant> vs <its reference>' ('vs ?' where the variant is no longer defined)."""
    return f"{variant} vs {step_reference(variant) or '?'}"


def ablation_rows(by_variant: dict[str, Record]) -> list[list[str]]:
    """One size's leave-one-out table (ABLATION_HEADER): best-kernels, best-kernels without each switch (and what
    needs it), eager; ms per step as median [IQR]; worth = ms without / ms of best-kernels (>1: the switch
    helps), n/a where either was not measured or they come from different runs."""
    best = by_variant.get(ABLATED)

    def row(variant: str, label: str) -> list[str]:
        rec = by_variant.get(variant)
        if rec is None:
            return [label, "not measured", "n/a"]
        same = best is not None and _run_of(best) == _run_of(rec)
        worth = "—" if variant == ABLATED else f"{step_ms(rec) / step_ms(best):.2f}×" if same else "n/a"
        return [label, f"{step_ms(rec):.1f} [{step_iqr_ms(rec):.1f}]", worth]

    return [row(ABLATED, f"{ABLATED} (every switch)"),
            *(row(v, ablation_note(v).removeprefix(f"{ABLATED} ")) for v in ABLATION),
            row("eager", "eager (no switch)")]


ABLATION_HEADER = ["step", "ms per step [IQR]", f"worth inside {ABLATED} (ms without / ms of {ABLATED})"]
ABLATION_CAPTION = (f"wall clock, median ms per optimizer step [IQR], every row from one run; worth: the step "
                    f"without the switch over {ABLATED}, >1× means the switch helps; eager's: all of them")


def step_peaks(run: Run) -> dict[str, dict[str, float]]:
    """Peak device memory of one training step, GiB, by size, then variant."""
    found = {size: {v: rec.peak_bytes("step") / GiB for v, rec in variants.items()
                    if rec.peak_bytes("step") is not None}
             for size, variants in steps(run).items()}
    return {size: peaks for size, peaks in found.items() if peaks}


def _dtype(rec: Record) -> str:
    """Peak key of a record: info['precision'] ('bf16', ...), info['dtype'] ('torch.bfloat16'), else bf16."""
    from optbench.core.hardware import DTYPES, dtype_name

    info = rec.info
    if info.get("precision") in DTYPES:
        return info["precision"]
    return dtype_name(info["dtype"]) if info.get("dtype") else "bf16"


def tokens_per_s(rec: Record) -> float | None:
    """Tokens per second of a training step (wall clock); None without info['tokens']."""
    tokens = rec.info.get("tokens")
    return tokens / (step_ms(rec) / 1e3) if tokens else None


EMULATED_PEAKS = ("n/a: this run emulated {target} on {gpu}; its times are that GPU's, so no {what} against "
                  "the {target}'s peaks.")


def peak_profile(run: Run) -> HardwareProfile | None:
    """The profile whose peaks the run's times may be divided by (MFU, roofline): the run's own; None for an
    emulated run, whose times are the real GPU's and whose profile is the emulated card's."""
    return None if run.emulated else run.profile()


def _emulated_note(run: Run, what: str) -> str:
    return note(EMULATED_PEAKS.format(target=run.info["emulate"], gpu=run.info.get("gpu_name") or "its GPU",
                                      what=what))


def mfu(rec: Record, profile: HardwareProfile | None) -> float | None:
    """Model FLOPs utilization of a step: flops['step'] / wall seconds / the profile's peak at its dtype."""
    peak = profile.peak_tflops.get(_dtype(rec)) if profile else None
    flops = rec.flops.get("step")
    return flops / (step_ms(rec) / 1e3) / (peak * 1e12) if peak and flops else None


def kernel_metric(rec: Record) -> str:
    """'fwdbwd' where the kernel has a backward, else 'fwd'."""
    return "fwdbwd" if "fwdbwd" in rec.metrics else "fwd"


def kernels(run: Run) -> dict[tuple[str, str], dict[str, Record]]:
    """ok kernel records with a device time measured with a cold L2 (``info.device_clock``; older records timed
    warm-L2 replays and, in full grids, a torch.compile baseline compiled for another shape), by (op, shape) and
    implementation."""
    found: dict[tuple[str, str], dict[str, Record]] = defaultdict(dict)
    for rec in run.records.values():
        if catalog.kind(rec.benchmark) == "kernel" and rec.ok and rec.info.get("device_clock") == DEVICE_CLOCK \
                and rec.timing(kernel_metric(rec), "device"):
            op = rec.benchmark.split(".", 1)[1]
            found[op, rec.params["shape"]][rec.params["impl"]] = rec
    return dict(found)


def _device_ms(rec: Record, metric: str) -> float:
    return rec.timing(metric, "device").median_ms


def kernel_speedups(run: Run) -> dict[str, dict[str, list[float]]]:
    """Per op and implementation, speedups vs the op's baseline (eager, or loop) over shapes (device time)."""
    found: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (op, _), impls in kernels(run).items():
        baseline = catalog.KERNELS[catalog.benchmark(next(iter(impls.values())).benchmark).op].impls[0]
        base = impls.get(baseline)
        for impl, rec in impls.items():
            if base is not None and rec is not base:
                metric = kernel_metric(rec)
                found[op][impl].append(_device_ms(base, metric) / _device_ms(rec, metric))
    return {op: dict(impls) for op, impls in found.items()}


@dataclass(frozen=True)
class FloorRatio:
    """One kernel case's device time / its roofline floor: with a cold L2 (clock ``device``) and a warm one
    (``device_warm``; None where not stored), and whether one input set fits in the L2 (None: not recorded)."""

    cold: float
    warm: float | None
    fits_l2: bool | None

    @property
    def suspect(self) -> bool:
        """A cold time at or below the floor: a measurement problem, not a speed."""
        from optbench.core.roofline import below_floor

        return below_floor(self.cold)


def floor_ratios(run: Run) -> dict[str, dict[str, dict[str, FloorRatio]]]:
    """Time / roofline floor by 'op metric', shape and implementation ({} without known ceilings, and for an
    emulated run: :func:`peak_profile`)."""
    from optbench.core.roofline import Ceilings, floor_ms

    profile = peak_profile(run)
    if profile is None:
        return {}
    ceilings = Ceilings.from_profile(profile)
    found: dict[str, dict[str, dict[str, FloorRatio]]] = defaultdict(lambda: defaultdict(dict))
    for (op, shape), impls in kernels(run).items():
        for impl, rec in impls.items():
            for metric in rec.metrics:
                flops, moved = rec.flops.get(metric), rec.bytes_moved.get(metric)
                if flops is None or moved is None or not rec.timing(metric, "device"):
                    continue
                floor = floor_ms(flops, moved, ceilings, _dtype(rec))
                if floor:
                    warm = rec.timing(metric, "device_warm")
                    found[f"{op} {metric}"][shape][impl] = FloorRatio(
                        _device_ms(rec, metric) / floor, warm.median_ms / floor if warm else None,
                        rec.info.get("fits_l2"))
    return {panel: dict(shapes) for panel, shapes in found.items()}


def _entries(value: dict) -> int:
    """Measured entries of a value: its items, or the items of its items (implementations x shapes)."""
    return sum(len(v) if isinstance(v, (dict, list)) else 1 for v in value.values())


def fullest(history: list[Run], extract: Callable[[Run], dict]) -> dict[str, tuple[Run, dict]]:
    """Each key that extract gives for some run (history is oldest first), with the run whose value for it
    has the most entries (:func:`_entries`), the newest of those, and that value."""
    found: dict[str, tuple[Run, dict]] = {}
    for run in history:
        for key, value in extract(run).items():
            if key not in found or _entries(value) >= _entries(found[key][1]):
                found[key] = (run, value)
    return found


def _at(key: str, run: Run) -> str:
    return f"{key} @ {run.commit[:8]}"


def _by_size(found: dict[str, tuple[Run, object]]) -> list[tuple[str, Run, object]]:
    return [(size, *found[size]) for size in sorted(found, key=_size_order)]


def _width(data: dict) -> float:
    """Inches for a bar panel with a group per key of data."""
    return max(7.5, 2.0 + 0.5 * len(data))


def _transpose(data: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for outer, inner in data.items():
        for key, value in inner.items():
            out[key][outer] = value
    return dict(out)


def _figure(title: str, n: int, ncols: int = 2, width: float = 7.5) -> tuple[Figure, list[Axes]]:
    """A figure of n panels, ``width`` inches each, ncols to a row."""
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(width * ncols, 4.2 * nrows + 0.6), layout="constrained")
    fig.suptitle(title)
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[n:]:
        fig.delaxes(ax)
    return fig, axes[:n]


def _bars(ax: Axes, data: dict[str, dict[str, float]], title: str, ylabel: str, ref: float | None = None,
          log: bool = False) -> None:
    """Grouped bars: a group per outer key of data, a bar (and legend entry) per inner key."""
    groups = list(data)
    series = list(dict.fromkeys(s for inner in data.values() for s in inner))
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [data[g].get(name, math.nan) for g in groups], width, label=name)
    ax.set_xticks(range(len(groups)), groups, rotation=25 if len(groups) > 3 else 0, ha="right")
    ax.set(title=title, ylabel=ylabel, yscale="log" if log else "linear")
    if ref is not None:
        ax.axhline(ref, color="black", linewidth=0.8, linestyle="--")
    ax.legend(fontsize="small")


def _lines(ax: Axes, commits: list[str], series: dict[str, list[float]], title: str, ylabel: str) -> None:
    """One line per series over commits (x: short hashes, oldest first)."""
    for name, ys in series.items():
        ax.plot(range(len(commits)), ys, marker="o", label=name)
    ax.set_xticks(range(len(commits)), [c[:8] for c in commits], rotation=25, ha="right")
    ax.set(title=title, ylabel=ylabel)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    # Many series (a step grid): a legend in columns below the plot, so it never hides the lines or title.
    many = len(series) > 6
    ax.legend(fontsize="x-small" if many else "small", ncol=3 if many else 1,
              **({"loc": "upper center", "bbox_to_anchor": (0.5, -0.25)} if many else {}))


def note(text: str) -> str:
    """An HTML paragraph saying why a chart is missing."""
    return f'<p class="note">{escape(text)}</p>'


Part = Figure | str  # a chart, or HTML


def _step_chart(history: list[Run], extract: Callable[[Run], dict], what: str, ylabel: str,
                ref: float | None = None) -> list[Part]:
    """A group of bars per optimization, a bar per size (from the run measuring the most of that size)."""
    found = _by_size(fullest(history, extract))
    if not found:
        return [note("No training-step results for this chart.")]
    data = _transpose({_at(size, run): value for size, run, value in found})
    fig, (ax,) = _figure(f"{history[-1].label}\n{what}; legend: size @ commit", 1, width=_width(data))
    _bars(ax, data, "", ylabel, ref=ref)
    return [fig]


def _named_speedups(run: Run) -> dict[str, dict[str, float]]:
    """step_speedups keyed '<variant> vs <reference>', NaN (no bar) for n/a."""
    return {size: {_vs(v): math.nan if x is None else x for v, x in speedups.items()}
            for size, speedups in step_speedups(run).items()}


def ablation_parts(history: list[Run]) -> list[Part]:
    """Per size, the leave-one-out table of best-kernels from the run that measured the most of it."""
    found = _by_size(fullest(history, ablations))
    if not found:
        return [note(f"No leave-one-out ablation of {ABLATED} (optbench run --suite ablation).")]
    return [f"<h3>Leave-one-out ablation of {escape(ABLATED)}</h3><p>{escape(ABLATION_CAPTION)}.</p>",
            *(f"<h4>{escape(_at(size, run))}</h4>" + table(ABLATION_HEADER, ablation_rows(by_v), "html")
              for size, run, by_v in found)]


def speedup_parts(history: list[Run]) -> list[Part]:
    chart = _step_chart(history, _named_speedups, "training-step speedup vs each variant's own reference "
                        "(named under its bars), measured in the same run — wall clock, ms per step (reference / "
                        "optimized); no bar: reference not measured in that run", "speedup vs its reference (×)",
                        ref=1.0)
    return [*chart, *ablation_parts(history)]


def _step_rows(found: list[tuple[str, Run, object]]) -> list[list[str]]:
    """The step table's rows, a column per (size, run) of found: variants that are their own reference (eager
    first), ms per step [IQR]; then each other variant vs its reference (named in its row): the speedup and its
    ms per step, 'n/a' where the reference was not measured in that run, '–' where the variant was not."""
    measured = [(steps(run).get(size, {}), step_speedups(run).get(size, {})) for size, run, _ in found]
    variants = sorted(dict.fromkeys(v for by_v, _ in measured for v in by_v),
                      key=lambda v: (v != "eager", step_reference(v) != v))

    def cell(variant: str, by_v: dict[str, Record], speedups: dict[str, float | None]) -> str:
        if variant not in by_v:
            return "–"
        rec = by_v[variant]
        if step_reference(variant) == variant:
            return f"{step_ms(rec):.1f} ms [{step_iqr_ms(rec):.1f}]"
        x = speedups[variant]
        return f"{'n/a' if x is None else f'{x:.2f}×'} ({step_ms(rec):.1f} ms)"

    return [[f"{v} (ms per step [IQR])" if step_reference(v) == v else _vs(v),
             *(cell(v, by_v, speedups) for by_v, speedups in measured)] for v in variants]


def _ablation_markdown(history: list[Run]) -> tuple[list[str], dict[str, str]]:
    """Markdown leave-one-out tables per size (:func:`ablation_rows`) and the {commit: date} they come from."""
    found = _by_size(fullest(history, ablations))
    parts = [f"Leave-one-out ablation of {ABLATED} at {size} @ `{run.commit[:8]}` ({ABLATION_CAPTION}):\n\n"
             + table(ABLATION_HEADER, ablation_rows(by_v), "markdown") for size, run, by_v in found]
    return parts, {run.commit: run.date for _, run, _ in found}


def memory_parts(history: list[Run]) -> list[Part]:
    return _step_chart(history, step_peaks, "peak device memory per training step — GiB (a peak, no clock)",
                       "peak memory (GiB)")


def throughput_parts(history: list[Run]) -> list[Part]:
    tokens: dict[str, dict[str, float]] = defaultdict(dict)
    util: dict[str, dict[str, float]] = defaultdict(dict)
    for size, run, variants in _by_size(fullest(history, steps)):
        for variant, rec in variants.items():
            if (t := tokens_per_s(rec)) is not None:
                tokens[variant][_at(size, run)] = t
            if (u := mfu(rec, peak_profile(run))) is not None:
                util[variant][_at(size, run)] = 100 * u
    if not tokens:
        return [note("No training-step results with tokens per step.")]
    profile = peak_profile(history[-1])
    peak = f"the {profile.key} profile's peak TFLOPS" if profile else "no peak (n/a)"
    fig, axes = _figure(f"{history[-1].label}\ntokens/s and MFU per optimization and size — wall clock; MFU "
                        f"vs {peak}; legend: size @ commit",
                        2 if util else 1, ncols=1, width=_width(tokens))
    _bars(axes[0], tokens, "tokens/s (wall clock)", "tokens/s", log=True)
    if util:
        _bars(axes[1], util, "MFU (wall clock)", "MFU (% of peak)")
    if util:
        return [fig]
    if history[-1].emulated:
        return [fig, _emulated_note(history[-1], "MFU")]
    return [fig, note("MFU: the hardware profile has no peak for this step's precision.")]


def _floor_panel(ax: Axes, shapes: dict[str, dict[str, FloorRatio]], title: str) -> None:
    """Bars of cold-L2 time / floor per shape and implementation; suspect ones as ✗ at 1× instead; warm-L2
    ratios as dashes; shapes whose input set fits in L2 say so."""
    groups = list(shapes)
    impls = list(dict.fromkeys(impl for by_impl in shapes.values() for impl in by_impl))
    width = 0.8 / len(impls)
    labelled: set[str] = set()
    for i, impl in enumerate(impls):
        xs = [g + (i - (len(impls) - 1) / 2) * width for g in range(len(groups))]
        cases = [shapes[g].get(impl) for g in groups]
        ax.bar(xs, [math.nan if r is None or r.suspect else r.cold for r in cases], width, label=impl)
        for x, r in zip(xs, cases):
            if r is not None and r.suspect:
                label = "cold ≤ floor: measurement problem"
                ax.plot(x, 1.0, "x", color="red", markersize=9, label=None if label in labelled else label)
                labelled.add(label)
            if r is not None and r.warm is not None:
                label = "warm L2"
                ax.plot(x, r.warm, "_", color="black", markersize=12, label=None if label in labelled else label)
                labelled.add(label)
    ticks = [f"{g}\nfits L2" if any(r.fits_l2 for r in shapes[g].values()) else g for g in groups]
    ax.set_xticks(range(len(groups)), ticks, rotation=25 if len(groups) > 3 else 0, ha="right")
    ax.set(title=title, ylabel="time / floor (×)", yscale="log")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.legend(fontsize="small")


def roofline_parts(history: list[Run]) -> list[Part]:
    if history[-1].emulated:
        return [_emulated_note(history[-1], "roofline fraction")]
    found = sorted(fullest(history, floor_ratios).items())
    if not found:
        return [note("No kernel results with a device time and known ceilings.")]
    fig, axes = _figure(f"{history[-1].label}\nkernel device time / roofline floor — × (median ms per call / "
                        "floor ms)\nbars: cold L2, dashes: warm L2; panels: op metric @ commit", len(found), ncols=3)
    for ax, (panel, (run, shapes)) in zip(axes, found):
        _floor_panel(ax, shapes, _at(panel, run))
    suspects = [[_at(panel, run), shape, impl, f"{r.cold:.2f}×", "yes" if r.fits_l2 else
                 "no" if r.fits_l2 is not None else "not recorded"]
                for panel, (run, shapes) in found for shape, by_impl in shapes.items()
                for impl, r in by_impl.items() if r.suspect]
    if not suspects:
        return [fig]
    return [fig, note(f"Measurement problems: {len(suspects)} cold-L2 device times at or below their roofline "
                      "floor (not drawn; ✗ in the chart). A time from HBM cannot beat the floor: the L2 was "
                      "warm or the byte count is wrong."),
            table(["op metric @ commit", "shape", "implementation", "cold time / floor", "input set fits L2"],
                  suspects, "html")]


def history_parts(history: list[Run]) -> list[Part]:
    commits = [run.commit for run in history]
    nan = [math.nan] * len(history)
    panels: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(nan.copy))
    for i, run in enumerate(history):
        for size, variants in step_speedups(run).items():
            for variant, value in variants.items():
                if value is not None:
                    panels[f"step {size} (wall clock)"][_vs(variant)][i] = value
        for op, impls in kernel_speedups(run).items():
            for impl, values in impls.items():
                panels[f"{op} (device time, geomean over shapes)"][impl][i] = \
                    statistics.geometric_mean(values)
    if not panels:
        return [note("No headline numbers in any commit.")]
    fig, axes = _figure(f"{history[-1].label}\nspeedup over commits (×) — steps: wall clock, vs each variant's "
                        "reference (legend); kernels: device time, vs eager", len(panels), ncols=3)
    for ax, (title, series) in zip(axes, sorted(panels.items(), key=lambda kv: not kv[0].startswith("step"))):
        _lines(ax, commits, series, title, "speedup (×)")
    return [fig]


def compare_parts(store: ResultStore, pair: tuple[str, str] | None, history: list[Run],
                  limit: int = 50) -> list[Part]:
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
    parts: list[Part] = [f"<p>{escape(base[:12])} → {escape(head[:12])}: {len(listed)} of "
                         f"{sum(map(compared, changes))} metrics with results at both commits changed "
                         "beyond what their noise lets the gate detect, or fail at head.</p>"]
    if listed:
        parts.append(table(COLUMNS, rows(listed), "html", marks=[verdict(c) for c in listed]))
    ratios = sorted((c for c in listed if c.ratio is not None and math.isfinite(c.ratio) and c.ratio > 0),
                    key=lambda c: -abs(math.log(c.ratio)))[:limit]
    if ratios:
        fig = Figure(figsize=(12, 1.5 + 0.28 * len(ratios)), layout="constrained")
        ax = fig.subplots()
        colors = {"REGRESSION": "tab:red", "improvement": "tab:green"}
        ax.barh([f"{' '.join(r[:3])} ({r[3] or 'memory'})" for r in rows(ratios)],
                [100 * (c.ratio - 1) for c in ratios],
                color=[colors.get(verdict(c), "tab:gray") for c in ratios])
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("head / base − 1 (%)")
        ax.tick_params(axis="y", labelsize="small")
        fig.suptitle(f"{history[-1].label}, {base[:8]} → {head[:8]}: significant changes, head/base − 1 "
                     "in %\n"
                     "times: median ms by the clock in brackets; memory: peak bytes")
        parts.append(fig)
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


def write_page(out: Path, name: str, found: dict[str, list[Run]],
               chart: Callable[[list[Run]], list[Part]]) -> None:
    """One page: its description, then per machine the parts chart() gives for its runs."""
    from optbench.core.hardware import slugify

    title, description = PAGES[name]
    body = [f"<p>{escape(description)}</p>"]
    body += [_section(h[-1], chart(h), out, f"{name}-{slugify(m)}") for m, h in found.items()]
    if not found:
        body.append(note("No optbench results."))
    page = PAGE.substitute(title=escape(title), body="\n".join(body))
    (out / f"{name}.html").write_text(page, encoding="utf-8")


def write_index(out: Path, found: dict[str, list[Run]]) -> None:
    links = "".join(f'<li><a href="{name}.html">{escape(title)}</a>: {escape(what)}</li>'
                    for name, (title, what) in PAGES.items())
    machines = table(["machine", "commits", "newest commit", "date"],
                     [[h[-1].label, len(h), h[-1].commit[:12], h[-1].date] for h in found.values()], "html")
    body = f'<ul>{links}<li><a href="../index.html">asv benchmarks</a></li></ul><h2>Machines</h2>{machines}'
    (out / "index.html").write_text(PAGE.substitute(title="optbench report", body=body), encoding="utf-8")


def asv_publish(results: Path, html: Path) -> None:
    """asv's site into html (asv empties it first); a printed note instead where asv has nothing to do."""
    from optbench.core.asv_atomic import asv

    if results.resolve() != (ROOT / "results").resolve():
        print(f"optbench report: asv publish skipped: asv reads asv.conf.json's results_dir, not {results}")
    elif not any(p.name != "machine.json" for p in results.glob("*/*.json")):
        print(f"optbench report: asv publish skipped: no asv results in {results}")
    elif asv(["publish", "--no-pull", "--html-dir", str(html.resolve())]) != 0:
        print("optbench report: asv publish failed (see above); writing optbench's pages anyway")


def publish(results: Path | str | None = None, html: Path | str | None = None,
            pair: tuple[str, str] | None = None) -> Path:
    """asv publish, then optbench's pages under ``<html>/optbench/``; returns their index.html.

    ``pair`` (BASE, HEAD) picks the commits of the compare page (default: each machine's two newest).
    """
    results = Path(results) if results is not None else results_dir()
    html = Path(html) if html is not None else ROOT / "html"
    asv_publish(results, html)
    out = html / "optbench"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    store = ResultStore(results)
    found = runs(store)
    charts = {"speedup": speedup_parts, "memory": memory_parts, "throughput": throughput_parts,
              "roofline": roofline_parts, "history": history_parts,
              "compare": partial(compare_parts, store, pair)}
    for name in PAGES:
        write_page(out, name, found, charts[name])
    write_index(out, found)
    return out / "index.html"


def anchor_steps(run: Run) -> dict[str, Record]:
    """ok HF anchor records (optbench.suite.anchors) with a wall time, by size."""
    return {rec.params["size"]: rec for rec in run.records.values()
            if rec.benchmark == ANCHOR_BENCHMARK and rec.ok and rec.timing("step", "wall")}


def _run_of(rec: Record) -> str:
    """The optbench run of a record: its run id, else (records from before run ids) its date."""
    return rec.run or rec.date


def hf_ratio(run: Run, size: str) -> tuple[float, str, str] | None:
    """(x HF, our variant, where) at ``size`` in ``run``: the HF anchor's median wall ms per step over that of our
    fastest variant; where: 'same run' where both records come from one optbench run, else 'another run, same
    day' or 'another run of the commit'. None where ``run`` has no anchor or none of our steps at ``size``."""
    anchor, ours = anchor_steps(run).get(size), steps(run).get(size, {})
    if anchor is None or not ours:
        return None
    variant = min(ours, key=lambda v: step_ms(ours[v]))
    rec = ours[variant]
    where = "same run" if _run_of(rec) == _run_of(anchor) else \
        "another run, same day" if rec.date[:10] == anchor.date[:10] else \
        "another run of the commit"
    return step_ms(anchor) / step_ms(rec), variant, where


def _x_hf_cell(ratio: tuple[float, str, str] | None) -> str:
    if ratio is None:
        return "n/a"
    x, variant, where = ratio
    return f"{x:.2f}× vs {variant}" + ("" if where == "same run" else f" ({where})")


def _hf_rows(found: list[tuple[str, Run, object]]) -> tuple[list[list[str]], str]:
    """The step table's HF rows (the anchor's ms per step, x HF) per column, and the note naming the HF setup;
    ([], '') where no column's run measured the anchor."""
    anchors = [anchor_steps(run).get(size) for size, run, _ in found]
    if not any(anchors):
        return [], ""
    ratios = [hf_ratio(run, size) for size, run, _ in found]
    hf = ["HF + torch.compile (ms per step [IQR])",
          *(f"{step_ms(a):.1f} ms [{step_iqr_ms(a):.1f}]" if a else "n/a" for a in anchors)]
    x_hf = ["× HF (HF ms / our fastest's ms)", *map(_x_hf_cell, ratios)]
    setups = dict.fromkeys(f"{a.info.get('setup')} (transformers {a.info.get('transformers')})"
                           for a in anchors if a)
    note = (f"× HF: the median wall-clock ms per step of `{ANCHOR_BENCHMARK}` ({'; '.join(setups)}) over that of "
            "our fastest variant at the size, named in the cell: both of the column's commit, from one run unless the "
            "cell says otherwise; n/a where the anchor was not measured at that commit.")
    return [hf, x_hf], note


def _headline(history: list[Run]) -> str:
    """Step and kernel tables of one machine, each size and kernel from the run measuring the most of it."""
    parts, used = [f"**{history[-1].label}**"], {}
    found = _by_size(fullest(history, steps))
    if found:
        body = _step_rows(found)
        hf_rows, hf_note = _hf_rows(found)
        parts += ["Training-step speedup of each variant vs its own reference, named in its row (the best-* "
                  "combinations vs eager), reference median / variant median from one run, and ms per optimizer "
                  "step (wall clock; n/a: the reference was not measured in that run; a host-bound eager step, as "
                  "at 100M, moves within and between runs, see its IQR: there compare the optimized steps' own "
                  "times):",
                  table(["optimization", *(f"{size} @ `{run.commit[:8]}`" for size, run, _ in found)],
                        body + hf_rows, "markdown"), *([hf_note] if hf_note else [])]
        used.update((run.commit, run.date) for _, run, _ in found)
    ablation, ablation_used = _ablation_markdown(history)
    parts += ablation
    used.update(ablation_used)
    ops = fullest(history, kernel_speedups)
    if ops:
        body = [[op, impl, f"{statistics.geometric_mean(v):.2f}×", f"{min(v):.2f}–{max(v):.2f}×",
                 str(len(v)), f"`{run.commit[:8]}`"]
                for op, (run, impls) in ops.items() for impl, v in impls.items()]
        parts += ["Kernel speedup vs eager (device time, forward+backward where the kernel has one; "
                  "geometric mean over shapes):",
                  table(["kernel", "implementation", "speedup", "range over shapes", "shapes", "commit"],
                        body, "markdown")]
        used.update((run.commit, run.date) for run, _ in ops.values())
    dated = sorted(used.items(), key=lambda commit_date: commit_date[1])
    parts.append("Measured at " + ", ".join(f"`{c[:12]}` ({d})" for c, d in dated) + ".")
    return "\n\n".join(parts)


def headline_table(store: ResultStore, machine: str | None = None) -> str:
    """Markdown headline of each real GPU machine (or of ``machine``), from its newest runs: step speedup vs
    eager per optimization and size (wall clock) with the HF anchor's step and x HF where measured
    (:func:`hf_ratio`), kernel speedups vs eager (device time)."""
    chosen = [h for m, h in runs(store).items()
              if (m == machine if machine else h[-1].info.get("gpu_name") and not h[-1].emulated)]
    if not chosen:
        return "_No GPU results yet._"
    return "\n\n".join(_headline(h) for h in chosen)


def update_readme(path: Path | str, store: ResultStore | None = None) -> None:
    """Replace the text between the headline markers of ``path`` with :func:`headline_table`."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    head, start, rest = text.partition(README_START)
    _, end, tail = rest.partition(README_END)
    if not start or not end:
        raise ValueError(f"{path} has no {README_START} ... {README_END} region")
    headline = headline_table(store or ResultStore())
    write_text_atomic(path, f"{head}{README_START}\n{headline}\n{README_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    """``optbench report``: asv's site and optbench's pages; --readme refreshes README.md's headline."""
    p = argparse.ArgumentParser(prog="optbench report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, help="results root (default $OPTBENCH_RESULTS or results/)")
    p.add_argument("--html", type=Path, help="HTML root (default html/); optbench's pages go to optbench/")
    p.add_argument("--compare", nargs=2, metavar=("BASE", "HEAD"), help="commits of the compare page")
    p.add_argument("--readme", action="store_true", help="rewrite the headline region of README.md")
    args = p.parse_args(argv)
    print(f"optbench report: {publish(args.results, args.html, args.compare)}")
    if args.readme:
        try:
            update_readme(ROOT / "README.md", ResultStore(args.results))
        except ValueError as exc:
            print(f"optbench report: {exc}")
            return 1
        print(f"optbench report: headline updated in {ROOT / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
