"""The training step per model size: the eager baseline, each optimization on alone (beside its
reference, where that is not eager), the best combinations; and per size the leave-one-out ablation
of best-kernels.

Per variant: wall-clock ms per optimizer step (synchronized; host overhead such as per-step
``.item()`` or Python loops counts, as it does in training), device ms per step, ms per
forward+loss, and peak device memory (MiB). Tokens/s and MFU are derived at report time. Each
variant is checked against its reference before it is timed: same init and batch, 3 optimizer steps
(loss, clipped gradients, gradient norm, every weight) against a higher-precision step, within 2.5x
of the eager step's own error (models.step).
"""

from __future__ import annotations

from .common import StepGrid, grid


class StepTiny(StepGrid):
    """The tiny config (B=2, S=128) on any device: the switches a CPU can run."""

    params = grid(__module__, __qualname__)
    # 3: on a CPU, one torch thread, timed by its CPU time (optbench.suite.workloads.step_timing)
    version = 3


class Step100M(StepGrid):
    params = grid(__module__, __qualname__)


class Step500M(StepGrid):
    params = grid(__module__, __qualname__)


class Step1B(StepGrid):
    params = grid(__module__, __qualname__)


# The leave-one-out ablations: best-kernels, best-kernels with each of its switches left out in turn
# (models.variants.ABLATION), and eager, in one run: what each switch is worth inside the best step.
class Ablation100M(StepGrid):
    params = grid(__module__, __qualname__)


class Ablation500M(StepGrid):
    params = grid(__module__, __qualname__)


class Ablation1B(StepGrid):
    params = grid(__module__, __qualname__)
