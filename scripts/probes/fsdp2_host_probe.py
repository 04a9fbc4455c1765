"""Where a 1-GPU multi-GPU variant's host time goes (a step whose wall time is well above its
device's busy time, NOTES.md): one process of world size 1, without torchrun (the probe names itself
rank 0 of 1 on a free loopback port), the variant's step built and wrapped as a rank of the
multigpu suite builds it (``optbench.suite.distributed``), warmed up, then PROFILE_STEPS steps under
torch.profiler with CPU and CUDA activity. One JSON line: wall ms per step, device busy ms per step
(``optbench.measure.overlap``), and the ops with the most self CPU time per step; kept beside the
session's consoles, as those of ``results/h200/probes-2026-11-29i/``. On a GPU::

    python3 scripts/probes/fsdp2_host_probe.py [VARIANT [distributed.py options]]

(default fsdp2-best); a dry run on a CPU (gloo, the tiny model)::

    TRITON_INTERPRET=1 python scripts/probes/fsdp2_host_probe.py fsdp2 --size tiny --device cpu \\
        --precision fp32 --batch-size 2 --seq-len 64
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

PROFILE_STEPS, WARMUP_STEPS, TOP_OPS = 5, 5, 15


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from optbench.measure.overlap import Overlap
    from optbench.suite import distributed

    argv = sys.argv[1:] or ["fsdp2-best"]
    args = distributed.parse(["--variant", argv[0], *argv[1:]])
    os.environ.update(
        RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
    )
    device, _ = distributed._join(args.device, args.backend)
    wrapper, step_variant = distributed.DISTRIBUTED_VARIANTS[args.variant]
    _, _, step, _ = distributed._built(args, device, wrapper, step_variant)
    cuda = device.type == "cuda"
    for _ in range(WARMUP_STEPS):  # torch.compile's compiles, the allocator's first blocks
        step()
    if cuda:
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(PROFILE_STEPS):
            step()
        if cuda:
            torch.cuda.synchronize(device)
        wall_ms = (time.perf_counter() - started) * 1e3 / PROFILE_STEPS
    busy = Overlap.of_profile(prof.events(), PROFILE_STEPS).busy_ms if cuda else None
    ops = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)
    print(
        json.dumps(
            {
                "variant": args.variant,
                "size": args.size,
                "device": str(device),
                "wall_ms_per_step": round(wall_ms, 2),
                "device_busy_ms_per_step": None if busy is None else round(busy, 2),
                "top_self_cpu_ms_per_step": {
                    a.key: round(a.self_cpu_time_total / 1e3 / PROFILE_STEPS, 3)
                    for a in ops[:TOP_OPS]
                },
                "calls_per_step": {a.key: a.count / PROFILE_STEPS for a in ops[:TOP_OPS]},
            }
        ),
        flush=True,
    )
    distributed._dist().destroy_process_group()


if __name__ == "__main__":
    main()
