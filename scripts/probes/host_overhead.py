"""Is a host-bound training step slower in a process that measured other cases first, and why? The
eager 100M step's wall ms per step (as the suite times it) in a fresh process; after the quick
suite's kernel cases (inductor compiles, Liger-Kernel, our Triton kernels); then with the garbage
collector frozen, disabled, and with inductor's compile workers shut down. Each line also gives the
threads and child processes alive and the objects the collector tracks. Prints one JSON line per
point.

    python3 scripts/probes/host_overhead.py
"""

from __future__ import annotations

import gc
import json
import os
import threading


def _children() -> int:
    try:
        return len(open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split())
    except OSError:
        return -1


def main() -> int:
    from optbench.measure.timing import measure
    from optbench.suite import catalog
    from optbench.suite.workloads import STEP_REP_MS, STEP_WARMUP_MS, kernel_work, step_work

    work = step_work("100M", "eager", "cuda")
    work.check()

    def point(name: str) -> None:
        wall = measure(
            work.timed["step"],
            device="cuda",
            graph=False,
            warmup_ms=STEP_WARMUP_MS,
            rep_ms=STEP_REP_MS,
        ).wall
        print(
            json.dumps(
                {
                    "point": name,
                    "step_wall_ms": round(wall.median_ms, 2),
                    "iqr_ms": round(wall.iqr_ms, 2),
                    "threads": sorted(t.name for t in threading.enumerate()),
                    "children": _children(),
                    "gc_objects": len(gc.get_objects()),
                    "gc_counts": gc.get_count(),
                }
            ),
            flush=True,
        )

    point("fresh")
    point("fresh, again")
    for op in catalog.KERNELS.values():
        if not op.quick:
            continue
        for impl in op.impls:
            try:
                case = kernel_work(op.name, op.shape_1b, impl, "cuda")
            except NotImplementedError:
                continue
            case.check()
            for fns in case.rotation.values():
                measure(fns, device="cuda")
            del case
    point("after the quick kernel cases")
    gc.collect()
    gc.freeze()
    point("collector frozen")
    gc.unfreeze()
    gc.disable()
    point("collector disabled")
    gc.enable()
    from torch._inductor.async_compile import shutdown_compile_workers

    shutdown_compile_workers()
    point("inductor's compile workers shut down")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
