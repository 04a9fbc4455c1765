"""Can a tensorwise FP8 cast run at the copy rate? The 1B FP8 step's casts took 17.49 ms a step, 2x
their floor, one transposed cast of inductor's at 3.34 ms of it (NOTES.md, session 26). Here, at the
1B step's shapes, the cast an FP8 GEMM's operand needs in both layouts (kernels/fp8_linear.py says
why), as torchao's tensorwise recipe scales it:

- ``eager``: torch's ops (``kernels.fp8_linear.cast_both_eager``), the reference;
- ``compile``: the same function under torch.compile, as inductor fuses it inside the FP8 step;
- ``triton BMxBN Ww``: ``kernels.fp8_linear.cast_both_triton`` at each of :data:`TILES`.

Each is checked bit for bit against eager, then its device time taken (CUDA-graph replays of one
input, as a step casts it: the smallest, 34 MB, fits an H200's 50 MB L2, so its cast may read part
of it from the L2 after the amax pass; the two wider ones, 92 and 185 MB, do not). The floor: 6
bytes an element (the amax's read of 2, the cast's read of 2, the two fp8 writes of 1) at the copy
ceiling. One JSON line per shape and implementation. On a
GPU: ``python3 -m scripts.probes.fp8_cast_probe``.
"""

from __future__ import annotations

import functools
import json

import torch

from kernels.fp8_linear import cast_both_eager, cast_both_triton
from kernels.numerics import bit_mismatches
from optbench.measure.timing import measure

# The 1B step's FP8 operands (8,192 tokens): a block's input, the MLP's hidden (the down
# projection's input) and the packed gate/up gradient.
SHAPES = [(8192, 2048), (8192, 5632), (8192, 11264)]
TILES = [(64, 64, 4), (64, 128, 4), (128, 64, 8), (128, 128, 8)]  # rows x columns, warps


def main() -> None:
    impls = {
        "eager": cast_both_eager,
        **{
            f"triton {bm}x{bn} {warps}w": functools.partial(cast_both_triton, tile=(bm, bn, warps))
            for bm, bn, warps in TILES
        },
        "compile": torch.compile(cast_both_eager),
    }
    for m, n in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16)
        for fmt in ("e4m3", "e5m2"):
            ref = cast_both_eager(x, fmt)
            for name, fn in impls.items():
                wrong = bit_mismatches(fn(x, fmt), ref)
                timing = measure(
                    lambda fn=fn, x=x, fmt=fmt: fn(x, fmt), device="cuda", rep_ms=300
                ).to_dict()
                ms = timing["device"]["median_ms"]
                line = {
                    "shape": [m, n],
                    "format": fmt,
                    "impl": name,
                    "mismatches": wrong,
                    "device_ms": round(ms, 4),
                    "iqr_ms": round(timing["device"]["iqr_ms"], 4),
                    "floor_bytes": 6 * m * n,
                    "gb_per_s_at_floor_bytes": round(6 * m * n / ms / 1e6, 1),
                }
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
