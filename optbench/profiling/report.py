"""Rendering a report: its figures as blocks (headings, paragraphs, tables, images), Markdown and
HTML of them, and every file of a report written into its folder."""

from __future__ import annotations

import contextlib
import html
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from models.step import TrainStep
from optbench.profiling.breakdown import SMALL_KERNEL_US
from optbench.profiling.capture import SNAPSHOT, Capture, dump_memory_snapshot
from optbench.profiling.charts import plot_memory, plot_time_split
from optbench.profiling.kernel_classes import TOP_PER_CLASS
from optbench.profiling.timeline import PHASES, Parsed
from optbench.run.console import table
from optbench.store.store import write_json_atomic, write_text_atomic

Block = tuple  # ("h", level, text) | ("p", text) | ("table", headers, rows) | ("img", alt, file)


def fmt(value: Any, key: str = "") -> str:
    """A figure for a table: bytes in MiB, fractions in %, other numbers to 4 significant digits."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if key.endswith(("bytes", "bytes_estimate")):
        return f"{value / 2**20:,.1f} MiB"
    if key.endswith(("fraction", "share", "mfu")):
        return f"{100 * value:.1f}%"
    return f"{value:,.4g}"


def short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def op_rows(rows: list[dict[str, Any]] | None, key: str) -> list[list[str]]:
    """Table rows (name, calls, ``key`` ms, share) of a top list."""
    return [
        [short(r["name"]), fmt(r["calls"]), fmt(r[key]), fmt(r["share"], "share")]
        for r in rows or []
    ]


def smell_rows(r: dict[str, Any]) -> list[list[str]]:
    """Table rows of the launches and smells."""
    launches, s = r["launches"], r["smells"]
    return [
        [launches["what"], fmt(launches["per_step"])],
        ["device kernels", fmt(launches["kernels_per_step"])],
        [f"median {launches['median_of']} (us)", fmt(launches["median_us"])],
        *[[f"{op} calls", fmt(v)] for op, v in s["copy_calls"].items()],
        ["host syncs", fmt(s["host_syncs"])],
        *[[f"host syncs from {k}", fmt(v)] for k, v in s["host_syncs_by_op"].items()],
        *[[f"host syncs in {k}", fmt(v)] for k, v in s["host_syncs_by_phase"].items()],
        [f"small kernels (< {SMALL_KERNEL_US:g} us)", fmt(s["small_kernels"])],
        ["small kernel fraction", fmt(s["small_kernel_fraction"], "fraction")],
        ["parameter tensors", fmt(s["loops"]["param_tensors"])],
        *[[f"{op} calls", fmt(v)] for op, v in s["loops"]["norm_ops"].items()],
        ["aten::_foreach_* calls", fmt(s["loops"]["foreach_calls"])],
    ]


def class_blocks(kc: dict[str, Any]) -> list[Block]:
    """The kernel classes' section: ms per class, the GEMMs' TFLOP/s, each class's top kernels and
    the rules."""
    total, matmul = kc["total_ms"], kc["matmul"]
    classes = [
        [kind, fmt(kc["kernels"][kind]), fmt(ms), fmt(ms / total if total else None, "share")]
        for kind, ms in kc["ms"].items()
    ]
    tops = [
        [kind, short(t["name"]), fmt(t["calls"]), fmt(t["ms"]), str(t["rule"])]
        for kind, rows in kc["top"].items()
        for t in rows
    ]
    rules = [
        [
            str(r["rule"]),
            r["evidence"],
            r["pattern"] or "(any)",
            r["class"],
            fmt(r["kernels"]),
            fmt(r["ms"]),
        ]
        for r in kc["rules"]
    ]
    return [
        ("h", 2, "Device time by kernel class (per step)"),
        (
            "p",
            "Each kernel goes to one class by the first rule that matches (table below): its "
            "launching operator, an operator enclosing it, else its name. gemm_fp8: FP8 GEMMs; "
            "gemm: other matmuls; fp8_cast: FP8 amax, scales and casts; attention; norm; "
            "elementwise (SwiGLU, RoPE, residual adds, inductor's pointwise kernels); "
            "cross_entropy; optimizer (AdamW and the gradient statistics); communication; "
            "other: the rest, memcpys and memsets.",
        ),
        (
            "table",
            ["class", "kernels", "device ms", "share"],
            [*classes, ["total", "", fmt(total), ""]],
        ),
        ("table", ["figure", "value"], [[k, fmt(v, k)] for k, v in matmul.items()]),
        *[("p", note) for note in kc["notes"]],
        *floor_blocks(kc.get("floors")),
        (
            "table",
            ["class", f"top kernels (up to {TOP_PER_CLASS})", "calls", "device ms", "rule"],
            tops,
        ),
        (
            "table",
            ["rule", "evidence", "pattern (re.IGNORECASE)", "class", "kernels", "device ms"],
            rules,
        ),
    ]


def floor_rows(floors: dict[str, Any]) -> list[list[str]]:
    """One row per kernel class: device ms, floor ms, ms over the floor and time / floor ('—'
    where the class has no floor); then the total over the classes with one."""
    rows = [
        [
            c["class"],
            fmt(c["ms"]),
            fmt(c["floor_ms"]),
            fmt(c["over_ms"]),
            fmt(_times(c["ms"], c["floor_ms"])),
        ]
        for c in floors["classes"]
    ]
    total, floor = floors["floored_ms"], floors["floor_ms"]
    return [
        *rows,
        ["with a floor", fmt(total), fmt(floor), fmt(total - floor), fmt(_times(total, floor))],
    ]


def _times(ms: float, floor: float | None) -> float | None:
    return ms / floor if floor else None


def floor_blocks(floors: dict[str, Any] | None) -> list[Block]:
    """Each kernel class against its floor (:mod:`optbench.profiling.floors`), where the report
    has the device's ceilings."""
    if not floors:
        return []
    c = floors["ceilings"]
    fp8 = f", FP8 {fmt(c['fp8_tflops'])} TFLOP/s" if c["fp8_tflops"] else ""
    return [
        ("h", 3, "Each class against its floor"),
        (
            "p",
            "Floor: the fewest FLOPs and bytes of the class's work in one step at this device's "
            f"measured ceilings (bf16 matmul {fmt(c['bf16_tflops'])} TFLOP/s{fp8}, copy "
            f"{fmt(c['bandwidth_gbps'])} GB/s); optbench.profiling.floors counts them. A time "
            "under its floor is a measurement problem until explained.",
        ),
        (
            "table",
            ["class", "device ms", "floor ms", "ms over floor", "x floor"],
            floor_rows(floors),
        ),
    ]


