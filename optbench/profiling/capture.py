"""Running torch.profiler on a training step: the capture that every figure of a report is read
from, the step's tensor bytes and, on CUDA, a memory snapshot of one more step."""

from __future__ import annotations

import dataclasses
import gzip
import pickle
from collections.abc import Iterable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from models.step import TrainStep


@dataclasses.dataclass
class Capture:
    """A finished profile, with the bytes allocated on the device right after it."""

    prof: profile
    end_bytes: int
    allocator_peak: int | None  # CUDA: max_memory_allocated over the profiled steps


def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors' elements."""
    return sum(t.numel() * t.element_size() for t in tensors)


def step_tensors(step: TrainStep) -> dict[str, int]:
    """Bytes of the step's weights, gradients and optimizer state (AdamW's step counters included,
    host scalars unless the optimizer is capturable or fused)."""
    state = [
        v for s in step.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    ]
    return {
        "weights_bytes": nbytes(step.params),
        "gradients_bytes": nbytes(p.grad for p in step.params if p.grad is not None),
        "optimizer_state_bytes": nbytes(state),
    }


def allocated_bytes(step: TrainStep) -> int:
    """Bytes allocated on the step's device now: the CUDA allocator's count; on a CPU the step's own
    tensors (weights, gradients, optimizer state, buffers, batch), as the host allocator keeps no
    total."""
    if step.device.type == "cuda":
        return torch.cuda.memory_allocated(step.device)
    return (
        sum(step_tensors(step).values())
        + nbytes(step.model.buffers())
        + nbytes((step.idx, step.targets))
    )


def capture(step: TrainStep, steps: int, warmup: int) -> Capture:
    """Run ``warmup`` steps, the last one under the profiler's warm-up, then profile ``steps``
    steps. On CUDA the device finishes the kernels queued before (the build's, the warm-up's)
    before the profiled window opens, and the profiler synchronizes it before it stops: the window
    holds the kernels of ``steps`` steps, no more. (A host that runs ahead of the device leaves the
    last warm-up step's kernels queued when the window opens, and they would count as the
    window's.)"""
    cuda = step.device.type == "cuda"
    wait, warm = max(warmup - 1, 0), min(warmup, 1)
    if cuda:  # with no warm-up step, the window opens with the first step: nothing queued before
        torch.cuda.synchronize(step.device)
    with profile(
        activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])],
        schedule=schedule(wait=wait, warmup=warm, active=steps, repeat=1),
        record_shapes=False,
        profile_memory=True,
        with_stack=False,
    ) as prof:
        for i in range(wait + warm + steps):
            if cuda and i == wait + warm:
                torch.cuda.reset_peak_memory_stats(step.device)
            step()
            if cuda and i == wait + warm - 1:  # this prof.step() opens the profiled window
                torch.cuda.synchronize(step.device)
            prof.step()
    peak = torch.cuda.max_memory_allocated(step.device) if cuda else None
    return Capture(prof, allocated_bytes(step), peak)


SNAPSHOT = "memory_snapshot.pickle.gz"  # a report's allocator snapshot (dump_memory_snapshot)


def dump_memory_snapshot(step: TrainStep, path: Path) -> None:
    """One more step under the CUDA allocator's history (Python stacks of allocations), saved to
    ``path`` as ``torch.cuda.memory._dump_snapshot`` pickles it, gzipped (a 1B step's is 1.2 MB
    and 16x smaller so; pytorch.org/memory_viz takes it unzipped)."""
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python")
    try:
        step()
        torch.cuda.synchronize(step.device)
        with gzip.open(path, "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
