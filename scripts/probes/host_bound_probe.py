"""Where a host-bound step's time goes between calls, and why its median moves between processes
(the 100M eager step on an H100 or H200: 52 to 96 ms over runs of one commit, an IQR of 1 to 35 ms
within one). Runs the cases named below (Step100M's of the full suite unless ``PROBE_BENCHMARK``
and ``PROBE_SUITE`` name others) through the runner, in one process,
and for every timed call of each step (warm-up and samples) records its wall time, the CPU time of
the calling thread, and the time the collector spent inside it (``gc.callbacks``), by generation.

One JSON line per case: the medians and quartiles of those per call, the collections per call, and
the runner's own figure. Run it on a GPU, in several processes to see the spread between them:

    [PROBE_NO_GC=1] [PROBE_BENCHMARK=bench_step.Step1B] [PROBE_SUITE=sweep]
    python3 scripts/probes/host_bound_probe.py [VARIANT ...] (default: eager fused-adamw eager)

``per_metric``: the wall and thread CPU time of each timed call of each metric of the case (the
step, then the forward). Where CUDA's synchronize spins (on the lent H200s it did: a graphed 1B
step's CPU time equals its wall time), the CPU time counts the wait too and tells nothing.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch

from optbench.measure import timing
from optbench.run import runner
from optbench.store.store import ResultStore
from optbench.suite import catalog, grids

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# PROBE_NO_GC=1: the collector off while each metric is timed (as timeit times)
NO_GC = bool(os.environ.get("PROBE_NO_GC"))
BENCHMARK = os.environ.get("PROBE_BENCHMARK", "bench_step.Step100M")


class Collector:
    """Seconds the collector ran, by generation, since the last :meth:`take`."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._start
            self.count[info["generation"]] += 1

    def take(self) -> tuple[list[float], list[int]]:
        taken = (self.seconds, self.count)
        self.seconds, self.count = [0.0, 0.0, 0.0], [0, 0, 0]
        return taken


def quartiles(values: list[float]) -> list[float]:
    return [round(float(v), 3) for v in np.percentile(values, [25, 50, 75])] if values else []


def main() -> None:
    variants = sys.argv[1:] or ["eager", "fused-adamw", "eager"]
    os.environ.setdefault("OPTBENCH_MACHINE", "host-bound-probe")
    os.environ.setdefault("ASV_COMMIT", "f" * 40)
    collector = Collector()
    timed: list[list[dict]] = []  # per measure() call of a case: its metrics in turn (step first)
    measure = timing.measure

    def traced(fn: Callable[[], object], calls: list[dict]) -> Callable[[], object]:
        def call() -> object:
            collector.take()
            wall, cpu = time.perf_counter(), time.thread_time()
            out = fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            seconds, count = collector.take()
            calls.append(
                {
                    "wall_ms": (time.perf_counter() - wall) * 1e3,
                    "cpu_ms": (time.thread_time() - cpu) * 1e3,
                    "gc_ms": [s * 1e3 for s in seconds],
                    "gc_n": count,
                }
            )
            return out

        return call

    def measure_traced(fn, **kwargs):  # noqa: ANN001, ANN003, ANN202 - measure's own signature
        timed.append([])
        calls = timed[-1]
        if NO_GC:
            gc.disable()
        try:
            return measure(
                traced(fn, calls) if callable(fn) else [traced(f, calls) for f in fn], **kwargs
            )
        finally:
            gc.enable()

    timing.measure = measure_traced
    entry = catalog.benchmark(BENCHMARK)
    cases = {
        c.params.get("variant"): c
        for c in grids.cases(
            BENCHMARK,
            entry.grid(os.environ.get("PROBE_SUITE", "full") if DEVICE == "cuda" else "cpu"),
            DEVICE,
        )
    }
    store = ResultStore(tempfile.mkdtemp())
    print(json.dumps({"objects_tracked_at_start": len(gc.get_objects())}), flush=True)
    for variant in variants:
        timed.clear()
        records = runner.run_grid(
            BENCHMARK, [cases[variant]], device=DEVICE, store=store, log=lambda _: None
        )
        rec = next(iter(records.values()))
        calls = timed[0] if timed else []
        wall = [c["wall_ms"] for c in calls]
        gc_total = [sum(c["gc_ms"]) for c in calls]
        print(
            json.dumps(
                {
                    "variant": variant,
                    "status": rec["status"],
                    "runner_step_ms": round(rec["metrics"]["step"]["wall"]["median_ms"], 2),
                    "runner_iqr_ms": round(rec["metrics"]["step"]["wall"]["iqr_ms"], 2),
                    "calls": len(calls),
                    "wall_ms_q": quartiles(wall),
                    "cpu_ms_q": quartiles([c["cpu_ms"] for c in calls]),
                    "gc_ms_q": quartiles(gc_total),
                    "gc_ms_sum": round(sum(gc_total), 1),
                    "gc_n_by_gen": [sum(c["gc_n"][g] for c in calls) for g in range(3)],
                    "gc_ms_by_gen": [round(sum(c["gc_ms"][g] for c in calls), 1) for g in range(3)],
                    "wall_ms_all": [round(w, 2) for w in wall],
                    "cpu_ms_all": [round(c["cpu_ms"], 2) for c in calls],
                    "objects_tracked": len(gc.get_objects()),
                    # each measure() call of the case (its metrics in turn, step first)
                    "per_metric": [
                        {
                            "calls": len(c),
                            "wall_ms_q": quartiles([x["wall_ms"] for x in c]),
                            "cpu_ms_q": quartiles([x["cpu_ms"] for x in c]),
                        }
                        for c in timed
                    ],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