def report_blocks(r: dict[str, Any]) -> list[Block]:
    """The report as blocks, rendered to Markdown and HTML alike."""
    m, t = r["meta"], r["time"]
    host, dev = t["host_ms"], t["device_ms"] or {}
    options = ", ".join(f"{k}={v}" for k, v in m["options"].items())
    blocks: list[Block] = [
        ("h", 1, f"Profile: {m['size']} {m['name']} @ {m['commit'][:12]} on {m['machine']}"),
        (
            "p",
            f"{m['device']}, torch {m['torch']}, {m['profiled_steps']} profiled steps after "
            f"{m['warmup']} warm-up steps, {m['date']}. Options: {options}.",
        ),
        ("h", 2, "Time per step"),
        (
            "table",
            ["phase", "host ms", "% of wall", "device ms"],
            [
                [
                    p,
                    fmt(host.get(p)),
                    fmt(host[p] / t["wall_ms"] if p in host else None, "fraction"),
                    fmt(dev.get(p)),
                ]
                for p in (*PHASES, *(["unattributed"] if dev else []))
            ],
        ),
        (
            "table",
            ["figure", "value"],
            [
                [k, fmt(t[k], k)]
                for k in ("wall_ms", "device_busy_ms", "gpu_busy_fraction", "tokens_per_s", "mfu")
            ],
        ),
        ("img", "time split", "time_split.png"),
        ("h", 2, "Launches and smells (per step)"),
        ("table", ["figure", "value"], smell_rows(r)),
        ("h", 2, "Top operators by host time (self)"),
        (
            "table",
            ["operator", "calls", "host ms", "share"],
            op_rows(r["ops"]["top_host"], "host_ms"),
        ),
    ]
    if r["ops"]["top_device"] is not None:
        blocks += [
            ("h", 2, "Top operators by device time (self: the kernels each launched)"),
            (
                "table",
                ["operator", "calls", "device ms", "share"],
                op_rows(r["ops"]["top_device"], "device_ms"),
            ),
            ("h", 2, "Top kernels by device time"),
            (
                "table",
                ["kernel", "calls", "device ms", "share"],
                op_rows(r["ops"]["top_kernels"], "device_ms"),
            ),
        ]
    if r.get("kernel_classes"):
        blocks += class_blocks(r["kernel_classes"])
    return [
        *blocks,
        ("h", 2, "Memory"),
        ("table", ["figure", "value"], [[k, fmt(v, k)] for k, v in r["memory"].items()]),
        ("img", "memory timeline", "memory_timeline.png"),
        ("h", 2, "Notes"),
        *[("p", note) for note in r["notes"]],
    ]


