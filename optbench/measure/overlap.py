"""Communication against computation on one GPU's timeline: how much of the collectives' time other
kernels hid, and how much the step waited on them.

Input: the device activities of a profiled stretch of steps (name, start and end in us), as
torch.profiler records them (CUPTI: kernels, memcpys and memsets, one record per kernel of a CUDA
graph replay too), less the spans that are not device work (user annotations' device-side ranges,
:data:`NOT_DEVICE_WORK`). NCCL's kernels (``nccl*``: ``ncclDevKernel_AllReduce_...`` and the like)
are the communication; every other activity is computation, whatever its stream. With C the union of
the communication intervals and K that of the computation ones:

- communication = |C|, the time some collective ran;
- overlapped = |C ∩ K|, the part of it during which computation ran too (hidden);
- exposed = |C| - |C ∩ K|, the part during which only collectives ran: what the step waited;
- busy = |C ∪ K|, the time the device ran anything: a step whose wall time is well above it waits
  on its host (launches, Python), not on the device.

A collective's kernel spans its whole protocol, waits on its peers included, so a rank that reaches
an all-reduce early shows the wait as communication: the exposed time of the slowest rank is the
one that costs the step. Figures are per step (the stretch's totals over its number of steps).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

COMMUNICATION = re.compile(r"^nccl", re.IGNORECASE)
# CUPTI records the time a launch waited for a full command buffer as a device-side span: it is host
# back-pressure, not device work (counted, a 1B step showed 113 ms of "device time" in it).
NOT_DEVICE_WORK = ("Command Buffer Full",)


def device_work(events: Iterable[Any]) -> list[Any]:
    """The device's work among torch.profiler's ``events`` (a profile's ``events()``): those off
    the host, less the device-side ranges of user annotations and :data:`NOT_DEVICE_WORK`."""
    from torch.autograd import DeviceType

    return [
        e
        for e in events
        if e.device_type != DeviceType.CPU
        and not e.is_user_annotation
        and e.name not in NOT_DEVICE_WORK
    ]


def merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals as disjoint intervals, in order (an empty or reversed one, such as an
    event clipped to a start after its end, adds nothing)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of disjoint intervals."""
    return sum(b - a for a, b in intervals)


def intersection(
    left: list[tuple[float, float]], right: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The intersection of two lists of disjoint, ordered intervals."""
    out, i, j = [], 0, 0
    while i < len(left) and j < len(right):
        a, b = max(left[i][0], right[j][0]), min(left[i][1], right[j][1])
        if a < b:
            out.append((a, b))
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return out


@dataclass(frozen=True)
class Overlap:
    """Per step, in ms: collectives' time, the part computation hid, the part it did not; the
    time the device ran anything."""

    communication_ms: float
    overlapped_ms: float
    exposed_ms: float
    steps: int
    busy_ms: float

    @classmethod
    def of(cls, activities: Iterable[tuple[str, float, float]], steps: int) -> Overlap:
        """From (name, start us, end us) of every device activity of ``steps`` steps."""
        comm, compute = [], []
        for name, start, end in activities:
            (comm if COMMUNICATION.match(name) else compute).append((start, end))
        c, k = merged(comm), merged(compute)
        hidden = length(intersection(c, k))
        total, busy = length(c), length(merged(c + k))
        per_step_ms = 1e-3 / steps
        return cls(
            total * per_step_ms,
            hidden * per_step_ms,
            (total - hidden) * per_step_ms,
            steps,
            busy * per_step_ms,
        )

    @classmethod
    def of_profile(cls, events: Iterable[Any], steps: int) -> Overlap:
        """From torch.profiler's ``events`` of ``steps`` steps (their :func:`device_work`)."""
        work = device_work(events)
        return cls.of(((e.name, e.time_range.start, e.time_range.end) for e in work), steps)

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)
