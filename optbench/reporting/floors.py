"""The headline's table of where the 1B best steps' time goes: each kernel class's device ms against
its floor, from the stored ``optbench profile`` reports that have floors
(``results/<machine>/profiles/<commit>-1B-<name>/report.json``; ``optbench.profiling.floors``
counts them).

A profile is of the step without its CUDA graph (``--options cuda_graph=false``): under the
profiler a graph replay's kernels run slower than the graph does unprofiled, and lose their
operators. The columns are the newest profiles (PER_NAME) of each name, grouped by name, oldest
first; ``optbench profile --diff`` compares any two.
"""

from __future__ import annotations

import json
from typing import Any

from optbench.store.store import ResultStore

SIZE = "1B"
PER_NAME = 1  # the newest profiles of each name shown (2: before and after a change)


def floor_reports(store: ResultStore, machine: str) -> list[dict[str, Any]]:
    """The machine's 1B profile reports with floors of steps without a CUDA graph: the newest
    PER_NAME of each name, grouped by name (the name first profiled first), oldest first."""
    found = []
    for path in sorted((store.root / machine / "profiles").glob(f"*-{SIZE}-*/report.json")):
        report = json.loads(path.read_text())
        classes = report.get("kernel_classes") or {}
        ungraphed = not report["meta"]["options"].get("cuda_graph")
        if classes.get("floors") and report["meta"]["size"] == SIZE and ungraphed:
            found.append(report)
    found.sort(key=lambda r: r["meta"]["date"])
    names = [r["meta"]["name"] for r in found]
    newest = [r for i, r in enumerate(found) if names[i + 1 :].count(r["meta"]["name"]) < PER_NAME]
    return sorted(newest, key=lambda r: (names.index(r["meta"]["name"]), r["meta"]["date"]))


def _by_class(classes: list[dict[str, Any]] | dict[str, dict[str, Any]]) -> dict[str, Any]:
    """class -> its figures, from a report's list of them (or a mapping, as the first reports with
    floors stored them)."""
    if isinstance(classes, dict):
        return classes
    return {c["class"]: c for c in classes}


def _cell(ms: float, floor: float | None) -> str:
    """'ms / floor (x floor)'; ms alone without a floor model; '0 / 0' for work the step lacks."""
    if floor is None:
        return f"{ms:.2f}"
    return f"{ms:.2f} / {floor:.2f} ({ms / floor:.2f}×)" if floor else f"{ms:.2f} / 0"


def floor_markdown(reports: list[dict[str, Any]]) -> tuple[str, list[str], list[list[str]]]:
    """(caption, header, rows) of the table: a row per kernel class that took time in any report,
    the most time in any first, then the classes with a floor together, the device's busy
    ms and the wall ms per step."""
    header = [
        "class",
        *(
            f"{r['meta']['name']} @ `{r['meta']['commit'][:8]}`" + (" †" if spilled(r) else "")
            for r in reports
        ),
    ]
    classes = [_by_class(r["kernel_classes"]["floors"]["classes"]) for r in reports]
    kinds = sorted(
        (k for k in classes[-1] if any(c[k]["ms"] for c in classes)),
        key=lambda k: -max(c[k]["ms"] for c in classes),
    )
    rows = [[k, *(_cell(c[k]["ms"], c[k]["floor_ms"]) for c in classes)] for k in kinds]
    floors = [r["kernel_classes"]["floors"] for r in reports]
    rows += [
        ["classes with a floor", *(_cell(f["floored_ms"], f["floor_ms"]) for f in floors)],
        ["device busy", *(f"{r['time']['device_busy_ms']:.2f}" for r in reports)],
        ["wall per step", *(f"{r['time']['wall_ms']:.2f}" for r in reports)],
    ]
    ceilings = "; ".join(
        f"`{r['meta']['commit'][:8]}` on GPU {_gpu(r)}: "
        + ", ".join(_ceiling(r["kernel_classes"]["floors"]["ceilings"]))
        for r in reports
    )
    caption = (
        f"Where the {SIZE} best steps' time goes (`optbench profile --size {SIZE} --variant V "
        "--options cuda_graph=false`, the step without its CUDA graph): device ms per step of each "
        "kernel class / its floor (the fewest FLOPs and bytes of the class's work at the GPU's "
        "measured ceilings, `optbench.profiling.floors`) and time over floor; a class without a "
        "floor model shows its ms alone. Device busy: the union of the device's activity; wall: "
        "the ungraphed step's, host-bound where it launches thousands of kernels (FP8's casts): "
        "the graphed step's time is the tables' above. A GEMM on data that toggles fewer bits "
        "than the probes' random operands draws less power and can run a few % under its floor "
        "(a product of zeros ran 13% faster than of random data on an H200: the device's "
        f"KINDS.md). Ceilings, measured in the profile's run: {ceilings}."
    )
    if marked := [r for r in reports if spilled(r)]:
        caption += (
            " †: the profile's window also held kernels launched before it, the warm-up step's "
            "still queued when it opened ("
            + ", ".join(f"{spilled(r):.1f} a step" for r in marked)
            + "): its classes and device busy count their time too (optbench profile now "
            "synchronizes the device before its window opens)."
        )
    return caption, header, rows


def spilled(report: dict[str, Any]) -> float:
    """Kernels a step that a profile of an ungraphed step recorded beyond those it launched in its
    window: launched before the window opened and run in it (0 where none, or the step graphed,
    where one launch runs a whole graph)."""
    launches = report.get("launches") or {}
    if report["meta"]["options"].get("cuda_graph") or "per_step" not in launches:
        return 0.0
    return max(0.0, launches["kernels_per_step"] - launches["per_step"])


def _gpu(report: dict[str, Any]) -> str:
    """The first 8 hex digits of the profiled GPU's UUID, as NOTES.md names GPUs."""
    return report["meta"]["machine_info"].get("gpu_uuid", "GPU-?").removeprefix("GPU-")[:8]


def _ceiling(c: dict[str, Any]) -> list[str]:
    out = [f"bf16 {c['bf16_tflops']:.0f} TFLOP/s", f"copy {c['bandwidth_gbps']:.0f} GB/s"]
    return out + ([f"FP8 {c['fp8_tflops']:.0f} TFLOP/s"] if c.get("fp8_tflops") else [])
