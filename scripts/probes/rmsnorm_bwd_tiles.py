"""Probe (CUDA): the add-RMSNorm backward (``kernels.rmsnorm.add_rms_norm_bwd``, as the best steps
call it: residual h and its gradient fp32, the norm's output gradient bf16) at each register
tile (``ADD_BWD_TILE`` elements, ``ADD_BWD_THREAD_BYTES`` of h per thread) on 8192 rows of each
model size's width, against its floor: 16 bytes an element (reads dout 2, h 4, dh 4; writes dx 4,
dy 2) at the copy ceiling PROBE_COPY_GBPS (default 4268, an H200's: the device's H200.md).

Each tile's dx and dy are compared with the shipped tile's (max abs difference: the row
reductions' order moves with the layout) and its dW with an fp64 reference's. Device ms from
``optbench.measure.timing.measure`` (CUDA-graph replays, inputs out of L2). One JSON line per width
and tile.

Run from the repository root: ``python3 -m scripts.probes.rmsnorm_bwd_tiles``.
"""

from __future__ import annotations

import itertools
import json
import os

import torch

import kernels.rmsnorm as rms
from optbench.measure.timing import measure, rotation_sets

DEVICE = os.environ.get("PROBE_DEVICE", "cuda")  # cpu: a smoke run under TRITON_INTERPRET=1
ROWS = int(os.environ.get("PROBE_ROWS", "8192"))
WIDTHS = tuple(int(w) for w in os.environ.get("PROBE_WIDTHS", "768,1536,2048").split(","))
TILES = (2048, 4096, 8192, 16384)
THREAD_BYTES = (16, 32, 64, 128)
COPY_GBPS = float(os.environ.get("PROBE_COPY_GBPS", "4268"))


def inputs(width: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    def randn(dtype: torch.dtype, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=DEVICE).to(dtype)

    h = randn(torch.float32, ROWS, width)
    rstd = torch.rsqrt(h.pow(2).mean(-1) + 1e-6)
    return (
        randn(torch.bfloat16, ROWS, width),
        randn(torch.float32, ROWS, width),
        h,
        (1 + 0.1 * randn(torch.float32, width)),
        rstd,
    )


def run(args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    dout, dh, h, w, rstd = args
    return rms.add_rms_norm_bwd(dout, dh, h, w, rstd, torch.bfloat16, True)


def main() -> None:
    shipped = rms.ADD_BWD_TILE, rms.ADD_BWD_THREAD_BYTES
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if DEVICE == "cuda" else 0
    for width in WIDTHS:
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        floor_ms = 16 * ROWS * width / COPY_GBPS / 1e6
        n_sets = rotation_sets(16 * ROWS * width, l2)
        sets = [inputs(width, gen) for _ in range(n_sets)]
        dout, _, h, _, rstd = sets[0]
        dw_ref = (dout.double() * (h.double() * rstd.double()[:, None])).sum(0)
        rms.ADD_BWD_TILE, rms.ADD_BWD_THREAD_BYTES = shipped
        dx0, dy0, _ = run(sets[0])
        for tile, thread_bytes in itertools.product(TILES, THREAD_BYTES):
            rms.ADD_BWD_TILE, rms.ADD_BWD_THREAD_BYTES = tile, thread_bytes
            block_m, _, warps = rms.bwd_tile(ROWS, width, h, residual=True)
            row = {"width": width, "tile": tile, "thread_bytes": thread_bytes}
            row |= {"block_m": block_m, "warps": warps, "shipped": (tile, thread_bytes) == shipped}
            try:
                dx, dy, dw = run(sets[0])
                m = measure([lambda a=a: run(a) for a in sets], device=DEVICE)
            except Exception as exc:  # a tile the compiler or the GPU refuses: say so, go on
                print(json.dumps(row | {"error": f"{type(exc).__name__}: {exc}"[:200]}))
                continue
            timing = m.device or m.wall  # a CPU has no device clock
            ms = timing.median_ms
            row |= {
                "device_ms": round(ms, 4),
                "q25_q75_ms": [round(timing.q25_ms, 4), round(timing.q75_ms, 4)],
                "x_floor": round(ms / floor_ms, 3),
                "dx_vs_shipped": float((dx - dx0).abs().max()),
                "dy_vs_shipped": float((dy.float() - dy0.float()).abs().max()),
                "dw_rel_err": float((dw.double() - dw_ref).abs().max() / dw_ref.abs().max()),
            }
            print(json.dumps(row), flush=True)
    rms.ADD_BWD_TILE, rms.ADD_BWD_THREAD_BYTES = shipped


if __name__ == "__main__":
    main()
