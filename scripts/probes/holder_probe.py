"""What holds the device memory a case leaves behind: the 1B best-regional step, after which the
next case (best-kernels) starts with ~7.7 GB more allocated than the check's reference explains.

Runs the cases through the runner; after the runner frees each, prints JSON lines: the bytes still
allocated; the live blocks grouped by where they were allocated (the allocator's history, python
frames); for the largest live CUDA tensors the collector can see, the chain of objects that refer to
them; and the bytes allocated after ``torch._dynamo.reset()`` and a collector pass. Run on a GPU:

    python3 scripts/probes/holder_probe.py [VARIANT ...]   (default: eager best-regional
    best-kernels, the full suite's Step1B cases in order)

``PROBE_BENCHMARK`` names another step grid (bench_step.Step100M). With ``PROBE_AT=result`` it
looks where the case meter takes its ``resident_bytes`` (after timing, before the runner frees
anything) instead: run once as is and once with ``OPTBENCH_CHECKED_IN=probe`` (the check skipped,
as in ab's later rounds) to see what a process that checked holds more. ``PROBE_SITES`` (a regular
expression): there, the referrers of the live tensors allocated at a matching site.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import re
import sys
import tempfile
import types

import torch

from optbench.run import runner
from optbench.store.store import ResultStore
from optbench.suite import catalog, grids

BENCHMARK = os.environ.get("PROBE_BENCHMARK", "bench_step.Step1B")
AT_RESULT = os.environ.get("PROBE_AT") == "result"
SITES = os.environ.get("PROBE_SITES")
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


def blocks_at(pattern: str) -> list[tuple[int, int]]:
    """(address, size) of the live blocks allocated at a site matching ``pattern``."""
    found = []
    for segment in torch.cuda.memory._snapshot()["segments"]:
        address = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated" and re.search(
                pattern, where(block.get("frames", []))
            ):
                found.append((address, block["size"]))
            address += block["size"]
    return found


def holders_at(pattern: str, depth: int = 6) -> None:
    """The referrers of the live tensors whose storage lies in a block allocated at ``pattern``."""
    blocks = blocks_at(pattern)
    emit(blocks_at_sites=[[hex(a), round(n / 2**20, 1)] for a, n in blocks])
    inside = [t for t in real_cuda_tensors() if any(a <= _ptr(t) < a + n for a, n in blocks)]
    shown = inside[:8]
    emit(tensors_in_blocks=len(inside), shown=len(shown))
    ignore = {id(inside), id(shown)}
    for tensor in shown:
        emit(
            tensor_mib=round(tensor.untyped_storage().nbytes() / 2**20, 1),
            shape=list(tensor.shape),
            dtype=str(tensor.dtype),
            referrers=referrers(tensor, ignore, depth),
        )


def live_blocks() -> None:
    snapshot = torch.cuda.memory._snapshot()
    by_site: collections.Counter[str] = collections.Counter()
    pools: collections.Counter[str] = collections.Counter()
    pools_free: collections.Counter[str] = collections.Counter()
    for segment in snapshot["segments"]:
        pool = str(tuple(segment.get("segment_pool_id", (0, 0))))
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                pools_free[pool] += block["size"]
                continue
            pools[pool] += block["size"]
            by_site[where(block.get("frames", []))] += block["size"]
    emit(
        live_by_pool_mib={k: round(v / 2**20, 1) for k, v in pools.items()},
        free_by_pool_mib={k: round(v / 2**20, 1) for k, v in pools_free.items()},
    )
    for site, size in by_site.most_common(40 if AT_RESULT else 12):
        emit(live_mib=round(size / 2**20), site=site)


def describe(obj: object) -> str:
    name = type(obj).__qualname__
    if isinstance(obj, dict):
        return f"dict({len(obj)} keys: {list(obj)[:4]})"
    if hasattr(obj, "__code__"):
        code = obj.__code__  # type: ignore[attr-defined]
        return f"{name} {code.co_filename}:{code.co_name}"
    if type(obj).__name__ == "cell":
        return "cell"
    return f"{type(obj).__module__}.{name}"


def real_cuda_tensors() -> list[torch.Tensor]:
    """Live CUDA tensors the collector tracks, with device memory (no fake or meta tensors), not
    the cached check references', largest first."""
    from torch._subclasses.fake_tensor import FakeTensor

    from optbench.suite import workloads

    kept = set()
    for baseline in workloads._REFERENCES.values():
        ref = baseline.reference
        for value in vars(ref).values():
            for t in value.values() if isinstance(value, dict) else [value]:
                if isinstance(t, torch.Tensor):
                    kept.add(_ptr(t))
    tensors = [o for o in gc.get_objects() if _on_device(o, FakeTensor) and _ptr(o) not in kept]
    tensors.sort(key=lambda t: t.untyped_storage().nbytes(), reverse=True)
    return tensors


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _on_device(obj: object, fake: type) -> bool:
    """A real CUDA tensor with storage; one that cannot tell (asking raises) is left out."""
    if not isinstance(obj, torch.Tensor) or isinstance(obj, fake):
        return False
    try:
        return obj.is_cuda and _ptr(obj) != 0
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def referrers(obj: object, ignore: set[int], depth: int, width: int = 3) -> list:
    """The objects referring to obj, as a tree ``depth`` deep, ``width`` per level (this probe's
    own frames and lists left out)."""
    if depth == 0:
        return []
    refs = [
        r
        for r in gc.get_referrers(obj)
        if id(r) not in ignore
        and not (isinstance(r, types.FrameType) and r.f_code.co_filename == __file__)
    ]
    shown = refs[:width]
    ignore.update((id(refs), id(shown)))
    tree: list = [[describe(r), referrers(r, ignore, depth - 1, width)] for r in shown]
    return tree + ([f"+{len(refs) - width} more"] if len(refs) > width else [])


def holders(limit: int = 4, depth: int = 5) -> None:
    tensors = real_cuda_tensors()
    emit(
        real_cuda_tensors=len(tensors),
        real_mib=round(sum(t.untyped_storage().nbytes() for t in tensors) / 2**20),
    )
    ignore = {id(tensors)}
    for tensor in tensors[:limit]:
        emit(
            tensor_mib=round(tensor.untyped_storage().nbytes() / 2**20),
            shape=list(tensor.shape),
            dtype=str(tensor.dtype),
            referrers=referrers(tensor, ignore, depth),
        )


def main() -> None:
    variants = sys.argv[1:] or ["eager", "best-regional", "best-kernels"]
    os.environ.setdefault("OPTBENCH_MACHINE", "holder-probe")
    os.environ.setdefault("ASV_COMMIT", "f" * 40)
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    free = runner._free_device_memory

    def free_and_look(baseline: int | None = None) -> None:
        free(baseline)
        emit(after_free_mib=round(torch.cuda.memory_allocated() / 2**20))
        live_blocks()
        holders()

    if AT_RESULT:
        from optbench.measure.memory import CaseMeter

        result = CaseMeter.result

        def look_then_result(meter: CaseMeter) -> dict[str, int]:
            emit(at_result_allocated_mib=round(torch.cuda.memory_allocated() / 2**20, 1))
            live_blocks()
            if SITES:
                holders_at(SITES)
            return result(meter)

        CaseMeter.result = look_then_result
    else:
        runner._free_device_memory = free_and_look
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
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    emit(after_dynamo_reset_mib=round(torch.cuda.memory_allocated() / 2**20))
    live_blocks()


if __name__ == "__main__":
    main()
