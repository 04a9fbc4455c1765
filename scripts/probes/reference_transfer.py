"""Probe (CUDA): the seconds a 1B check's reference spends crossing to the host and back.

The check's high-precision reference (fp32 gradients and weights of every parameter, 8.8 GB at 1B)
is kept on the host while the candidate runs, then compared with the candidate's on the GPU in
float64 (``kernels.numerics.rel_err``), once for the eager step and once for the candidate. This
times each way of doing that over tensors of the 1B model's parameter shapes: to pageable memory
(one copy per tensor, as ``Reference.copy_to`` does) or to pinned memory, and back converted to
float64 on the host (``.to(device, float64)``) or on the GPU (``.to(device).double()``).

    python3 -m scripts.probes.reference_transfer [size]
"""

from __future__ import annotations

import sys
import time

import torch

from models.config import CONFIGS
from models.model import Decoder


def timed(label: str, fn):
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    print(f"{label}: {time.perf_counter() - started:.2f} s", flush=True)
    return out


def main(size: str) -> None:
    with torch.device("meta"):
        shapes = [p.shape for p in Decoder(CONFIGS[size]).parameters()]
    device = [torch.randn(s, device="cuda") for s in shapes * 2]  # gradients and weights
    gb = sum(t.numel() * 4 for t in device) / 1e9
    print(f"{len(device)} tensors, {gb:.2f} GB fp32", flush=True)
    for round_ in range(2):
        pageable = timed(
            f"[{round_}] to pageable, per tensor", lambda: [t.to("cpu", copy=True) for t in device]
        )
        pinned = timed(
            f"[{round_}] to pinned, per tensor",
            lambda: [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t) for t in device],
        )
        for name, host in (("pageable", pageable), ("pinned", pinned)):
            timed(
                f"[{round_}] back from {name}, float64 on the host",
                lambda h=host: [x.to("cuda", torch.float64) for x in h],
            )
            timed(
                f"[{round_}] back from {name}, float64 on the GPU",
                lambda h=host: [x.to("cuda").double() for x in h],
            )
            timed(
                f"[{round_}] back from {name}, non_blocking, float64 on the GPU",
                lambda h=host: [x.to("cuda", non_blocking=True).double() for x in h],
            )
        del pageable, pinned


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "1B")
