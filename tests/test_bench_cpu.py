"""The CPU suite's own asv classes (benchmarks/bench_cpu.py): asv times them on one torch thread, by
that thread's CPU time, in several rounds (which ``asv continuous`` interleaves between its two
commits). tests/test_plain_asv.py runs them through ``asv continuous``."""

from __future__ import annotations

import time

import pytest
import torch

from benchmarks import bench_cpu


@pytest.mark.parametrize("cls", [bench_cpu.MLP, bench_cpu.GradStats], ids=lambda c: c.__name__)
def test_a_cpu_class_is_timed_on_one_torch_thread_by_its_cpu_time_in_rounds(cls):
    """Mutation: setup without torch.set_num_threads(1) (the class's calls then run on two)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cls().setup(cls.params[0][0])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert cls.timer is time.thread_time
    assert cls.rounds >= 2
