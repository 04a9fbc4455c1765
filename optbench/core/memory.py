"""Peak memory of one call of a callable."""

from __future__ import annotations

import contextlib
import resource
import sys
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

_HOST_DEVICES = (DeviceType.CPU, DeviceType.MKLDNN, DeviceType.IDEEP)


def peak_memory(fn: Callable[[], object], device: str | torch.device = "cpu") -> int:
    """Peak bytes allocated during one call of fn, above what was allocated when it started.

    CUDA: the caching allocator's peak (max_memory_allocated) minus the allocation at the start;
    this resets the device's peak-memory statistics.
    CPU: the peak of the running sum of the allocation/free events torch.profiler records (tensor
    memory only, all threads). If the profiler cannot run or its events cannot be read, falls back
    to the growth of the process's max RSS (resource.getrusage), which is coarse and only a lower
    bound: it counts all memory, in pages, and misses peaks below the process's earlier high-water
    mark.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return _cuda_peak(fn, dev)
    if dev.type != "cpu":
        raise ValueError(f"peak_memory() supports cpu and cuda devices, not {dev.type!r}")
    rss_before = _max_rss_bytes()
    with contextlib.ExitStack() as stack:
        try:
            prof = stack.enter_context(
                profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            )
        except RuntimeError:  # e.g. another profiler is already active
            prof = None
        fn()
    peak = _profiled_peak(prof) if prof is not None else None
    return peak if peak is not None else max(0, _max_rss_bytes() - rss_before)


def _cuda_peak(fn: Callable[[], object], dev: torch.device) -> int:
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    fn()
    torch.cuda.synchronize(dev)
    return max(0, torch.cuda.max_memory_allocated(dev) - base)


def _profiled_peak(prof: profile) -> int | None:
    """Peak of the running sum of host memory events, bytes; None if the events cannot be read."""
    try:
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        host = sorted(
            (e for e in events if e.device_type() in _HOST_DEVICES), key=lambda e: e.start_ns()
        )
        deltas = [e.nbytes() for e in host]
    except (AttributeError, RuntimeError):
        return None
    peak = current = 0
    for nbytes in deltas:
        current += nbytes
        peak = max(peak, current)
    return peak


def _max_rss_bytes() -> int:
    """The process's peak resident set size, bytes (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024
