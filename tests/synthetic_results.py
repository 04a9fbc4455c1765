"""Synthetic optbench records for the compare and report tests: made-up test data, never
measurements.

Everything here is written into pytest's tmp_path stores only.
"""

from __future__ import annotations

import copy
import random
import statistics
from typing import Any

from optbench.store.records import CASE_METER
from optbench.store.store import MACHINE_KEY, ResultStore, record_key

H100 = "NVIDIA H100 80GB HBM3"
GPU = "GPU-00000000-0000-0000-0000-000000000001"  # the UUID of the synthetic runs' GPU


def commit(n: int) -> str:
    """A fake 40-hex commit hash, distinct per n."""
    return f"{n:x}".rjust(8, "f") * 5


def samples(median_ms: float, seed: int, n: int = 40, rel_sd: float = 0.01) -> list[float]:
    """n synthetic samples around median_ms with a relative standard deviation rel_sd."""
    rng = random.Random(seed)
    return [median_ms * (1 + rng.gauss(0, rel_sd)) for _ in range(n)]


def timing(values: list[float] | None, method: str = "cuda-graph") -> dict[str, Any] | None:
    """A Timing.to_dict()-shaped dict of values (None stays None)."""
    if values is None:
        return None
    q25, med, q75 = statistics.quantiles(values, n=4, method="inclusive")
    return {
        "samples_ms": values,
        "method": method,
        "median_ms": med,
        "q25_ms": q25,
        "q75_ms": q75,
        "iqr_ms": q75 - q25,
        "n": len(values),
    }


