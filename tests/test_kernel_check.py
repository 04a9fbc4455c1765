"""kernel_work's check on a CPU (its cases run on GPUs only): eager SwiGLU passes against itself,
and a kernel 1% off fails with WrongResult naming the case (a planted bug it must catch)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from optbench.run.runner import WrongResult
from optbench.suite import ops, plan, workloads


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(workloads, "require_cuda", lambda device, what: None)
    monkeypatch.setattr("optbench.measure.timing.l2_cache_bytes", lambda device: 50 * 2**20)
    monkeypatch.setattr(plan, "kernel_skip_reason", lambda *args: None)
    monkeypatch.setattr(plan, "kernel_dtype", lambda profile, op: torch.float32)


def test_the_kernel_check_passes_the_baseline_and_fails_a_kernel_1_percent_off(on_cpu, monkeypatch):
    op = ops.OPS["swiglu"]
    shape = next(iter(op.shapes))
    record = workloads.kernel_work("swiglu", shape, "eager", "cpu").check()
    assert record["max_rel_err"] <= record["tolerance"] and record["reference"] == "torch.float64"
    made, real = [], op.impl

    def first_one_off(impl, dims):  # the candidate is made first, then the baseline
        fn = real(impl, dims)
        made.append(impl)
        return (lambda *args: fn(*args) * 1.01) if len(made) == 1 else fn

    monkeypatch.setitem(ops.OPS, "swiglu", dataclasses.replace(op, impl=first_one_off))
    with pytest.raises(WrongResult, match=f"swiglu/eager at {shape}: rel. errors"):
        workloads.kernel_work("swiglu", shape, "eager", "cpu").check()
