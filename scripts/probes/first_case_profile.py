"""Where a grid process's first cases spend their build and check: the seconds of importing torch,
CUDA's context and a first cuBLAS call, then cProfile's top functions (by cumulative seconds) while
the 100M eager step is built and checked (the steps process's first case: its high-precision
reference and the eager step's errors) and while a second variant is, or, with ``kernel``, while the
first kernel case of the other process is. ``step`` takes another size and variants too (each the
first case of its process: ``1B best-kernels`` is what each of ab's 1B processes builds). Run it in
a fresh process, on a GPU:

    python3 scripts/probes/first_case_profile.py [step|kernel] [top] [size variant...]
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time


def _top(profiler: cProfile.Profile, top: int) -> str:
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def _profiled(label: str, fn, top: int) -> None:
    import torch

    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    fn()
    torch.cuda.synchronize()
    profiler.disable()
    print(f"== {label}: {time.perf_counter() - started:.2f} s", flush=True)
    print(_top(profiler, top), flush=True)


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "step"
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    size = sys.argv[3] if len(sys.argv) > 3 else "100M"
    variants = sys.argv[4:] or ["eager", "triton-norm"]
    started = time.perf_counter()
    import torch

    print(f"== import torch: {time.perf_counter() - started:.2f} s", flush=True)
    started = time.perf_counter()
    torch.cuda.init()
    a = torch.randn(1024, 1024, device="cuda")
    (a @ a).sum().item()
    print(f"== CUDA context and a first matmul: {time.perf_counter() - started:.2f} s", flush=True)

    from optbench.suite.workloads import kernel_work, step_work

    if mode == "step":
        for variant in variants:
            _profiled(
                f"step {size} {variant}: build and check",
                lambda v=variant: step_work(size, v, "cuda").check(),
                top,
            )
    else:
        _profiled(
            "kernel add_rmsnorm 8192x2048 eager: build and check",
            lambda: kernel_work("add_rmsnorm", "8192x2048", "eager", "cuda").check(),
            top,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
