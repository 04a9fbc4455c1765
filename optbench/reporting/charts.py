"""The report's matplotlib figures, drawn from :mod:`optbench.reporting.data` (figures only: no
files, no HTML).

Every function returns a :class:`matplotlib.figure.Figure` (no pyplot state) whose title names the
machine. A page asks for a :class:`Chart`, a figure not yet drawn: what it is drawn from is all it
depends on, so the site draws it only where no figure of the same inputs is kept
(:mod:`optbench.reporting.cache`); matplotlib is imported by the first figure drawn.
"""

from __future__ import annotations

import io
import math
import statistics
import textwrap
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from optbench.gate.compare import Change, verdict
from optbench.reporting.data import FloorRatio, TimeHistory

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# other verdicts (not gated): gray
VERDICT_COLORS = {"REGRESSION": "tab:red", "improvement": "tab:green"}
CHANGE_POINT_COLOR = "tab:purple"
DPI = 80  # of the PNGs
MAX_COMMIT_LABELS = 16  # under a history panel (3.8 inches)


@dataclass(frozen=True)
class Chart:
    """A figure to draw: ``draw(*args)``, a function of this module and plain data."""

    draw: Callable[..., Figure]
    args: tuple

    def figure(self) -> Figure:
        return self.draw(*self.args)

    def png(self) -> bytes:
        """The figure as a PNG at :data:`DPI` (the same inputs give the same bytes)."""
        out = io.BytesIO()
        self.figure().savefig(out, format="png", dpi=DPI)
        return out.getvalue()


def _figure(
    title: str, n: int, ncols: int = 2, width: float = 7.5, height: float = 4.2
) -> tuple[Figure, list[Axes]]:
    """A figure of n panels of ``width`` x ``height`` inches, ncols to a row."""
    from matplotlib.figure import Figure

    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    title = _wrapped(title, width * ncols)
    extra = 0.25 * title.count("\n")  # inches for the title's lines beyond one
    fig = Figure(figsize=(width * ncols, height * nrows + 0.6 + extra), layout="constrained")
    fig.suptitle(title)
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[n:]:
        fig.delaxes(ax)
    return fig, axes[:n]


def _wrapped(title: str, inches: float) -> str:
    """``title`` broken into lines that fit a figure ``inches`` wide (a suptitle is not wrapped by
    matplotlib: a long one ran off both edges of the PNG)."""
    chars = max(40, int(inches * DPI / 7.5))  # the suptitle's characters average ~7.5 px here
    return "\n".join(textwrap.fill(line, chars) for line in title.split("\n"))


def _bar_width(data: dict) -> float:
    """Inches for a bar panel with a group per key of data."""
    return max(7.5, 2.0 + 0.5 * len(data))


def _transpose(data: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for outer, inner in data.items():
        for key, value in inner.items():
            out[key][outer] = value
    return dict(out)


def _bars(
    ax: Axes,
    data: dict[str, dict[str, float]],
    title: str,
    ylabel: str,
    ref: float | None = None,
) -> None:
    """Grouped bars: a group per outer key of data, a bar (and legend entry) per inner key; NaN
    draws no bar."""
    groups = list(data)
    series = list(dict.fromkeys(s for inner in data.values() for s in inner))
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [data[g].get(name, math.nan) for g in groups], width, label=name)
    ax.set_xticks(range(len(groups)), groups, rotation=25 if len(groups) > 3 else 0, ha="right")
    ax.set(title=title, ylabel=ylabel)
    if ref is not None:
        ax.axhline(ref, color="black", linewidth=0.8, linestyle="--")
    ax.legend(fontsize="small")


def step_bars(
    title: str, by_column: dict[str, dict[str, float]], ylabel: str, ref: float | None = None
) -> Figure:
    """A group of bars per optimization (the inner keys of ``by_column``), a bar per column ('size @
    commit')."""
    data = _transpose(by_column)
    fig, (ax,) = _figure(title, 1, width=_bar_width(data))
    _bars(ax, data, "", ylabel, ref=ref)
    return fig


