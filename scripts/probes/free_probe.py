"""Where a case's freeing seconds go on a GPU (the breakdown's "freeing the case's memory", 0.2 s a
case in the full suite): the parts of ``optbench.run.runner._free_device_memory`` (the collector's
pass where the device still holds more than at the case's start, and what it freed; synchronize;
empty_cache) against the case's whole ``free_seconds``, whose rest is dropping its work (``del
work``). One JSON line per case, for the full suite's SwiGLU and RMSNorm kernels and two
100M steps, in one process. Run it on a GPU:

    python3 scripts/probes/free_probe.py
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
import time

import torch

from optbench.run import runner
from optbench.store.store import ResultStore, record_key
from optbench.suite import catalog, grids

PROBED = {
    "bench_kernels.SwiGLU": None,
    "bench_kernels.RMSNorm": None,
    "bench_step.Step100M": ("eager", "fused-adamw"),
}


def main() -> None:
    parts: list[dict] = []

    def free(baseline: int | None = None) -> None:
        t0 = time.perf_counter()
        over = None if baseline is None else torch.cuda.memory_allocated() - baseline
        full = over is None or over > 0
        if full:
            gc.collect()
        t1 = time.perf_counter()
        after = None if baseline is None else torch.cuda.memory_allocated() - baseline
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        torch.cuda.empty_cache()
        t3 = time.perf_counter()
        parts.append(
            {
                "allocated_over_start": over,
                "collector_s": round(t1 - t0, 4) if full else None,
                "allocated_over_start_after": after,
                "sync_s": round(t2 - t1, 4),
                "empty_cache_s": round(t3 - t2, 4),
            }
        )

    runner._free_device_memory = free
    os.environ.setdefault("OPTBENCH_MACHINE", "free-probe")
    os.environ.setdefault("ASV_COMMIT", "f" * 40)
    store = ResultStore(tempfile.mkdtemp())
    for name, variants in PROBED.items():
        entry = catalog.benchmark(name)
        chosen = [
            case
            for case in grids.cases(name, entry.grid("full"), "cuda")
            if variants is None or case.params.get("variant") in variants
        ]
        records = runner.run_grid(name, chosen, device="cuda", store=store, log=lambda _: None)
        # one freeing per case, in the cases' order (the runner frees after every case it starts)
        assert len(parts) == len(records) == len(chosen), (len(parts), len(records))
        for case, rec, part in zip(chosen, records.values(), parts):
            print(
                json.dumps(
                    {
                        "case": record_key(name, case.params),
                        "status": rec["status"],
                        "free_s": rec.get("free_seconds"),
                        **part,
                        "tracked_objects": len(gc.get_objects()),
                    }
                ),
                flush=True,
            )
        parts.clear()


if __name__ == "__main__":
    main()