def to_markdown(blocks: list[Block]) -> str:
    out = []
    for kind, *rest in blocks:
        if kind == "h":
            out.append(f"{'#' * rest[0]} {rest[1]}")
        elif kind == "p":
            out.append(rest[0])
        elif kind == "img":
            out.append(f"![{rest[0]}]({rest[1]})")
        else:
            out.append(table(*rest, "markdown"))
    return "\n\n".join(out) + "\n"


def to_html(blocks: list[Block]) -> str:
    esc, out = html.escape, []
    for kind, *rest in blocks:
        if kind == "h":
            out.append(f"<h{rest[0]}>{esc(rest[1])}</h{rest[0]}>")
        elif kind == "p":
            out.append(f"<p>{esc(rest[0])}</p>")
        elif kind == "img":
            out.append(f'<p><img src="{esc(rest[1])}" alt="{esc(rest[0])}"></p>')
        else:
            out.append(table(*rest, "html"))
    title = esc(next(b[2] for b in blocks if b[0] == "h"))
    style = (
        "body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse;"
        "margin:1em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}"
    )
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f"<title>{title}</title><style>{style}</style>"
        "</head><body>\n" + "\n".join(out) + "\n</body></html>\n"
    )


@contextlib.contextmanager
def staging(final: Path) -> Iterator[Path]:
    """A temporary folder beside ``final``, renamed to it (replacing an older one) when the block
    succeeds; removed when it fails."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        tmp.chmod(0o755)
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_report(
    step: TrainStep, cap: Capture, p: Parsed, report: dict[str, Any], folder: Path
) -> None:
    """Every file of a report into ``folder``."""
    cap.prof.export_chrome_trace(str(folder / "trace.json.gz"))  # gzipped by the name's suffix
    plot_time_split(report["time"], folder / "time_split.png")
    plot_memory(p.curve, p.line, folder / "memory_timeline.png")
    if step.device.type == "cuda":
        dump_memory_snapshot(step, folder / SNAPSHOT)
    report["files"] = sorted(
        [*(f.name for f in folder.iterdir()), "report.html", "report.json", "report.md"]
    )
    blocks = report_blocks(report)
    write_json_atomic(folder / "report.json", report)
    write_text_atomic(folder / "report.md", to_markdown(blocks))
    write_text_atomic(folder / "report.html", to_html(blocks))
