"""The profiled steps' events, split once: the host phases of each step, the device activity and the
memory curve.

Time split: the profiler's ``ProfilerStep#k`` ranges bound each step on the host, and ranges that
torch emits itself cut it into contiguous phases: optimizer (``Optimizer.zero_grad#...``), forward
(up to the first ``autograd::engine::evaluate_function`` event: forward and loss), backward (first
to last of those events, on whichever thread autograd runs them: the caller's on a CPU, a device
thread on CUDA), optimizer (up to the end of the last ``Optimizer.step#...`` range: unscaling,
gradient statistics, clipping, AdamW) and other (the loss copy, ``loss.item()``, the harness).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import profile

from optbench.measure.overlap import device_work
from optbench.profiling.capture import Capture

PHASES = ("forward", "backward", "optimizer", "data_movement", "other")
HOST_PHASES = ("forward", "backward", "optimizer", "other")  # the segments' phases
BACKWARD = "autograd::engine::evaluate_function"
ZERO_GRAD, OPTIMIZER_STEP = "Optimizer.zero_grad#", "Optimizer.step#"
HOST_MEMORY = (DeviceType.CPU, DeviceType.MKLDNN, DeviceType.IDEEP)

Segment = tuple[float, float, str]  # (start us, end us, phase) on the profiler's clock


def step_segments(events: list[FunctionEvent], start: float, end: float) -> list[Segment]:
    """Contiguous phases of one step's host time (see the module's doc); all 'other' without a
    backward."""
    inside = [e for e in events if start <= e.time_range.start < end]
    backward = [e for e in inside if e.name.startswith(BACKWARD)]
    if not backward:
        return [(start, end, "other")]
    b0 = min(e.time_range.start for e in backward)
    b1 = min(max(e.time_range.end for e in backward), end)
    f0 = max(
        (
            e.time_range.end
            for e in inside
            if e.name.startswith(ZERO_GRAD) and e.time_range.end <= b0
        ),
        default=start,
    )
    o1 = min(
        max(
            (
                e.time_range.end
                for e in inside
                if e.name.startswith(OPTIMIZER_STEP) and e.time_range.start >= b1
            ),
            default=b1,
        ),
        end,
    )
    bounds = [
        (start, f0, "optimizer"),
        (f0, b0, "forward"),
        (b0, b1, "backward"),
        (b1, o1, "optimizer"),
        (o1, end, "other"),
    ]
    return [s for s in bounds if s[1] > s[0]]


@dataclasses.dataclass
class Timeline:
    """The profiled steps on the host: their ranges and phase segments (us on the profiler's
    clock)."""

    ranges: list[tuple[float, float]]
    segments: list[Segment]

    @classmethod
    def of(cls, host: list[FunctionEvent]) -> Timeline:
        ranges = sorted(
            (e.time_range.start, e.time_range.end)
            for e in host
            if e.name.startswith("ProfilerStep")
        )
        if not ranges:
            raise RuntimeError("the profile holds no ProfilerStep range: no step was profiled")
        return cls(ranges, [s for a, b in ranges for s in step_segments(host, a, b)])

    @property
    def n(self) -> int:
        return len(self.ranges)

    def phase_at(self, t: float) -> str | None:
        """Phase of the segment holding time ``t``; None outside the steps."""
        i = bisect.bisect_right(self.segments, (t, math.inf, "")) - 1
        return self.segments[i][2] if i >= 0 and t < self.segments[i][1] else None

    def step_phases(self) -> Iterator[tuple[float, float, dict[str, tuple[float, float]]]]:
        """(start, end, {phase: (its first start, its last end)}) of each step."""
        for a, b in self.ranges:
            spans: dict[str, tuple[float, float]] = {}
            for s0, s1, phase in (s for s in self.segments if a <= s[0] < b):
                spans[phase] = (spans.get(phase, (s0,))[0], s1)
            yield a, b, spans


@dataclasses.dataclass
class MemoryCurve:
    """Bytes allocated on the step's device after each allocator event (times in us, the profiler's
    clock)."""

    times: np.ndarray
    levels: np.ndarray
    initial: float

    @classmethod
    def of(cls, prof: profile, device: torch.device, end_bytes: int) -> MemoryCurve:
        """From the profiler's memory events, anchored so that the last level is ``end_bytes`` (a
        CPU profile misses frees of blocks allocated before it started: anchored at the end, the
        curve is exact from the first step's zero_grad on)."""
        results = prof.profiler.kineto_results
        cuda = device.type == "cuda"
        index = (
            (torch.cuda.current_device() if device.index is None else device.index)
            if cuda
            else None
        )

        def mine(e: Any) -> bool:
            if cuda:
                return e.device_type() == DeviceType.CUDA and e.device_index() == index
            return e.device_type() in HOST_MEMORY

        t0 = results.trace_start_ns()
        mem = sorted(
            ((e.start_ns() - t0) / 1e3, e.nbytes())
            for e in results.events()
            if e.name() == "[memory]" and mine(e)
        )
        levels = np.cumsum([b for _, b in mem], dtype=float)
        offset = end_bytes - (levels[-1] if len(levels) else 0.0)
        return cls(np.array([t for t, _ in mem], dtype=float), levels + offset, offset)

    def at(self, t: float) -> float:
        i = int(np.searchsorted(self.times, t, side="right"))
        return float(self.levels[i - 1]) if i else self.initial

    def peak(self, a: float, b: float) -> float:
        i, j = np.searchsorted(self.times, [a, b], side="right")
        return max(self.at(a), *self.levels[i:j].tolist())


@dataclasses.dataclass
class Parsed:
    """A capture's events, split once: host events within the steps, device activity (kernels,
    memcpys, memsets; not the device-side spans of record_function ranges), the timeline and the
    memory curve."""

    host: list[FunctionEvent]
    device: list[FunctionEvent]
    line: Timeline
    curve: MemoryCurve

    @classmethod
    def of(cls, cap: Capture, device: torch.device) -> Parsed:
        events = list(cap.prof.events())
        host = [e for e in events if e.device_type == DeviceType.CPU]
        line = Timeline.of(host)
        return cls(
            [e for e in host if line.phase_at(e.time_range.start)],
            device_work(events),
            line,
            MemoryCurve.of(cap.prof, device, cap.end_bytes),
        )
