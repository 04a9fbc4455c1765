"""optbench.measure.overlap: collectives' time split into hidden and exposed, per step."""

from __future__ import annotations

import pytest

from optbench.measure.overlap import Overlap, intersection, merged

ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


def test_a_collective_under_a_gemm_is_hidden_and_one_alone_is_exposed():
    """Two steps: in each a 100 us all-reduce, the first under a GEMM, the second alone."""
    activities = [
        ("sm90_xmma_gemm_bf16", 0.0, 300.0),
        (ALLREDUCE, 100.0, 200.0),  # hidden by the GEMM
        (ALLREDUCE, 400.0, 500.0),  # nothing else runs
    ]
    o = Overlap.of(activities, steps=2)
    assert o.communication_ms == pytest.approx(0.1)
    assert o.overlapped_ms == pytest.approx(0.05) and o.exposed_ms == pytest.approx(0.05)
    assert o.busy_ms == pytest.approx(0.2)  # 400 us of 2 steps: the GEMM, the lone all-reduce


def test_partial_overlap_and_concurrent_collectives_count_once():
    """Two collectives at once count their union; a memcpy is computation; any stream."""
    activities = [
        (ALLREDUCE, 0.0, 100.0),
        ("ncclKernel_ReduceScatter", 50.0, 150.0),
        ("Memcpy DtoD (Device -> Device)", 120.0, 400.0),
    ]
    o = Overlap.of(activities, steps=1)
    assert o.communication_ms == pytest.approx(0.15)
    assert o.overlapped_ms == pytest.approx(0.03) and o.exposed_ms == pytest.approx(0.12)
    assert o.busy_ms == pytest.approx(0.4)


def test_without_collectives_nothing_is_communication():
    o = Overlap.of([("triton_poi_fused_add", 0.0, 10.0)], steps=1)
    assert (o.communication_ms, o.overlapped_ms, o.exposed_ms) == (0.0, 0.0, 0.0)
    assert o.busy_ms == pytest.approx(0.01)


@pytest.mark.parametrize(
    "left, right, expected",
    [
        ([(0, 10)], [(5, 15)], [(5, 10)]),
        ([(0, 2), (4, 6)], [(1, 5)], [(1, 2), (4, 5)]),
        ([(0, 1)], [(1, 2)], []),
    ],
)
def test_intersection(left, right, expected):
    assert intersection(left, right) == expected


def test_merged_joins_overlapping_and_touching_intervals():
    assert merged([(5, 6), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 6)]


def test_a_reversed_interval_adds_nothing():
    """An event that ended before the window it is clipped to (start > end) counts 0, not less."""
    assert merged([(10, 4), (0, 2)]) == [(0, 2)]


def test_of_profile_counts_only_the_device_s_work():
    """torch.profiler's events: host ops, a user annotation's device-side range and the launch
    back-pressure span are not device work."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name, device_type, start, end, annotation=False):
        span = SimpleNamespace(start=start, end=end)
        return SimpleNamespace(
            name=name, device_type=device_type, time_range=span, is_user_annotation=annotation
        )

    events = [
        event("aten::mm", DeviceType.CPU, 0.0, 1000.0),
        event("sm90_xmma_gemm_bf16", DeviceType.CUDA, 0.0, 300.0),
        event(ALLREDUCE, DeviceType.CUDA, 400.0, 500.0),
        event("step", DeviceType.CUDA, 0.0, 1000.0, annotation=True),
        event("Command Buffer Full", DeviceType.CUDA, 500.0, 900.0),
    ]
    o = Overlap.of_profile(events, steps=1)
    assert o.busy_ms == pytest.approx(0.4) and o.exposed_ms == pytest.approx(0.1)
