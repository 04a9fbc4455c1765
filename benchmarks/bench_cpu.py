"""The CPU suite's own classes: what a machine without a GPU measures beside the tiny step.

Seconds per call, timed by asv itself, on one torch thread (as optbench times what runs on a CPU,
``optbench.measure.timing.one_thread``), by that thread's CPU time (asv's ``timer``): on a CPU other
processes share, the wall time of a call measures how often the scheduler took its core away (a
call read 2x slower at random), its CPU time the call. Each benchmark runs in :data:`ROUNDS`
processes, which ``asv continuous`` interleaves between the two commits and pools (one process's
CPU times sit apart from another's on the same code: NOTES.md, asv as its users type it). torch is
imported in ``setup``, not at the top: asv imports every benchmark module to list them, and stays
torch-free doing so.
"""

from __future__ import annotations

import abc
import time
from functools import cache

from .common import Selected

ROUNDS = 4


class _CPUTimed(Selected, abc.ABC):
    timer = staticmethod(time.thread_time)
    rounds = ROUNDS
    repeat = (3, 10, 5.0)
    warmup_time = 0.5
    version = 2  # 2: one torch thread, its CPU time, 4 rounds

    def setup(self, impl: str) -> None:
        """torch on one thread in this benchmark process, then :meth:`prepare`."""
        import torch

        torch.set_num_threads(1)
        self.prepare(impl)

    @abc.abstractmethod
    def prepare(self, impl: str) -> None:
        """Builds what the timed method calls."""


@cache
def _mlp_step(impl: str):
    """Forward + backward of a 2-layer MLP on a (256, 512) batch, eager or torch.compile'd (built
    once)."""
    import torch

    with torch.random.fork_rng():  # a seeded init that leaves the process's generator as it was
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(
            torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)
        )
        x = torch.randn(256, 512)
    fwd = torch.compile(mlp) if impl == "compile" else mlp

    def step() -> None:
        mlp.zero_grad(set_to_none=True)
        fwd(x).square().mean().backward()

    step()  # compiles outside the timing
    return step


class MLP(_CPUTimed):
    """Small-MLP training step: eager vs torch.compile (inductor's C++ backend on a CPU)."""

    params = [["eager", "compile"]]
    param_names = ["impl"]

    def prepare(self, impl):
        self.step = _mlp_step(impl)

    def time_fwdbwd(self, impl):
        self.step()


@cache
def _params_with_grads(n: int) -> list:
    """``n`` small fp32 tensors of varied shapes, each with a gradient."""
    import torch

    gen = torch.Generator().manual_seed(0)
    params = []
    for i in range(n):
        p = torch.randn(7 + i % 13, 3 + i % 29, generator=gen)
        p.grad = torch.randn(p.shape, generator=gen)
        params.append(p)
    return params


class GradStats(_CPUTimed):
    """Gradient and parameter norms over 300 small tensors: a Python loop vs torch._foreach_norm."""

    params = [["loop", "foreach"]]
    param_names = ["impl"]

    def prepare(self, impl):
        from kernels import grad_stats

        self.params_ = _params_with_grads(300)
        self.fn = grad_stats.grad_stats_loop if impl == "loop" else grad_stats.grad_stats_foreach

    def time_grad_stats(self, impl):
        self.fn(self.params_)
