"""The FP8 matmul ceiling of this GPU, measured as the bf16 one is (``optbench.core.roofline``'s probe): an n x n x n
``torch._scaled_mm`` of e4m3 operands with per-tensor scales into bf16 (the GEMM torchao's tensorwise float8
training runs), beside the bf16 matmul, timed by optbench's timer (cold-L2 device time). Prints one JSON line per
size: device ms and TFLOP/s (2 n^3 FLOPs per call) of each. Needs FP8 tensor cores (sm89+).

    python3 scripts/probes/fp8_matmul_ceiling.py --n 8192 4096
"""

from __future__ import annotations

import argparse
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
        fp8 = measure(lambda a=a, b=b, s=one: torch._scaled_mm(a, b, scale_a=s, scale_b=s, out_dtype=torch.bfloat16),
                      device="cuda", warmup_ms=100, rep_ms=500).device
        bf16 = measure(matmul_probe("bf16", "cuda", n).fn, device="cuda", warmup_ms=100, rep_ms=500).device
        flops = 2.0 * n**3
        print(json.dumps({"n": n, "fp8_ms": fp8.median_ms, "fp8_tflops": flops / fp8.median_ms / 1e9,
                          "bf16_ms": bf16.median_ms, "bf16_tflops": flops / bf16.median_ms / 1e9}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
