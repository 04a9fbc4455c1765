"""``optbench calibrate``: checks optbench's timer against ``triton.testing.do_bench`` on this GPU.

On roofline's two ceiling probes (``optbench.measure.roofline``), a bf16 8192^3 matmul and a 1 GiB
device-to-device copy of random data, it prints both medians, their difference, and the achieved
TFLOP/s and GB/s against the hardware profile's peaks, and stores the table in the result store as
the record ``__calibration__`` of this machine and commit. Exit status 1 where a difference exceeds
``--tolerance-pct``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any


def cases(device: str) -> dict[str, Any]:
    """name -> :class:`optbench.measure.roofline.Probe` of the two calibration workloads: roofline's
    matmul probe in bf16 ('matmul_bf16_<N>') and its copy probe of bf16 data ('copy_<GiB>GiB')."""
    from optbench.measure.roofline import COPY_BYTES, MATMUL_N, copy_probe, matmul_probe

    return {
        f"matmul_bf16_{MATMUL_N}": matmul_probe("bf16", device),
        f"copy_{COPY_BYTES >> 30}GiB": copy_probe(device, "bf16"),
    }


def calibrate(device: str = "cuda") -> list[dict[str, Any]]:
    """One row per workload: our device median, do_bench's median, difference, roofline
    fractions."""
    from triton.testing import do_bench

    from optbench.measure.hardware import detect
    from optbench.measure.roofline import Ceilings, roofline
    from optbench.measure.timing import measure

    ceilings = Ceilings.from_profile(detect())
    rows = []
    for name, probe in cases(device).items():
        ours = measure(probe.fn, device=device, warmup_ms=100, rep_ms=500).device
        theirs = do_bench(probe.fn, warmup=100, rep=500, return_mode="median")
        r = roofline(probe.flops, probe.bytes_moved, ours.median_ms, ceilings, probe.dtype)
        rows.append(
            {
                "workload": name,
                "optbench_ms": ours.median_ms,
                "optbench_iqr_ms": ours.iqr_ms,
                "method": ours.method,
                "do_bench_ms": theirs,
                "diff_pct": 100.0 * (ours.median_ms - theirs) / theirs,
                "tflops": r.achieved_tflops,
                "gbps": r.achieved_gbps,
                "compute_frac_of_profile": r.compute_frac,
                "bandwidth_frac_of_profile": r.bandwidth_frac,
                "profile": ceilings.source,
            }
        )
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="optbench calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--tolerance-pct", type=float, default=3.0, help="largest accepted difference")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        p.error(
            "calibrate times CUDA kernels (optbench's timer against triton.testing.do_bench): no "
            "CUDA GPU here"
        )
    from optbench.measure.machine import machine_info
    from optbench.run.console import console, table
    from optbench.run.runner import current_commit, current_machine
    from optbench.store.store import ResultStore

    rows = calibrate()
    cells = []
    for r in rows:
        frac = r["compute_frac_of_profile"] if r["tflops"] else r["bandwidth_frac_of_profile"]
        cells.append(
            (
                r["workload"],
                f"{r['optbench_ms']:.4f}",
                f"{r['do_bench_ms']:.4f}",
                f"{r['diff_pct']:+.2f}",
                f"{r['tflops']:.1f}" if r["tflops"] else "-",
                f"{r['gbps']:.0f}",
                f"{frac:.1%}" if frac is not None else "unknown",
            )
        )
    console().print(
        table(
            (
                "workload",
                "optbench ms",
                "do_bench ms",
                "diff %",
                "TFLOP/s",
                "GB/s",
                "of profile peak",
            ),
            cells,
            title="optbench timer vs triton.testing.do_bench (device time, median)",
        )
    )
    commit, machine = current_commit(), current_machine()
    ResultStore().save(
        machine,
        commit,
        [
            {
                "key": "__calibration__",
                "commit": commit,
                "machine_info": machine_info(),
                "date": dt.datetime.now(dt.timezone.utc).isoformat(),
                "rows": rows,
            }
        ],
    )
    print(json.dumps(rows))
    return 0 if all(abs(r["diff_pct"]) <= args.tolerance_pct for r in rows) else 1
