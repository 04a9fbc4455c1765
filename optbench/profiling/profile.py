"""``optbench profile``: a profiling report of the training step, with the figures users read off
torch.profiler by hand (time split, memory split, top operators, launches, host syncs and other
smells); ``--diff`` compares two reports.

Usage::

    optbench profile --size 100M [--variant fused-ce] [--options key=value ...] [--steps 3]
                     [--warmup 2] [--name NAME] [--out DIR] [--device cuda|cpu]
                     [--fp8-ceiling-tflops X]
    optbench profile --diff A B [--out DIR]        A, B: report folders or their report.json

A report runs ``--warmup`` steps (the last one under the profiler's own warm-up), then ``--steps``
steps under torch.profiler (CPU and CUDA activities, memory events, no shapes, no stacks). Every
figure is per step, averaged over the profiled steps. It writes report.json (all figures), report.md
and report.html (the same content), trace.json.gz (Chrome trace), time_split.png,
memory_timeline.png and, on CUDA, memory_snapshot.pickle.gz (one more step recorded by
``torch.cuda.memory._record_memory_history``; unzipped, for pytorch.org/memory_viz) into
``results/<machine>/profiles/<commit[:12]>-<size>-<name>/`` or ``--out``. The folder is built under
a temporary name and renamed into place, so a crash leaves no half report.

The parts: ``capture`` runs the profiler on the step, ``timeline`` splits its events into phases,
``breakdown`` and ``kernel_classes`` compute the figures, ``charts`` and ``report`` render and write
them, ``diff`` compares two reports.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, get_type_hints

import torch

from models.step import StepOptions
from optbench.profiling.breakdown import analyze
from optbench.profiling.capture import capture
from optbench.profiling.diff import run_diff
from optbench.profiling.report import fmt, staging, write_report
from optbench.profiling.timeline import Parsed
from optbench.run.console import console, table

# --- options
# ------------------------------------------------------------------------------------------------


def parse_options(pairs: Iterable[str]) -> dict[str, Any]:
    """``key=value`` strings to StepOptions overrides, typed by the field's annotation ('none' is
    None)."""
    hints = get_type_hints(StepOptions)
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in hints:
            raise SystemExit(f"optbench profile: bad option {pair!r}; keys: {', '.join(hints)}")
        if hints[key] is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise SystemExit(f"optbench profile: {key} takes true or false, not {value!r}")
            overrides[key] = value.lower() in ("true", "1")
        elif hints[key] is int:
            overrides[key] = int(value)
        else:
            overrides[key] = None if value.lower() == "none" else value
    return overrides


def step_options_for(
    size: str, variant: str | None, overrides: dict[str, Any], device: str
) -> StepOptions:
    """The profiled step's options: the variant's candidate (else the device's baseline) with
    ``overrides``."""
    from optbench.suite.workloads import step_options

    return step_options(size, variant or "eager", device)[1].replace(**overrides)


# --- main
# -------------------------------------------------------------------------------------------------


def class_ms(kc: dict[str, Any], kind: str) -> str:
    """A kernel class's device ms per step, with its floor where the report has one."""
    classes = (kc.get("floors") or {}).get("classes", [])
    floor = next((c["floor_ms"] for c in classes if c["class"] == kind), None)
    return fmt(kc["ms"][kind]) + (f" (floor {fmt(floor)})" if floor is not None else "")


def summary(report: dict[str, Any], folder: Path) -> None:
    """A short rich table of the headline figures."""
    m, t, s, mem, kc = (
        report["meta"],
        report["time"],
        report["smells"],
        report["memory"],
        report["kernel_classes"],
    )
    rows = [
        ("wall ms", fmt(t["wall_ms"])),
        ("tokens/s", fmt(t["tokens_per_s"])),
        *((f"host {p} ms", fmt(v)) for p, v in t["host_ms"].items()),
        ("GPU busy", fmt(t["gpu_busy_fraction"], "fraction")),
        (
            "kernel launches" if t["device_ms"] is not None else "aten ops",
            fmt(report["launches"]["per_step"]),
        ),
        ("host syncs", fmt(s["host_syncs"])),
        ("aten::copy_ calls", fmt(s["copy_calls"]["aten::copy_"])),
        ("small kernels", fmt(s["small_kernels"])),
        ("activations", fmt(mem["activations_bytes"], "bytes")),
        ("peak during backward", fmt(mem["peak_backward_bytes"], "bytes")),
        *(((f"device {k} ms", class_ms(kc, k)) for k in kc["ms"]) if kc else ()),
        *((("FP8 GEMM TFLOP/s", fmt(kc["matmul"]["gemm_fp8_tflops_achieved"])),) if kc else ()),
    ]
    terminal = console()
    terminal.print(
        table(
            ("figure", "per step"),
            rows,
            title=f"optbench profile: {m['size']} {m['name']} on {m['device']}",
        )
    )
    terminal.print(f"report: {folder}")


def parser() -> argparse.ArgumentParser:
    from models.config import CONFIGS
    from models.variants import VARIANTS

    p = argparse.ArgumentParser(prog="optbench profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=list(CONFIGS), help="model size")
    p.add_argument(
        "--variant", choices=["eager", *VARIANTS], help="profile this variant's candidate step"
    )
    p.add_argument(
        "--options",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="StepOptions overrides of the variant's (or the baseline's), e.g. item_sync=false "
        "grad_stats=foreach; cuda_graph=false to see a graphed step's operators",
    )
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--warmup", type=int, default=2, help="steps before them")
    p.add_argument(
        "--name", help="report name (default: the variant, 'custom' with --options, else 'eager')"
    )
    p.add_argument(
        "--out",
        help="report folder (default results/<machine>/profiles/<commit>-<size>-<name>); "
        "with --diff, the folder of diff.md (default: B's)",
    )
    p.add_argument("--device", help="cuda or cpu (default: cuda where available)")
    p.add_argument(
        "--fp8-ceiling-tflops",
        type=float,
        metavar="X",
        help="the FP8 matmul ceiling (TFLOP/s; default on CUDA for an FP8 step: measured, "
        "optbench.measure.roofline.fp8_burst_tflops): the report gives the FP8 GEMMs' fraction "
        "of it and their floor",
    )
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="compare two reports")
    return p


def main(argv: list[str] | None = None) -> int:
    """``optbench profile``: write a profiling report, or diff two (see the module's doc)."""
    from models.config import CONFIGS
    from models.step import UnsupportedOptions, build_step
    from optbench.measure.hardware import detect
    from optbench.measure.machine import machine_info
    from optbench.measure.roofline import fp8_burst_tflops, measure_ceilings
    from optbench.run.runner import current_commit, current_machine
    from optbench.store.store import results_dir

    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.diff:
        missing = [
            d for d in args.diff if not (Path(d).is_file() or (Path(d) / "report.json").is_file())
        ]
        if missing:
            p.error(
                "--diff takes two profile folders or their report.json; no such report: "
                f"{', '.join(missing)}"
            )
        return run_diff(args.diff, args.out)
    if not args.size or args.steps < 1 or args.warmup < 0:
        p.error("--size is required, --steps must be at least 1 and --warmup at least 0")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    options = step_options_for(args.size, args.variant, parse_options(args.options), device)
    # the variant's name, '-custom' with --options; 'eager': the baseline as it is
    parts = [args.variant, "custom" if args.options else None]
    name = args.name or "-".join(part for part in parts if part) or "eager"
    try:
        step = build_step(
            CONFIGS[args.size],
            options,
            device,
            profile=detect(device) if device.startswith("cuda") else None,
        )
    except UnsupportedOptions as exc:
        print(
            f"optbench profile: cannot run {name} at {args.size} on {device}: {exc}",
            file=sys.stderr,
        )
        return 2
    commit, machine = current_commit(), current_machine()
    folder = Path(
        args.out or results_dir() / machine / "profiles" / f"{commit[:12]}-{args.size}-{name}"
    )
    meta = {
        "commit": commit,
        "machine": machine,
        "size": args.size,
        "name": name,
        "variant": args.variant,
        "device": str(step.device),
        "torch": torch.__version__,
        "options": dataclasses.asdict(options),
        "warmup": args.warmup,
        "tokens_per_step": step.tokens_per_step,
        "flops_per_step": step.flops_per_step,
        "params": sum(t.numel() for t in step.params),
        "machine_info": machine_info(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    # the ceilings of the kernel classes' floors (a few seconds)
    ceilings = measure_ceilings(step.device) if step.device.type == "cuda" else None
    fp8_ceiling = args.fp8_ceiling_tflops
    if fp8_ceiling is None and options.fp8 != "off":
        fp8_ceiling = fp8_burst_tflops(step.device)
    with staging(folder) as tmp:
        cap = capture(step, args.steps, args.warmup)
        parsed = Parsed.of(cap, step.device)
        report = analyze(step, cap, parsed, meta, ceilings, fp8_ceiling)
        write_report(step, cap, parsed, report, tmp)
    summary(report, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
