"""The 1B training step on several GPUs of one host, through PyTorch's own distributed stack:
torchrun launches one process per GPU, each wraps the step in DDP or FSDP2 (``fully_shard`` per
block, then the root), on the eager step or on 'best' (``optbench.suite.distributed``). Each case is
checked first (gradients equal to a single process's on the whole global batch), then every rank
times its steps; the record's figure is the slowest rank's wall ms per optimizer step (every rank's
timing is in its info, with tokens/s per GPU and the scaling efficiency against the 1-GPU case of
the same variant in the same run). The world size is a parameter of the record key: a 1-GPU and a
2-GPU figure are distinct metrics, never compared with each other. Cases for more GPUs than the
machine has skip. The multigpu suite only (``optbench run --suite multigpu``).
"""

from __future__ import annotations

from .common import Grid, _StepWall, grid


class DistributedStep1B(_StepWall, Grid):
    param_names = ["variant", "world_size"]
    params = grid(__module__, __qualname__)
