"""Can a tensorwise FP8 cast run at the copy rate? The 1B FP8 step's casts took 17.49 ms a step, 2x
their floor, one transposed cast of inductor's at 3.34 ms of it (NOTES.md, session 26). Here, at the
1B step's shapes, the cast an FP8 GEMM's operand needs in both layouts (row-major for one GEMM, its
transpose for the other: cuBLAS's FP8 GEMMs on Hopper take only the TN layout), per-tensor scaled as
torchao's tensorwise recipe scales it (``scale = 448 / amax``, the product clamped to +-448, then
rounded to e4m3):

- ``eager``: torch's ops, the reference;
- ``compile``: the same function under torch.compile, as inductor fuses it inside the FP8 step;
- ``triton BMxBN Ww``: two kernels of this probe: the amax (one read), then one pass that reads a
  tile and writes it in both layouts (the transposed tile through shared memory), at each of
  :data:`TILES`.

Each is checked bit for bit against eager, then its device time taken (CUDA-graph replays, every
tensor larger than the L2). The floor: 6 bytes an element (the amax's read of 2, the cast's read of
2, the two fp8 writes of 1) at the copy ceiling. One JSON line per shape and implementation. On a
GPU: ``python3 -m scripts.probes.fp8_cast_probe``; ``--cpu`` checks the Triton kernels in Triton's
interpreter (TRITON_INTERPRET=1) on a small tensor whose scaled values e4m3 holds exactly (the
interpreter's fp8 rounding loses the carry into the exponent: 127.4 becomes 64, not 128).
"""

from __future__ import annotations

import functools
import json
import sys

import torch
import triton
import triton.language as tl

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-12  # torchao's EPS: an all-zero tensor keeps a finite scale
# The 1B step's FP8 operands (8,192 tokens): a block's input, the MLP's hidden (the down
# projection's input) and the packed gate/up gradient.
SHAPES = [(8192, 2048), (8192, 5632), (8192, 11264)]
# the cast pass's tiles (rows x columns) and warps: the transposed write goes through shared memory
TILES = [(64, 64, 4), (64, 128, 4), (128, 64, 8), (128, 128, 8)]


def scale_of(amax: torch.Tensor) -> torch.Tensor:
    return E4M3_MAX / amax.float().clamp(min=AMAX_FLOOR)


def cast_eager(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = scale_of(x.abs().amax())
    y = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return y, y.t().contiguous()


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.atomic_max(amax_ptr, tl.max(tl.abs(x), axis=0))  # |x| >= 0: float max as integer max


@triton.jit
def _cast_both_kernel(x_ptr, scale_ptr, y_ptr, yt_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    x = tl.load(x_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(tl.float32)
    y = tl.clamp(x * tl.load(scale_ptr), -448.0, 448.0).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], y, mask=mask)
    tl.store(yt_ptr + rn[:, None] * M + rm[None, :], tl.trans(y), mask=tl.trans(mask))


def cast_triton(
    x: torch.Tensor, bm: int = 64, bn: int = 64, warps: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = x.shape
    amax = torch.zeros(1, device=x.device, dtype=torch.float32)
    block = 8192
    _amax_kernel[(triton.cdiv(m * n, block),)](x, amax, m * n, BLOCK=block)
    scale = scale_of(amax)
    y = torch.empty(m, n, device=x.device, dtype=E4M3)
    yt = torch.empty(n, m, device=x.device, dtype=E4M3)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _cast_both_kernel[grid](x, scale, y, yt, m, n, BM=bm, BN=bn, num_warps=warps)
    return y, yt


def mismatches(got: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> int:
    """Elements whose fp8 bits differ, over both layouts."""
    return sum(int((g.view(torch.uint8) != r.view(torch.uint8)).sum()) for g, r in zip(got, ref))


def exact_input(m: int, n: int) -> torch.Tensor:
    """bf16 values e4m3 holds exactly, within +-112 but for the last element, 224: amax 224, scale
    exactly 2, and every product exact (no rounding, which the interpreter gets wrong); a cast
    that skips the scale, divides by it or takes an amax that misses the tail (112: scale 4)
    writes other bits."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (m, n), generator=gen, dtype=torch.uint8)
    x = codes.view(E4M3).float().nan_to_num(0.0).clamp(-112.0, 112.0)
    x[-1, -1] = 224.0
    return x.to(torch.bfloat16)


def cpu_check() -> None:
    x = exact_input(200, 136)  # not a multiple of any tile: the masks
    ref = cast_eager(x)
    for bm, bn, warps in TILES:
        got = cast_triton(x, bm, bn, warps)
        print(
            json.dumps(
                {"shape": list(x.shape), "tile": [bm, bn], "mismatches": mismatches(got, ref)}
            )
        )


def gpu_run() -> None:
    from optbench.measure.timing import measure

    impls = {
        "eager": cast_eager,
        **{
            f"triton {bm}x{bn} {warps}w": functools.partial(cast_triton, bm=bm, bn=bn, warps=warps)
            for bm, bn, warps in TILES
        },
        "compile": torch.compile(cast_eager),
    }
    for m, n in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16)
        ref = cast_eager(x)
        for name, fn in impls.items():
            wrong = mismatches(fn(x), ref)
            timing = measure(lambda fn=fn, x=x: fn(x), device="cuda", rep_ms=300).to_dict()
            ms = timing["device"]["median_ms"]
            print(
                json.dumps(
                    {
                        "shape": [m, n],
                        "impl": name,
                        "mismatches": wrong,
                        "device_ms": round(ms, 4),
                        "iqr_ms": round(timing["device"]["iqr_ms"], 4),
                        "floor_bytes": 6 * m * n,
                        "gb_per_s_at_floor_bytes": round(6 * m * n / ms / 1e6, 1),
                    }
                ),
                flush=True,
            )


def main(argv: list[str]) -> None:
    cpu_check() if "--cpu" in argv else gpu_run()


if __name__ == "__main__":
    main(sys.argv[1:])
