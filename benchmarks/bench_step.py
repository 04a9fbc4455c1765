"""The training step per model size: the eager baseline, each optimization on alone (beside its reference,
where that is not eager), the best combinations; and per size the leave-one-out ablation of best-kernels.

Per variant: wall-clock ms per optimizer step (synchronized; host overhead such as per-step ``.item()``
or Python loops counts, as it does in training), device ms per step, ms per forward+loss, and peak
device memory (MiB). Tokens/s and MFU are derived at report time. Each variant is checked against its
reference before it is timed: same init and batch, 3 optimizer steps (loss, clipped gradients, gradient norm,
every weight) against a higher-precision step, within 2.5x of the eager step's own error (models.step).
"""

from __future__ import annotations

import os

from models.variants import STEP_VARIANTS

from .common import Grid, _StepMetrics

SUITE = os.environ.get("OPTBENCH_SUITE", "full")


class _Step(_StepMetrics, Grid):
    size = ""
    param_names = ["variant"]
    version = 2  # 2: steps timed after 2 s of steps, at the GPU's power-steady clock (optbench.workloads)

    def cases(self):
        from functools import partial

        from optbench.runner import Case
        from optbench.workloads import step_work

        from .common import device

        dev = device()
        return [Case({"variant": v}, partial(step_work, self.size, v, dev)) for v in self.params[0]]


class StepTiny(_Step):
    """The tiny config (B=2, S=128) on any device: the switches a CPU can run."""

    size = "tiny"
    params = [STEP_VARIANTS["tiny"]]

    def setup_cache(self):
        return self.measure_grid()


class Step100M(_Step):
    size = "100M"
    params = [STEP_VARIANTS["100M" if SUITE != "quick" else "quick"]]

    def setup_cache(self):
        return self.measure_grid()


class Step500M(_Step):
    size = "500M"
    params = [STEP_VARIANTS["500M"]]

    def setup_cache(self):
        return self.measure_grid()


class Step1B(_Step):
    size = "1B"
    params = [STEP_VARIANTS["1B"]]

    def setup_cache(self):
        return self.measure_grid()


class _Ablation(_Step):
    """best-kernels, best-kernels with each of its switches left out in turn (models.variants.ABLATION), and
    eager, in one run: what each switch is worth inside the best step. Not in the quick or full suite."""

    params = [STEP_VARIANTS["ablation"]]


class Ablation100M(_Ablation):
    size = "100M"

    def setup_cache(self):
        return self.measure_grid()


class Ablation500M(_Ablation):
    size = "500M"

    def setup_cache(self):
        return self.measure_grid()


class Ablation1B(_Ablation):
    size = "1B"

    def setup_cache(self):
        return self.measure_grid()
