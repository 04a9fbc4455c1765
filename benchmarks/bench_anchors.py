"""Anchors: the training step as users of other stacks run it, timed as ours is
(optbench.suite.anchors).

Per size: wall-clock ms per optimizer step of transformers' LlamaForCausalLM under torch.compile
with fused AdamW and bf16 autocast (``optbench.suite.anchors.HF_SETUP``), device ms per step, ms per
forward+loss, and peak device memory (MiB). The report's "x HF" divides its median step by our
fastest variant's, from one run. Each case is checked to train (finite loss near ln(vocab) at init,
falling over steps on one batch, every parameter updated) before it is timed.
"""

from __future__ import annotations

from .common import Grid, _StepMetrics, grid


class HFCompileStep(_StepMetrics, Grid):
    """HF Llama + torch.compile at our 100M/500M/1B shapes, B and S of our step's baseline on the
    machine."""

    params = grid(__module__, __qualname__)
    param_names = ["size"]
    version = 1
