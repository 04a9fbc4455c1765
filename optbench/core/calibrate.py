"""``optbench calibrate``: checks optbench's timer against ``triton.testing.do_bench`` on this GPU.

On a bf16 8192^3 matmul and a 1 GiB device-to-device copy (random data), it prints both medians,
their difference, and the achieved TFLOP/s and GB/s against the hardware profile's peaks, and
stores the table in the result store as the record ``__calibration__`` of this machine and commit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any


def cases(device: str) -> dict[str, tuple[Any, float, float, str]]:
    """name -> (callable, FLOPs, bytes, dtype) of the two calibration workloads."""
    import torch

    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    src = torch.randn(2**29, device=device, dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    return {"matmul_bf16_8192": (lambda: a @ b, 2.0 * n**3, 3.0 * n * n * 2, "bf16"),
            "copy_1GiB": (lambda: dst.copy_(src), 0.0, 2.0 * src.numel() * 2, "bf16")}


def calibrate(device: str = "cuda") -> list[dict[str, Any]]:
    """One row per workload: our device median, do_bench's median, difference, roofline fractions."""
    from triton.testing import do_bench

    from optbench.hardware import detect
    from optbench.roofline import Ceilings, roofline
    from optbench.timing import measure

    ceilings = Ceilings.from_profile(detect())
    rows = []
    for name, (fn, flops, nbytes, dtype) in cases(device).items():
        ours = measure(fn, device=device, warmup_ms=100, rep_ms=500).device
        theirs = do_bench(fn, warmup=100, rep=500, return_mode="median")
        r = roofline(flops, nbytes, ours.median_ms, ceilings, dtype)
        rows.append({"workload": name, "optbench_ms": ours.median_ms, "optbench_iqr_ms": ours.iqr_ms,
                     "method": ours.method, "do_bench_ms": theirs,
                     "diff_pct": 100.0 * (ours.median_ms - theirs) / theirs,
                     "tflops": r.achieved_tflops, "gbps": r.achieved_gbps,
                     "compute_frac_of_profile": r.compute_frac, "bandwidth_frac_of_profile": r.bandwidth_frac,
                     "profile": ceilings.source})
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="optbench calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--tolerance-pct", type=float, default=3.0, help="largest accepted difference")
    args = p.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    from optbench.machine import machine_info
    from optbench.runner import current_commit, current_machine
    from optbench.store import ResultStore

    rows = calibrate()
    table = Table(title="optbench timer vs triton.testing.do_bench (device time, median)")
    for col in ("workload", "optbench ms", "do_bench ms", "diff %", "TFLOP/s", "GB/s", "of profile peak"):
        table.add_column(col)
    for r in rows:
        frac = r["compute_frac_of_profile"] if r["tflops"] else r["bandwidth_frac_of_profile"]
        table.add_row(r["workload"], f"{r['optbench_ms']:.4f}", f"{r['do_bench_ms']:.4f}", f"{r['diff_pct']:+.2f}",
                      f"{r['tflops']:.1f}" if r["tflops"] else "-", f"{r['gbps']:.0f}",
                      f"{frac:.1%}" if frac is not None else "unknown")
    Console().print(table)
    commit, machine = current_commit(), current_machine()
    ResultStore().save(machine, commit, [{"key": "__calibration__", "commit": commit, "machine_info": machine_info(),
                                          "date": dt.datetime.now(dt.timezone.utc).isoformat(), "rows": rows}])
    print(json.dumps(rows))
    return 0 if all(abs(r["diff_pct"]) <= args.tolerance_pct for r in rows) else 1
