"""The CPU suite: what a machine without a GPU measures, in about a minute.

Wall-clock seconds per call, timed by asv itself with optbench's synchronizing timer. torch is
imported in ``setup``, not at the top: asv imports every benchmark module to list them, and stays
torch-free doing so.
"""

from __future__ import annotations

from functools import cache

from .common import sync_clock


class _CPUTimed:
    timer = staticmethod(sync_clock)
    rounds = 1
    repeat = (3, 10, 5.0)
    warmup_time = 0.5
    version = 1


@cache
def _mlp_step(impl: str):
    """Forward + backward of a 2-layer MLP on a (256, 512) batch, eager or torch.compile'd (built
    once)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)
    )
    x = torch.randn(256, 512, generator=gen)
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

    def setup(self, impl):
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

    def setup(self, impl):
        from kernels import grad_stats

        self.params_ = _params_with_grads(300)
        self.fn = grad_stats.grad_stats_loop if impl == "loop" else grad_stats.grad_stats_foreach

    def time_grad_stats(self, impl):
        self.fn(self.params_)
