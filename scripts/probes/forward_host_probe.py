"""Probe (CUDA): is a step's ungraphed forward (the ``forward`` metric) host-bound, and how fast
was the host? For each variant named (at PROBE_SIZE, default 1B, with the suite's options), the
step is built as the suite builds it, stepped 3 times, and its ``forward_loss`` called
PROBE_CALLS times (default 20) in each of three ways:

- ``wall``: synchronize, call, synchronize: what the suite's ``forward`` metric times;
- ``enqueue``: synchronize, call (the host's time to launch the forward's work), then synchronize
  outside the timing;
- ``queued``: the stream held by a sleeping kernel longer than the host takes to launch the
  forward, then the forward timed by CUDA events around it: its kernels run back to back, so
  this is the device's time for the forward without host launch gaps. ``lag_ms``: how long the
  sleep outlasted the launches (a negative lag means the host was still launching when the
  device got there, so that call's figure counts host gaps too).

A forward whose ``enqueue`` exceeds its ``queued`` time is host-bound: its ``wall`` is the host's.
Beside them, ``host_loop_ms``: a fixed pure-Python loop's time in this process (median of 9),
a reading of the host CPU's speed to compare between machines and processes.

Run from the repository root: ``python3 -m scripts.probes.forward_host_probe best-kernels
best-kernels-fp8-triton``; one JSON line per variant.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

from models.config import CONFIGS
from models.step import build_step
from optbench.suite.workloads import step_options

SIZE = os.environ.get("PROBE_SIZE", "1B")
CALLS = int(os.environ.get("PROBE_CALLS", "20"))


def host_loop_ms() -> float:
    """Median ms of 9 runs of a fixed pure-Python loop (integer arithmetic, no allocation in C)."""

    def loop() -> float:
        t0 = time.perf_counter()
        acc = 0
        for i in range(1_000_000):
            acc += i * i % 7
        return (time.perf_counter() - t0) * 1e3

    return statistics.median(loop() for _ in range(9))


def sleep_cycles_per_ms() -> float:
    """GPU clock cycles torch.cuda._sleep spins per millisecond, timed by events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    torch.cuda._sleep(cycles // 10)  # the clock up before it is timed
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return cycles / start.elapsed_time(end)


def quartiles(values: list[float]) -> list[float]:
    q = statistics.quantiles(values, n=4)
    return [round(q[0], 3), round(statistics.median(values), 3), round(q[2], 3)]


def probe(variant: str, cycles_per_ms: float) -> dict:
    _, options = step_options(SIZE, variant, "cuda")
    t0 = time.perf_counter()
    step = build_step(CONFIGS[SIZE], options, "cuda", 0)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    sync, clock = torch.cuda.synchronize, time.perf_counter
    wall, enqueue, queued, lag = [], [], [], []
    for _ in range(CALLS):
        sync()
        t = clock()
        step.forward_loss()
        sync()
        wall.append((clock() - t) * 1e3)
    for _ in range(CALLS):
        sync()
        t = clock()
        step.forward_loss()
        enqueue.append((clock() - t) * 1e3)
        sync()
    hold_ms = 2 * max(enqueue) + 20
    for _ in range(CALLS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        sync()
        t = clock()
        torch.cuda._sleep(int(hold_ms * cycles_per_ms))
        start.record()
        step.forward_loss()
        end.record()
        launched_ms = (clock() - t) * 1e3
        sync()
        queued.append(start.elapsed_time(end))
        lag.append(hold_ms - launched_ms)
    out = {
        "variant": variant,
        "size": SIZE,
        "build_s": round(build_s, 1),
        "calls": CALLS,
        "wall_ms_q": quartiles(wall),
        "enqueue_ms_q": quartiles(enqueue),
        "queued_device_ms_q": quartiles(queued),
        "lag_ms_min": round(min(lag), 1),
        "wall_ms_all": [round(v, 2) for v in wall],
        "enqueue_ms_all": [round(v, 2) for v in enqueue],
    }
    del step
    torch.cuda.empty_cache()
    return out


def main(variants: list[str]) -> None:
    cycles_per_ms = sleep_cycles_per_ms()
    gpu = torch.cuda.get_device_properties(0)
    print(json.dumps({"gpu": gpu.name, "uuid": str(gpu.uuid), "cycles_per_ms": cycles_per_ms}))
    for variant in variants:
        before = host_loop_ms()
        row = probe(variant, cycles_per_ms)
        row["host_loop_ms_before_after"] = [round(before, 1), round(host_loop_ms(), 1)]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["best-kernels", "best-kernels-fp8-triton"])
