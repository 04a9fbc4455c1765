"""``optbench profile --diff A B``: every scalar figure of two reports side by side, and the
operators that appeared, disappeared or changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optbench.profiling.report import fmt, short, to_markdown
from optbench.run.console import console
from optbench.store.store import write_text_atomic

CHANGED = 0.20  # relative change of an operator's calls or time that --diff lists ...
NOISE = 0.01  # ... where a time change is also above this fraction of A's wall time
FIGURE_SECTIONS = ("time", "launches", "smells", "memory", "kernel_classes")


def load_report(path: str | Path) -> tuple[dict[str, Any], Path]:
    """(report, its folder) from a report folder or its report.json."""
    file = Path(path)
    file = file / "report.json" if file.is_dir() else file
    return json.loads(file.read_text(encoding="utf-8")), file.parent


def figures(report: dict[str, Any]) -> dict[str, float | None]:
    """Every scalar figure of a report's FIGURE_SECTIONS (numbers and nulls) by dotted key."""
    out: dict[str, float | None] = {}

    def walk(obj: Any, key: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{key}.{k}")
        elif obj is None or (isinstance(obj, (int, float)) and not isinstance(obj, bool)):
            out[key] = obj

    for section in FIGURE_SECTIONS:
        walk(report.get(section), section)  # kernel_classes: none in older reports
    return out


def figure_rows(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any, Any, Any]]:
    """(figure, A, B, B - A, B / A) of every scalar figure of either report."""
    fa, fb = figures(a), figures(b)
    rows = []
    for key in dict.fromkeys([*fa, *fb]):
        x, y = fa.get(key), fb.get(key)
        both = x is not None and y is not None
        rows.append((key, x, y, y - x if both else None, y / x if both and x else None))
    return rows


def op_changes(
    a: dict[str, Any], b: dict[str, Any]
) -> list[tuple[str, str, dict | None, dict | None]]:
    """(operator, 'appeared' | 'disappeared' | 'changed', A's row, B's row): operators of one side
    only, and those of either side's top lists whose calls, or whose time by more than NOISE of A's
    wall time, changed by more than CHANGED."""
    ra, rb = ({r["name"]: r for r in x["ops"]["all"]} for x in (a, b))
    tops = {
        r["name"] for x in (a, b) for key in ("top_host", "top_device") for r in x["ops"][key] or []
    }
    floor = NOISE * a["time"]["wall_ms"]

    def changed(x: dict, y: dict) -> bool:
        return abs(y["calls"] - x["calls"]) > CHANGED * x["calls"] or any(
            abs(y[k] - x[k]) > max(CHANGED * x[k], floor) for k in ("host_ms", "device_ms")
        )

    out = [
        (name, "disappeared" if name in ra else "appeared", ra.get(name), rb.get(name))
        for name in dict.fromkeys([*ra, *rb])
        if (name in ra) != (name in rb)
    ]
    out += [
        (name, "changed", ra[name], rb[name])
        for name in sorted(tops)
        if name in ra and name in rb and changed(ra[name], rb[name])
    ]
    return sorted(out, key=lambda c: -max(r["host_ms"] + r["device_ms"] for r in c[2:] if r))


def diff_markdown(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> str:
    """The diff of two reports as Markdown: every scalar figure, then the operators that changed."""
    rows = [
        [key, fmt(x, key), fmt(y, key), fmt(d, key), "—" if r is None else f"{r:.3f}×"]
        for key, x, y, d, r in figure_rows(a, b)
    ]
    cols = ("calls", "host_ms", "device_ms")
    ops = [
        [short(name), what, *(fmt(row[k]) if row else "—" for row in (ra, rb) for k in cols)]
        for name, what, ra, rb in op_changes(a, b)
    ]
    return to_markdown(
        [
            ("h", 1, f"Profile diff: A = {names[0]}, B = {names[1]}"),
            ("table", ["figure", "A", "B", "B − A", "B / A"], rows),
            (
                "h",
                2,
                f"Operators that appeared, disappeared or changed by more than {CHANGED:.0%} "
                f"(times: and by more than {NOISE:.0%} of A's wall time)",
            ),
            ("table", ["operator", "change", *(f"{side} {c}" for side in "AB" for c in cols)], ops),
        ]
    )


def run_diff(paths: list[str], out: str | None) -> int:
    """``--diff A B``: print the diff and write diff.md into ``out`` or B's folder."""
    from rich.markdown import Markdown

    (a, _), (b, folder) = load_report(paths[0]), load_report(paths[1])
    text = diff_markdown(a, b, (paths[0], paths[1]))
    target = (Path(out) if out else folder) / "diff.md"
    write_text_atomic(target, text)
    terminal = console()
    terminal.print(Markdown(text))
    terminal.print(f"written: {target}")
    return 0