def throughput(
    title: str, tokens: dict[str, dict[str, float]], util: dict[str, dict[str, float]]
) -> Figure:
    """Tokens/s and, where any, MFU in % per optimization, a bar per 'size @ commit', both on linear
    axes from 0, so that a bar's height is its value's share (a log axis starts at no zero: there
    the height of a bar says little of its value)."""
    fig, axes = _figure(title, 2 if util else 1, ncols=1, width=_bar_width(tokens))
    _bars(axes[0], tokens, "tokens/s (wall clock)", "tokens/s")
    if util:
        _bars(axes[1], util, "MFU (wall clock)", "MFU (% of peak)")
    return fig


def _floor_panel(ax: Axes, shapes: dict[str, dict[str, FloorRatio]], title: str) -> None:
    """Bars of cold-L2 time / floor per shape and implementation; suspect ones as ✗ at 1× instead;
    warm-L2 ratios as dashes; shapes whose input set fits in L2 say so."""
    groups = list(shapes)
    impls = list(dict.fromkeys(impl for by_impl in shapes.values() for impl in by_impl))
    width = 0.8 / len(impls)
    labelled: set[str] = set()
    for i, impl in enumerate(impls):
        xs = [g + (i - (len(impls) - 1) / 2) * width for g in range(len(groups))]
        cases = [shapes[g].get(impl) for g in groups]
        ax.bar(
            xs, [math.nan if r is None or r.suspect else r.cold for r in cases], width, label=impl
        )
        for x, r in zip(xs, cases):
            if r is not None and r.suspect:
                label = "cold ≤ floor: measurement problem"
                ax.plot(
                    x,
                    1.0,
                    "x",
                    color="red",
                    markersize=9,
                    label=None if label in labelled else label,
                )
                labelled.add(label)
            if r is not None and r.warm is not None:
                label = "warm L2"
                ax.plot(
                    x,
                    r.warm,
                    "_",
                    color="black",
                    markersize=12,
                    label=None if label in labelled else label,
                )
                labelled.add(label)
    ticks = [f"{g}\nfits L2" if any(r.fits_l2 for r in shapes[g].values()) else g for g in groups]
    ax.set_xticks(range(len(groups)), ticks, rotation=25 if len(groups) > 3 else 0, ha="right")
    ax.set(title=title, ylabel="time / floor (×)", yscale="log")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.legend(fontsize="small")


def roofline(title: str, panels: Sequence[tuple[str, dict[str, dict[str, FloorRatio]]]]) -> Figure:
    """A :func:`_floor_panel` per (panel title, ratios by shape and implementation), three to a
    row."""
    fig, axes = _figure(title, len(panels), ncols=3)
    for ax, (name, shapes) in zip(axes, panels):
        _floor_panel(ax, shapes, name)
    return fig


def changes(title: str, labels: Sequence[str], found: Sequence[Change]) -> Figure:
    """Horizontal bars of head/base − 1 in % of each change (finite, positive ratios), colored by
    its verdict."""
    from matplotlib.figure import Figure

    title = _wrapped(title, 12)
    height = 1.5 + 0.28 * len(found) + 0.25 * title.count("\n")
    fig = Figure(figsize=(12, height), layout="constrained")
    ax = fig.subplots()
    ax.barh(
        labels,
        [100 * (c.ratio - 1) for c in found],
        color=[VERDICT_COLORS.get(verdict(c), "tab:gray") for c in found],
    )
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("head / base − 1 (%)")
    ax.tick_params(axis="y", labelsize="small")
    fig.suptitle(title)
    return fig


