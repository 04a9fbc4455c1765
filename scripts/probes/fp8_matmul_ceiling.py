"""The FP8 matmul ceiling of this GPU, measured as the bf16 one is (``optbench.core.roofline``'s probe): an n x n x n
``torch._scaled_mm`` of e4m3 operands into bf16 with per-tensor scales (the GEMM torchao's tensorwise float8
training runs) and with per-row scales (its rowwise recipe's), beside the bf16 matmul, timed by optbench's timer
(cold-L2 device time, random operands). Prints one JSON line per size: device ms and TFLOP/s (2 n^3 FLOPs per
call) of each. Needs FP8 tensor cores (sm89+).

    python3 scripts/probes/fp8_matmul_ceiling.py --n 8192 4096
"""

from __future__ import annotations

import argparse
import functools
import json


def main() -> int:
    import torch

    from optbench.core.roofline import matmul_probe
    from optbench.core.timing import measure

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[8192])
    args = p.parse_args()
    for n in args.n:
        a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
        one = torch.ones((), device="cuda")
        rows = torch.rand(n, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
        scaled = functools.partial(torch._scaled_mm, a, b, out_dtype=torch.bfloat16)
        timings = {
            "fp8_tensorwise": measure(functools.partial(scaled, scale_a=one, scale_b=one), device="cuda",
                                      warmup_ms=100, rep_ms=500).device,
            "fp8_rowwise": measure(functools.partial(scaled, scale_a=rows[0], scale_b=rows[1]), device="cuda",
                                   warmup_ms=100, rep_ms=500).device,
            "bf16": measure(matmul_probe("bf16", "cuda", n).fn, device="cuda", warmup_ms=100, rep_ms=500).device,
        }
        flops = 2.0 * n**3
        line: dict[str, float] = {"n": n}
        for name, t in timings.items():
            line.update({f"{name}_ms": t.median_ms, f"{name}_iqr_ms": t.iqr_ms,
                         f"{name}_tflops": flops / t.median_ms / 1e9})
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
