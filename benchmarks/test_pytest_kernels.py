"""The kernel benchmarks under pytest-benchmark: the same work as bench_kernels
(optbench.suite.workloads).

    pytest benchmarks/test_pytest_kernels.py --benchmark-only \
        --benchmark-storage=results/<machine>/pytest-benchmark --benchmark-autosave
    pytest ... --benchmark-compare --benchmark-compare-fail=median:5%

pytest-benchmark's own figures are synchronized wall time per fwd+bwd call (optbench's
``sync_clock`` as its timer, so it never measures only the launch); ``extra_info`` holds optbench's
device time (CUDA-graph replay), achieved GB/s and TFLOP/s and the ratio to the roofline floor.
``OPTBENCH_SUITE=quick`` measures one shape per op. Each case is checked before it is timed. A saved
run is named after the commit whose code it measures and is dirty only where code differs from it
(benchmarks/conftest.py), as optbench's own results are.
"""

from __future__ import annotations

import pytest

from optbench.store.settings import current
from optbench.suite import catalog

from .common import sync_clock

# The kernel cases of the run's suite (the full grid outside the quick suite), as the asv classes
# measure them.
SUITE = "quick" if current().suite == "quick" else "full"
CASES = [
    (b.op, case["shape"], case["impl"])
    for b in catalog.BENCHMARKS.values()
    if b.kind == "kernel"
    for case in b.cases(SUITE)
]


@pytest.mark.parametrize(("op", "shape", "impl"), CASES, ids=["/".join(c) for c in CASES])
@pytest.mark.benchmark(timer=sync_clock, group="kernels")
def test_kernel(benchmark, op: str, shape: str, impl: str) -> None:
    import torch

    from optbench.measure.hardware import detect
    from optbench.measure.roofline import Ceilings, roofline
    from optbench.measure.timing import measure
    from optbench.suite.workloads import kernel_work

    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        work = kernel_work(op, shape, impl, device)
    except NotImplementedError as exc:
        pytest.skip(str(exc))
    metric = list(work.timed)[-1]  # fwd+bwd where the op has a backward
    fn = work.timed[metric]
    benchmark.extra_info["check"] = work.check()
    # cold L2, as optbench's
    device_ms = measure(work.rotation.get(metric, fn), device=device).device.median_ms
    r = roofline(
        work.flops[metric],
        work.bytes[metric],
        device_ms,
        Ceilings.from_profile(detect()),
        "fp32" if op == "grad_stats" else "bf16",
    )
    benchmark.extra_info.update(
        metric=metric,
        device_ms=device_ms,
        gbps=r.achieved_gbps,
        tflops=r.achieved_tflops,
        floor_ms=r.floor_ms,
        floor_ratio=r.floor_ratio,
    )
    benchmark.pedantic(fn, warmup_rounds=3, rounds=20, iterations=5)