def history_grid(
    title: str, series: Sequence[TimeHistory], commits: Sequence[str], ncols: int = 4
) -> Figure:
    """Small multiples, one panel per series, over ``commits`` (x, oldest first; each series'
    commits among them; at most :data:`MAX_COMMIT_LABELS` of them named, evenly spaced, under the
    lowest panel of each column): each run's median ms as a
    point with its samples' IQR as an error bar, a line through each commit's geometric mean of run
    medians, a band at each commit with a verdict
    (red: regression, green: improvement, gray: not gated) labelled with head/base − 1, and a
    hatched purple band over the commit range of each change point (its last commit before to its
    first after) labelled with after/before − 1 at the bottom."""
    fig, axes = _figure(title, len(series), ncols=ncols, width=3.8, height=2.2)
    x = {commit: i for i, commit in enumerate(commits)}
    for ax, s in zip(axes, series):
        xs, ys, low, high = [], [], [], []
        for point in s.commits:
            n = len(point.runs)
            for j, run in enumerate(point.runs):
                xs.append(x[point.commit] + (0.0 if n == 1 else 0.3 * (j / (n - 1) - 0.5)))
                ys.append(run.median_ms)
                low.append(run.median_ms - run.q25_ms)
                high.append(run.q75_ms - run.median_ms)
        ax.errorbar(
            xs, ys, yerr=[low, high], fmt="o", markersize=3, elinewidth=0.8, color="tab:blue"
        )
        ax.plot(
            [x[p.commit] for p in s.commits],
            [statistics.geometric_mean(r.median_ms for r in p.runs) for p in s.commits],
            color="tab:blue",
            linewidth=0.8,
            alpha=0.6,
        )
        for point in s.flagged:
            i = x[point.commit]
            ax.axvspan(
                i - 0.4,
                i + 0.4,
                color=VERDICT_COLORS.get(point.verdict, "tab:gray"),
                alpha=0.2,
                linewidth=0,
            )
            if point.ratio is not None:
                ax.annotate(
                    f"{point.ratio - 1:+.0%}",
                    (i, 1.0),
                    xycoords=("data", "axes fraction"),
                    ha="center",
                    va="top",
                    fontsize="x-small",
                    color=VERDICT_COLORS.get(point.verdict, "tab:gray"),
                )
        for cp in s.change_points:
            start, end = x[cp.before], x[cp.after]
            ax.axvspan(
                start,
                end,
                facecolor="none",
                edgecolor=CHANGE_POINT_COLOR,
                hatch="//",
                alpha=0.5,
                linewidth=0,
            )
            ax.annotate(
                f"{cp.ratio - 1:+.0%}",
                ((start + end) / 2, 0.0),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize="x-small",
                color=CHANGE_POINT_COLOR,
            )
        ax.set_title(s.label, fontsize="small")
        ax.set_ylabel(f"ms ({s.clock})", fontsize="small")
        ax.tick_params(axis="y", labelsize="x-small")
        ax.set_xlim(-0.5, len(commits) - 0.5)
        ax.set_xticks([])
    every = math.ceil(len(commits) / MAX_COMMIT_LABELS)
    for ax in axes[-ncols:]:  # the lowest panel of each column names the commits
        ax.set_xticks(
            range(0, len(commits), every),
            [c[:7] for c in commits[::every]],
            rotation=90,
            fontsize="x-small",
        )
    return fig


def time_against_memory(
    title: str,
    panels: Sequence[tuple[str, str, Sequence[tuple[str, float, float]]]],
    marked: Sequence[str],
) -> Figure:
    """A panel per (title, x label, points): each point a step, (name, GB, ms per step); the
    ``marked`` steps in colour, named in the figure's legend under the panels, the others gray."""
    fig, axes = _figure(title, len(panels), ncols=min(3, len(panels)), width=5.5, height=4.2)
    colors = {name: f"C{i}" for i, name in enumerate(marked)}
    for ax, (name, xlabel, points) in zip(axes, panels):
        others = [(gb, ms) for step, gb, ms in points if step not in colors]
        if others:
            ax.plot(*zip(*others), "o", color="tab:gray", markersize=4, label="other steps")
        for step, gb, ms in points:
            if step in colors:
                ax.plot(gb, ms, "o", color=colors[step], markersize=7, label=step)
        ax.set(title=name, xlabel=xlabel, ylabel="ms per step (wall clock)")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncols=len(handles))
    return fig