def record(
    benchmark: str,
    params: dict[str, str],
    *,
    status: str = "ok",
    times: dict[str, tuple[list[float] | None, list[float]]] | None = None,
    peak: dict[str, int] | None = None,
    memory: dict[str, int] | None = None,
    flops: dict[str, float] | None = None,
    bytes_: dict[str, float] | None = None,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One record; ``times`` maps a metric to (device samples or None, wall samples), ``peak`` to
    its per-call peak; ``memory`` is the case's own (records.CaseMemory's fields; the current
    meter's unless it names another)."""
    rec: dict[str, Any] = {
        "key": record_key(benchmark, params),
        "benchmark": benchmark,
        "params": params,
        "status": status,
        "seconds": 1.0,
    }
    if status != "ok":
        return {**rec, "reason": f"synthetic {status}"}
    metrics = {
        m: {"device": timing(d), "wall": timing(w, "perf-counter")}
        for m, (d, w) in (times or {}).items()
    }
    return {
        **rec,
        "metrics": metrics,
        "peak_mem_bytes": peak or {},
        **({"memory": {"meter": CASE_METER, **memory}} if memory else {}),
        "flops": flops or {},
        "bytes": bytes_ or {},
        "info": info or {},
        "check": {"max_rel_err": 0.0, "tolerance": 0.02},
    }


def save(
    store: ResultStore,
    machine: str,
    sha: str,
    date: str,
    records: list[dict[str, Any]],
    gpu_name: str | None = H100,
    profile: str | None = None,
    emulate: str | None = None,
    run_id: str | None = None,
    gpu_uuid: str | None = GPU,
    compile_cache: str | None = None,
    runs_at_once: int = 1,
    cpu: str | None = None,
    host_id: str | None = None,
    stamp: bool = False,
) -> None:
    """Store records (with their machine record) as one run (default id: ``run-<date>``) of one
    machine and commit; a run without ``gpu_name`` has no ``gpu_uuid``; ``cpu`` and ``host_id``,
    where given, go into its info as a run's machine record holds them; ``stamp``: every record,
    the machine record too, names the run (``run``), as the runner's do."""
    info = {
        **{k: v for k, v in (("cpu", cpu), ("host_id", host_id)) if v is not None},
        "gpu_name": gpu_name,
        "profile": profile or ("h100-sxm" if gpu_name else "cpu"),
        "emulate": emulate,
        "torch": "synthetic",
        "cuda": None,
        "gpu_uuid": gpu_uuid if gpu_name else None,
        "compile_cache": compile_cache,
        "runs_at_once": runs_at_once,
    }
    run = run_id or f"run-{date}"
    named = {"run": run} if stamp else {}
    full = [{**r, "commit": sha, "machine": machine, "date": date, **named} for r in records]
    store.save(
        machine,
        sha,
        [{"key": MACHINE_KEY, "info": info, "date": date, "commit": sha, **named}, *full],
        run_id=run,
    )


# time relative to eager
STEP_VARIANTS = {"eager": 1.0, "triton-norm": 0.95, "fused-ce": 0.9, "best": 0.7}
# size: (eager ms per step, tokens per step, FLOPs per step)
STEP_SIZES = {"100M": (100.0, 8192, 6 * 100e6 * 8192), "1B": (800.0, 8192, 6 * 1e9 * 8192)}
KERNEL_IMPLS = {
    "RMSNorm": ({"16384x768": 0.05, "16384x4096": 0.2}, {"eager": 1.0, "triton": 0.4}),
    "LinearCrossEntropy": ({"8192x768x32000": 3.0}, {"eager": 1.0, "liger": 0.8}),
    "GradStats": ({"100M": 1.5}, {"loop": 1.0, "foreach": 0.25}),
}


def _steps(
    n: int, device: bool, sizes: dict = STEP_SIZES, dtype: str = "torch.bfloat16"
) -> list[dict]:
    """Step records of commit n (the 'best' variant gets a little faster with every commit)."""
    out = []
    for size, (ms, tokens, flops) in sizes.items():
        for i, (variant, rel) in enumerate(STEP_VARIANTS.items()):
            t = ms * rel * (1 - 0.02 * n if variant == "best" else 1)
            times = {
                "step": (samples(t * 0.98, n + i) if device else None, samples(t, 100 + n + i))
            }
            out.append(
                record(
                    f"bench_step.Step{size}",
                    {"variant": variant},
                    times=times,
                    peak={"step": int(2**30 * ms / 40 * (0.8 if variant == "best" else 1))},
                    flops={"step": flops},
                    info={"tokens": tokens, "primary_clock": "wall", "dtype": dtype},
                )
            )
    return out


def _kernels(n: int) -> list[dict]:
    out = []
    for op, (shapes, impls) in KERNEL_IMPLS.items():
        for s, (shape, ms) in enumerate(shapes.items()):
            for i, (impl, rel) in enumerate(impls.items()):
                if (n, shape, impl) == (3, "16384x4096", "triton"):  # a regression at commit 3
                    rel *= 1.3
                metrics = ("fwd",) if op == "GradStats" else ("fwd", "fwdbwd")
                times = {
                    m: (
                        samples(ms * rel * (1 + 2 * j), n + s + i + j),
                        samples(ms * rel * (1 + 2 * j) + 0.01, n),
                    )
                    for j, m in enumerate(metrics)
                }
                out.append(
                    record(
                        f"bench_kernels.{op}",
                        {"shape": shape, "impl": impl},
                        times=times,
                        peak={metrics[-1]: 2**28},
                        flops={m: 1e9 * ms for m in metrics},
                        bytes_={m: 1e8 * ms for m in metrics},
                        info={
                            "dtype": "torch.float32" if op == "GradStats" else "torch.bfloat16",
                            "device_clock": "cold-l2",
                        },
                    )
                )
        out.append(
            record(f"bench_kernels.{op}", {"shape": "skipped", "impl": "liger"}, status="skipped")
        )
    return out


def slower(records: list[dict], factor: float) -> list[dict]:
    """Copies of ``records`` with every time (samples, median, quartiles) times ``factor``."""
    out = copy.deepcopy(records)
    for rec in out:
        for clocks in (rec.get("metrics") or {}).values():
            for t in (clocks or {}).values():
                if t:
                    t["samples_ms"] = [v * factor for v in t["samples_ms"]]
                    for name in ("median_ms", "q25_ms", "q75_ms", "iqr_ms"):
                        t[name] *= factor
    return out


def report_store(root) -> ResultStore:
    """Three commits on an H100 (kernels + steps), two runs each on one GPU (the second 0.4%
    slower: the A/A history the gate's noise needs), one emulated T4 commit, two CPU commits (no
    device time).

    The H100's commits are saved newest first, so file order differs from date order.
    """
    store = ResultStore(root)
    for n in (3, 2, 1):
        records = _steps(n, True) + _kernels(n)
        save(store, "h100-sxm", commit(n), f"2025-01-0{n}T12:00:00+00:00", records)
        save(store, "h100-sxm", commit(n), f"2025-01-0{n}T12:30:00+00:00", slower(records, 1.004))
    save(
        store,
        "h100-sxm-emulating-t4",
        commit(1),
        "2025-01-01T13:00:00+00:00",
        _steps(1, True, {"100M": STEP_SIZES["100M"]}, "torch.float16") + _kernels(1),
        emulate="t4",
    )
    tiny = {"Tiny": (40.0, 512, 6 * 1e6 * 512)}
    for n in (1, 2):
        skipped = record(
            "bench_kernels.RMSNorm", {"shape": "16384x768", "impl": "eager"}, status="skipped"
        )
        cpu = [*_steps(n, False, tiny), skipped]
        save(store, "cpu-host", commit(n), f"2025-01-0{n}T14:00:00+00:00", cpu, gpu_name=None)
    return store
