"""What holds the device memory a case leaves behind: the 1B best-regional step, after which the
next case (best-kernels) starts with ~7.7 GB more allocated than the check's reference explains.

Runs the case through the runner (which frees after it), then prints JSON lines: the bytes still
allocated; the live blocks grouped by where they were allocated (the allocator's history, python
frames); for the largest live CUDA tensors the collector can see, the chain of objects that refer to
them; and the bytes allocated after ``torch._dynamo.reset()`` and a collector pass. Run on a GPU:

    python3 scripts/probes/holder_probe.py [VARIANT ...]   (default: best-regional)
"""

from __future__ import annotations

import collections
import gc
import json
import os
import sys
import tempfile

import torch

from optbench.run import runner
from optbench.store.store import ResultStore
from optbench.suite import catalog, grids

BENCHMARK = "bench_step.Step1B"
OURS = ("/models/", "/kernels/", "/optbench/")


def emit(**fields: object) -> None:
    print(json.dumps(fields, default=str), flush=True)


def where(frames: list[dict]) -> str:
    """The allocation's site: our innermost frame and torch's innermost one, if any."""
    ours = next((f for f in frames if any(p in f["filename"] for p in OURS)), None)
    inner = next((f for f in frames if f["filename"].endswith(".py")), None)
    site = [
        f"{f['filename'].split('site-packages/')[-1]}:{f['line']}:{f['name']}"
        for f in (inner, ours)
        if f is not None
    ]
    return " <- ".join(dict.fromkeys(site)) or "?"


def live_blocks() -> None:
    snapshot = torch.cuda.memory._snapshot()
    by_site: collections.Counter[str] = collections.Counter()
    pools: collections.Counter[str] = collections.Counter()
    for segment in snapshot["segments"]:
        pool = str(tuple(segment.get("segment_pool_id", (0, 0))))
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            pools[pool] += block["size"]
            by_site[where(block.get("frames", []))] += block["size"]
    emit(live_by_pool_mib={k: round(v / 2**20) for k, v in pools.items()})
    for site, size in by_site.most_common(12):
        emit(live_mib=round(size / 2**20), site=site)


def describe(obj: object) -> str:
    name = type(obj).__qualname__
    if isinstance(obj, dict):
        return f"dict({len(obj)} keys: {list(obj)[:4]})"
    if hasattr(obj, "__code__"):
        return f"{name} {obj.__code__.co_filename}:{obj.__code__.co_name}"  # type: ignore[attr-defined]
    if type(obj).__name__ == "cell":
        return "cell"
    return f"{type(obj).__module__}.{name}"


def holders(limit: int = 6, depth: int = 5) -> None:
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
    tensors.sort(key=lambda t: t.untyped_storage().nbytes(), reverse=True)
    emit(
        gc_visible_cuda_tensors=len(tensors),
        gc_visible_mib=round(sum(t.untyped_storage().nbytes() for t in tensors) / 2**20),
    )
    ignore = {id(tensors)}
    for tensor in tensors[:limit]:
        chain, obj = [], tensor
        for _ in range(depth):
            refs = [
                r for r in gc.get_referrers(obj) if id(r) not in ignore and r is not sys._getframe()
            ]
            if not refs:
                break
            obj = refs[0]
            ignore.add(id(refs))
            chain.append(describe(obj) + (f" (+{len(refs) - 1} more)" if len(refs) > 1 else ""))
        emit(
            tensor_mib=round(tensor.untyped_storage().nbytes() / 2**20),
            shape=list(tensor.shape),
            dtype=str(tensor.dtype),
            chain=chain,
        )


def main() -> None:
    variants = sys.argv[1:] or ["best-regional"]
    os.environ.setdefault("OPTBENCH_MACHINE", "holder-probe")
    os.environ.setdefault("ASV_COMMIT", "f" * 40)
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    entry = catalog.benchmark(BENCHMARK)
    chosen = [
        case
        for case in grids.cases(BENCHMARK, entry.grid("full"), "cuda")
        if case.params.get("variant") in variants
    ]
    records = runner.run_grid(
        BENCHMARK, chosen, device="cuda", store=ResultStore(tempfile.mkdtemp()), log=lambda _: None
    )
    for key, rec in records.items():
        emit(case=key, status=rec["status"], memory=rec.get("memory"))
    emit(after_cases_mib=round(torch.cuda.memory_allocated() / 2**20))
    live_blocks()
    holders()
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    emit(after_dynamo_reset_mib=round(torch.cuda.memory_allocated() / 2**20))
    live_blocks()


if __name__ == "__main__":
    main()
