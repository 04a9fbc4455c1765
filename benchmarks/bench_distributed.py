"""The 1B training step on several GPUs of one host, through PyTorch's own distributed stack: torchrun launches
one process per GPU, each wraps the step in DDP or FSDP2 (``fully_shard`` per block, then the root), on the eager
step or on 'best' (``optbench.suite.distributed``). Each case is checked first (gradients equal to a single
process's on the whole global batch), then every rank times its steps; the record's figure is the slowest rank's
wall ms per optimizer step (every rank's timing is in its info, with tokens/s per GPU and the scaling efficiency
against the 1-GPU case of the same variant in the same run). The world size is a parameter of the record key: a
1-GPU and a 2-GPU figure are distinct metrics, never compared with each other. Cases for more GPUs than the
machine has skip. The multigpu suite only (``optbench run --suite multigpu``).
"""

from __future__ import annotations

from .common import Grid, _StepWall, grid


class DistributedStep1B(_StepWall, Grid):
    param_names = ["variant", "world_size"]
    params = grid(__module__, __qualname__)

    def cases(self):
        from functools import partial

        from optbench.core.runner import Case
        from optbench.suite.distributed import distributed_work

        from .common import device

        dev, one_gpu = device(), {}  # variant -> tokens/s at 1 GPU, as this run measures it
        return [Case({"variant": v, "world_size": n}, partial(distributed_work, "1B", v, int(n), dev, one_gpu))
                for v in self.params[0] for n in self.params[1]]

    def setup_cache(self):
        return self.measure_grid(distributed=True)
