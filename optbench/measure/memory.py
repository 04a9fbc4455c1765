"""Device memory: the peak of one call of a callable (:func:`peak_memory`), and a case's own memory
as training needs it (:class:`CaseMeter`, stored as a record's ``memory``,
:class:`optbench.store.records.CaseMemory`)."""

from __future__ import annotations

import contextlib
import resource
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from optbench.store.records import CASE_METER

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


# The meter of the case being measured in this process (CaseMeter.metering), for not_counted().
_active: CaseMeter | None = None


class CaseMeter:
    """The CUDA memory one case uses as training needs it, above what its process held when the
    meter started (earlier cases' leftovers, ``held_before_bytes``).

    Only the code inside :meth:`counting` counts (the runner's build, warm-up and timing); the
    correctness check runs outside it. Within a counted phase, :func:`not_counted` sets work apart
    (the check's reference): its own peak is dropped, and the bytes it leaves on the device are
    moved from the case to ``reference_bytes``. :meth:`result` is the record's ``memory``:

    - ``peak_bytes``: max over counted phases of ``max_memory_allocated`` less the bytes allocated
      at the start (not the free bytes of earlier cases' live graph pools, which
      ``max_memory_allocated`` does not count either). A CUDA graph's buffers count at capture,
      where they are allocated; a replay allocates nothing.
    - ``resident_bytes``: what is held at the end: allocated bytes plus the free bytes inside
      private pools (a live CUDA graph's, kept for its replays), less the same at the start.
    - ``reserved_peak_bytes``: ``max_memory_reserved`` over counted phases, less the bytes
      reserved at the start and those set apart; the allocator's cache is emptied as each counted
      phase starts and after work set apart, so what they left cached is not the case's.

    A meter on a device other than CUDA measures nothing: its :meth:`result` is empty.
    """

    def __init__(self, device: str | torch.device) -> None:
        self.cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
        self._peak = self._reserved_peak = self._reference = 0
        self._base = self._held_before = self._reserved_base = self._allocated_base = 0
        self._counting = False
        if self.cuda:
            torch.cuda.synchronize()
            # cuBLAS keeps a workspace per handle and stream (32 MiB on an H200), taken from the
            # caching allocator by the first matmul of a process and held: given back here, as
            # PyTorch's own leak check does, so that every case counts the ones it uses, whether
            # it is the first in its process or not. Safe while no CUDA graph of an earlier case
            # is replayed once the next case's meter starts (each case's graphs die with it)
            clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear_workspaces is not None:
                clear_workspaces()
            self._held_before = self._base = held_bytes()
            self._allocated_base = torch.cuda.memory_allocated()
            self._reserved_base = torch.cuda.memory_reserved()

    @contextlib.contextmanager
    def metering(self) -> Iterator[CaseMeter]:
        """Make this the meter :func:`not_counted` reports to, for the code inside."""
        global _active
        outer, _active = _active, self
        try:
            yield self
        finally:
            _active = outer

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Count the peaks of the code inside (also where it raises)."""
        if not self.cuda:
            yield
            return
        torch.cuda.empty_cache()  # what ran between counted phases left cached is not the case's
        self._restart()
        self._counting = True
        try:
            yield
        finally:
            self._counting = False
            self._fold()

    @contextlib.contextmanager
    def apart(self, kept: Callable[[], int] | None = None) -> Iterator[None]:
        """The code inside is not the case's: its peak is dropped, what it left cached is given
        back, and what it leaves allocated (or frees: another size's reference sent to the host)
        moves the base. ``reference_bytes`` gains ``kept()``, the bytes it keeps on the device for
        the case (the check's reference), or, without ``kept``, what it left allocated."""
        if not (self.cuda and self._counting):
            yield
            return
        self._fold()
        before = torch.cuda.memory_allocated()
        try:
            yield
        finally:
            torch.cuda.synchronize()
            left = torch.cuda.memory_allocated() - before
            self._base += left
            self._allocated_base += left
            self._reserved_base += left
            self._reference += left if kept is None else kept()
            torch.cuda.empty_cache()
            self._restart()

    def result(self) -> dict[str, int]:
        """The record's ``memory`` (records.CaseMemory's fields), bytes; empty without CUDA."""
        if not self.cuda:
            return {}
        torch.cuda.synchronize()
        return {
            "peak_bytes": self._peak,
            "resident_bytes": max(0, held_bytes() - self._base),
            "reserved_peak_bytes": self._reserved_peak,
            "held_before_bytes": self._held_before,
            "reference_bytes": self._reference,
            "meter": CASE_METER,
        }

    def _restart(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def _fold(self) -> None:
        torch.cuda.synchronize()
        self._peak = max(self._peak, torch.cuda.max_memory_allocated() - self._allocated_base)
        self._reserved_peak = max(
            self._reserved_peak, torch.cuda.max_memory_reserved() - self._reserved_base
        )


@contextlib.contextmanager
def not_counted(kept: Callable[[], int] | None = None) -> Iterator[None]:
    """Set the code inside apart from the case being metered (:meth:`CaseMeter.apart`, ``kept``
    the bytes it keeps on the device for the case); a no-op where no meter is active (a case
    measured outside the runner, a CPU)."""
    with _active.apart(kept) if _active is not None else contextlib.nullcontext():
        yield


def held_bytes() -> int:
    """CUDA bytes this process holds for its tensors: those allocated, plus the free bytes of
    private pools (a live CUDA graph's: its replays write there). The allocator's cache is emptied
    first: a dead graph's pool (a step captured again) keeps its segments until then."""
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated() + sum(
        segment["total_size"] - segment["allocated_size"] for segment in _private_segments()
    )


def _private_segments() -> list[dict[str, Any]]:
    """The caching allocator's segments that belong to a private pool (not the default, (0, 0))."""
    return [
        segment
        for segment in torch.cuda.memory_snapshot()
        if tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0)
    ]
