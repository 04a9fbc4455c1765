"""The report's charts: the time split and the memory timeline, as PNG files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from optbench.profiling.timeline import MemoryCurve, Timeline

COLORS = {
    "forward": "tab:blue",
    "backward": "tab:orange",
    "optimizer": "tab:green",
    "data_movement": "tab:red",
    "other": "tab:gray",
    "unattributed": "tab:purple",
    "idle": "whitesmoke",
}


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_time_split(time: dict[str, Any], path: Path) -> None:
    """Stacked bars of the host's (and the device's) ms per step by phase, against the wall time."""
    plt = pyplot()
    bars = {"host": time["host_ms"]}
    if time["device_ms"] is not None:
        bars["device"] = {
            **time["device_ms"],
            "idle": max(time["wall_ms"] - time["device_busy_ms"], 0.0),
        }
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.5 * len(bars)))
    labelled: set[str] = set()
    for row, parts in bars.items():
        lefts = np.cumsum([0.0, *parts.values()])[:-1]
        for (phase, ms), left in zip(parts.items(), lefts):
            ax.barh(
                row,
                ms,
                left=left,
                color=COLORS[phase],
                edgecolor="white",
                label=None if phase in labelled else phase.replace("_", " "),
            )
            labelled.add(phase)
    ax.axvline(time["wall_ms"], color="black", linestyle="--", linewidth=1, label="wall")
    ax.set_xlabel("ms per step")
    ax.invert_yaxis()
    fig.legend(ncol=8, fontsize=8, loc="lower center", frameon=False)
    fig.subplots_adjust(bottom=0.45 if len(bars) == 1 else 0.35)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_memory(curve: MemoryCurve, line: Timeline, path: Path) -> None:
    """Allocated MiB over the profiled steps, their phases shaded."""
    plt = pyplot()
    from matplotlib.patches import Patch

    t0, t1 = line.ranges[0][0], line.ranges[-1][1]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for s0, s1, phase in line.segments:
        ax.axvspan((s0 - t0) / 1e3, (s1 - t0) / 1e3, color=COLORS[phase], alpha=0.15, linewidth=0)
    keep = (curve.times >= t0) & (curve.times <= t1)
    times = np.concatenate([[t0], curve.times[keep], [t1]])
    levels = np.concatenate([[curve.at(t0)], curve.levels[keep], [curve.at(t1)]])
    ax.step((times - t0) / 1e3, levels / 2**20, where="post", color="black", linewidth=1)
    ax.set_xlabel("ms since the first profiled step")
    ax.set_ylabel("allocated MiB")
    phases = dict.fromkeys(phase for *_, phase in line.segments)
    ax.legend(
        handles=[Patch(color=COLORS[p], alpha=0.3, label=p) for p in phases],
        fontsize=8,
        loc="upper right",
    )
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
