"""The FP8 matmul ceiling of this GPU, measured as the bf16 one is (``optbench.measure.roofline``'s
probe): an n x n x n ``torch._scaled_mm`` of e4m3 operands into bf16 with per-tensor scales (the
GEMM torchao's tensorwise float8 training runs) and with per-row scales (its rowwise recipe's), each
with and without fast accumulation (``use_fast_accum``: torchao's float8 forward GEMM uses it, its
two backward GEMMs do not), beside the bf16 matmul, timed by optbench's timer (cold-L2 device time,
random operands), each followed by the GPU's clock and power (``gpu_state``). Prints one JSON line
per size: device ms, IQR and TFLOP/s (2 n^3 FLOPs per call) of each. Needs FP8 tensor cores (sm89+).

    python3 scripts/probes/fp8_matmul_ceiling.py --n 8192 4096
"""

from __future__ import annotations

import argparse
import functools
import json
from typing import Any


def main() -> int:
    import torch

    from optbench.measure.machine import gpu_state
    from optbench.measure.roofline import matmul_probe
    from optbench.measure.timing import measure

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[8192])
    args = p.parse_args()
    for n in args.n:
        a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
        # column-major, as _scaled_mm needs
        b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        rows = torch.rand(n, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
        scaled = functools.partial(torch._scaled_mm, a, b, out_dtype=torch.bfloat16)
        calls = {
            f"fp8_{name}{'_fast' if fast else ''}": functools.partial(
                scaled, scale_a=sa, scale_b=sb, use_fast_accum=fast
            )
            for name, (sa, sb) in (("tensorwise", (one, one)), ("rowwise", rows))
            for fast in (False, True)
        }
        calls["bf16"] = matmul_probe("bf16", "cuda", n).fn
        timings, states = {}, {}
        for name, fn in calls.items():
            timings[name] = measure(fn, device="cuda", warmup_ms=100, rep_ms=500).device
            states[name] = gpu_state()
        flops = 2.0 * n**3
        line: dict[str, Any] = {"n": n}
        for name, t in timings.items():
            line.update(
                {
                    f"{name}_ms": t.median_ms,
                    f"{name}_iqr_ms": t.iqr_ms,
                    f"{name}_tflops": flops / t.median_ms / 1e9,
                    f"{name}_gpu": states[name],
                }
            )
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
