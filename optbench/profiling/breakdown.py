"""The report's figures (report.json) from one capture: the time split, launches, smells, memory and
the top operators, with the caveats that qualify them.

Host data movement is the time inside CUDA memcpy and synchronize calls, taken out of the phase it
falls in (phases: ``optbench.profiling.timeline``). On CUDA the device time is split likewise: each
kernel goes to the phase in which its launching operator started (memcpys to data movement; kernels
of no operator, e.g. those of a CUDA graph replay, to unattributed). Wall time runs from the first
step's start to the later of the last step's end and the last device activity; the GPU busy fraction
is the union of device activity over it.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import profile

from models.step import TrainStep
from optbench.measure.overlap import NOT_DEVICE_WORK, length, merged
from optbench.measure.roofline import Ceilings
from optbench.profiling.capture import Capture, step_tensors
from optbench.profiling.floors import class_floors
from optbench.profiling.kernel_classes import kernel_class_figures
from optbench.profiling.timeline import HOST_PHASES, PHASES, Parsed

# CUDA runtime and driver calls as kineto names them (some with suffixes such as _ptsz or _v11060).
LAUNCH_CALL = re.compile(r"^cu(da)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)")
SYNC_CALL = re.compile(
    r"^(cuda(Stream|Device|Event|Thread)Synchronize|cu(Stream|Ctx|Event)Synchronize"
    r"|cudaMemcpy(_ptds)?$)"
)
DATA_CALL = re.compile(rf"^cu(da)?Memcpy|{SYNC_CALL.pattern}")
# kineto's names of device copies and fills; the rest are kernels
DEVICE_COPIES = ("Memcpy", "Memset")
# ops that sync when their input is on a GPU
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero")
COPY_OPS = ("aten::copy_", "aten::to", "aten::_to_copy")
NORM_OPS = (
    "aten::linalg_vector_norm",
    "aten::norm",
    "aten::pow",
    "aten::sum",
    "aten::_foreach_norm",
)
SMALL_KERNEL_US = 10.0
TOP = 15


def host_split(p: Parsed) -> dict[str, float]:
    """Host ms per step by phase; sums to the host's step time."""
    ms = dict.fromkeys(PHASES, 0.0)
    for s0, s1, phase in p.line.segments:
        ms[phase] += (s1 - s0) / 1e3
    for e in p.host:
        if DATA_CALL.match(e.name):
            ms[p.line.phase_at(e.time_range.start)] -= e.time_range.elapsed_us() / 1e3
            ms["data_movement"] += e.time_range.elapsed_us() / 1e3
    return {k: v / p.line.n for k, v in ms.items()}


def device_split(p: Parsed) -> dict[str, float]:
    """Device ms per step by the phase of each kernel's launching operator; sums to the device's
    total."""
    ms = dict.fromkeys((*PHASES, "unattributed"), 0.0)
    for e in p.host:
        phase = None if e.is_user_annotation else p.line.phase_at(e.time_range.start)
        for k in e.kernels if phase else ():
            if k.name not in NOT_DEVICE_WORK:
                ms["data_movement" if k.name.startswith("Memcpy") else phase] += k.duration / 1e3
    total = sum(e.time_range.elapsed_us() for e in p.device) / 1e3
    ms["unattributed"] = max(total - sum(ms.values()), 0.0)
    return {k: v / p.line.n for k, v in ms.items()}


def time_figures(step: TrainStep, p: Parsed) -> dict[str, Any]:
    """Wall ms per step, the host (and device) split, GPU busy fraction, tokens/s, MFU of the
    dtype's peak."""
    from optbench.measure.hardware import detect
    from optbench.measure.roofline import Ceilings

    start, cuda = p.line.ranges[0][0], step.device.type == "cuda"
    end = max([p.line.ranges[-1][1], *(e.time_range.end for e in p.device)])
    wall_ms = (end - start) / 1e3 / p.line.n
    busy = (
        length(merged((max(e.time_range.start, start), e.time_range.end) for e in p.device))
        / 1e3
        / p.line.n
    )
    peak = Ceilings.from_profile(detect(step.device)).peak(step.options.precision) if cuda else None
    return {
        "wall_ms": wall_ms,
        "host_ms": host_split(p),
        "device_ms": device_split(p) if cuda else None,
        "device_busy_ms": busy if cuda else None,
        "gpu_busy_fraction": busy / wall_ms if cuda else None,
        "tokens_per_s": step.tokens_per_step / wall_ms * 1e3,
        "mfu": step.flops_per_step / (wall_ms / 1e3) / (peak * 1e12) if peak else None,
    }


def op_tables(prof: profile, n: int) -> dict[str, list[dict[str, Any]]]:
    """Every host operator or range (calls, self host ms, self device ms per step; a record_function
    range has no device time of its own) and every device kernel, memcpy and memset (calls, device
    ms per step)."""
    averages = prof.key_averages()
    ops = [
        {
            "name": a.key,
            "calls": a.count / n,
            "host_ms": a.self_cpu_time_total / 1e3 / n,
            "device_ms": 0.0 if a.is_user_annotation else a.self_device_time_total / 1e3 / n,
        }
        for a in averages
        if a.device_type == DeviceType.CPU
        and not a.key.startswith(("ProfilerStep", "[memory]", *NOT_DEVICE_WORK))
    ]
    kernels = [
        {"name": a.key, "calls": a.count / n, "device_ms": a.device_time_total / 1e3 / n}
        for a in averages
        if a.device_type != DeviceType.CPU
        and not a.is_user_annotation
        and a.key not in NOT_DEVICE_WORK
    ]
    return {"all": ops, "kernels": kernels}


def top(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The TOP rows by ``key`` (of those with any), with their share of the total."""
    total = sum(r[key] for r in rows) or 1.0
    best = sorted((r for r in rows if r[key] > 0), key=lambda r: -r[key])[:TOP]
    return [{**r, "share": r[key] / total} for r in best]


def kernel_us(p: Parsed) -> list[float]:
    """Durations of the device kernels (memcpys and memsets left out), us."""
    return [e.time_range.elapsed_us() for e in p.device if not e.name.startswith(DEVICE_COPIES)]


def launch_figures(p: Parsed, cuda: bool) -> dict[str, Any]:
    """Kernel launches per step and the median kernel (us); on a CPU, aten leaf ops and their
    median."""
    n = p.line.n
    if cuda:
        kernels = kernel_us(p)
        return {
            "what": "CUDA kernel launches (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch, ...)",
            "per_step": sum(bool(LAUNCH_CALL.match(e.name)) for e in p.host) / n,
            "kernels_per_step": len(kernels) / n,
            "median_us": statistics.median(kernels) if kernels else None,
            "median_of": "device kernel duration",
        }
    leaves = [
        e
        for e in p.host
        if e.name.startswith("aten::")
        and not any(c.name.startswith("aten::") for c in e.cpu_children)
    ]
    return {
        "what": "ops per step: aten leaf ops (operators calling no other aten op; a CPU runs no "
        "kernels)",
        "per_step": len(leaves) / n,
        "kernels_per_step": None,
        "median_us": statistics.median(e.time_range.elapsed_us() for e in leaves)
        if leaves
        else None,
        "median_of": "host duration of those ops",
    }


def host_syncs(p: Parsed, cuda: bool) -> dict[str, Any]:
    """Host-device syncs per step, by issuing operator and by phase: CUDA synchronize and
    synchronous memcpy calls on CUDA; on a CPU, calls of the ops that sync when their input is on a
    GPU (SYNC_OPS)."""
    syncs = [e for e in p.host if (SYNC_CALL.match(e.name) if cuda else e.name in SYNC_OPS)]
    by_op = Counter(e.cpu_parent.name if cuda and e.cpu_parent else e.name for e in syncs)
    by_phase = Counter(p.line.phase_at(e.time_range.start) for e in syncs)
    return {
        "host_syncs": len(syncs) / p.line.n,
        "host_syncs_by_op": {k: v / p.line.n for k, v in sorted(by_op.items())},
        "host_syncs_by_phase": {k: by_phase[k] / p.line.n for k in HOST_PHASES},
    }


def in_foreach(e: FunctionEvent) -> bool:
    """Whether ``e`` runs inside a ``torch._foreach_*`` op (which a CPU runs one tensor at a
    time)."""
    parent = e.cpu_parent
    while parent is not None and not parent.name.startswith("aten::_foreach_"):
        parent = parent.cpu_parent
    return parent is not None


def smell_figures(step: TrainStep, p: Parsed, cuda: bool) -> dict[str, Any]:
    """The seeds' smells per step: copies, host syncs, small kernels (CUDA), and the loops over
    parameters: norm and foreach ops called from Python (not from inside a foreach op)."""
    n, calls, kernels = p.line.n, Counter(e.name for e in p.host), kernel_us(p)
    small = sum(d < SMALL_KERNEL_US for d in kernels)
    python = Counter(
        e.name
        for e in p.host
        if e.name.startswith(("aten::_foreach_", *NORM_OPS)) and not in_foreach(e)
    )
    foreach = sum(v for k, v in python.items() if k.startswith("aten::_foreach_"))
    return {
        "copy_calls": {op: calls[op] / n for op in COPY_OPS},
        **host_syncs(p, cuda),
        "small_kernels": small / n if cuda else None,
        "small_kernel_fraction": small / len(kernels) if cuda and kernels else None,
        "loops": {
            "param_tensors": len(step.params),
            "norm_ops": {op: python[op] / n for op in NORM_OPS},
            "foreach_calls": foreach / n,
        },
    }


def logits_bytes(step: TrainStep) -> int:
    """Estimate: the (tokens, vocab) logits in their dtype where the loss materializes them, else
    one chunk of next_pow2(ceil(N / ceil(V / H))) tokens (the chunk of our chunked and fused losses,
    and of Liger's)."""
    from kernels.cross_entropy import default_chunk_size

    cfg, n = step.config, step.tokens_per_step
    rows = n if step.options.loss == "eager" else default_chunk_size(n, cfg.d_model, cfg.vocab_size)
    return rows * cfg.vocab_size * (step.amp_dtype or torch.float32).itemsize


def mean_or_none(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def memory_figures(step: TrainStep, p: Parsed, cap: Capture) -> dict[str, Any]:
    """Memory split in bytes: the step's tensors, activations (peak of forward + backward above the
    level at the forward's start), the logits estimate, the peaks of backward and of the step, the
    level after it."""
    activations, backward, peaks, after = [], [], [], []
    for a, b, spans in p.line.step_phases():
        peaks.append(p.curve.peak(a, b))
        after.append(p.curve.at(b))
        if "forward" in spans and "backward" in spans:
            f0, (b0, b1) = spans["forward"][0], spans["backward"]
            activations.append(p.curve.peak(f0, b1) - p.curve.at(f0))
            backward.append(p.curve.peak(b0, b1))
    return {
        **step_tensors(step),
        "activations_bytes": mean_or_none(activations),
        "logits_bytes_estimate": logits_bytes(step),
        "peak_backward_bytes": mean_or_none(backward),
        "peak_step_bytes": mean_or_none(peaks),
        "after_step_bytes": mean_or_none(after),
        "allocator_peak_bytes": cap.allocator_peak,
    }


def notes(step: TrainStep, p: Parsed, cuda: bool) -> list[str]:
    """Caveats that qualify this report's figures."""
    out = []
    if not cuda:
        out += [
            "No GPU: device times, GPU busy fraction, small kernels, kernels and kernel classes "
            "are null; 'launches' counts aten leaf ops per step; host data movement is 0 (no "
            "device to copy to).",
            "Host syncs on a CPU count the ops that sync when their input is on a GPU (.item() "
            "through aten::_local_scalar_dense, aten::nonzero): nothing waits here, and AdamW "
            "(not capturable, not fused) reads its step counters with .item() on host tensors: no "
            "sync on a GPU either.",
            "Memory levels on a CPU are anchored to the step's tensors (weights, gradients, "
            "optimizer state, buffers, batch) after the last step, as the host allocator keeps no "
            "total.",
            "A CPU runs torch._foreach_* ops one tensor at a time: their inner per-tensor ops "
            "count as ops per step (not as loop norm ops); on CUDA each is one multi-tensor "
            "kernel per group.",
        ]
    else:
        out.append(
            "Host phases show where the host spends its time, for a GPU-bound step mostly waiting "
            "(blocked in launches or syncs); the device split shows where the GPU spends its own."
        )
    if sum(phase == "backward" for *_, phase in p.line.segments) < p.line.n:
        out.append(
            "Some steps show no autograd backward on the host (a CUDA graph replay): their host "
            "time is 'other', their device time 'unattributed', and activations are not split out."
        )
    if step.options.compile:
        out.append(
            "torch.compile: forward and backward kernels come from inductor's compiled graphs."
        )
    return out


def analyze(
    step: TrainStep,
    cap: Capture,
    p: Parsed,
    meta: dict[str, Any],
    ceilings: Ceilings | None = None,
    fp8_ceiling: float | None = None,
) -> dict[str, Any]:
    """The report's figures (report.json) from one capture; ``ceilings``: the device's measured
    ones, for each kernel class's floor (none without them); ``fp8_ceiling``: the FP8 matmul
    ceiling, TFLOP/s."""
    cuda = step.device.type == "cuda"
    tables = op_tables(cap.prof, p.line.n)
    classes = kernel_class_figures(step, p, fp8_ceiling)
    if classes is not None:
        floors = ceilings and class_floors(step, classes["ms"], ceilings, fp8_ceiling)
        classes["floors"] = floors or None
    return {
        "meta": {**meta, "profiled_steps": p.line.n},
        "notes": notes(step, p, cuda),
        "time": time_figures(step, p),
        "launches": launch_figures(p, cuda),
        "smells": smell_figures(step, p, cuda),
        "memory": memory_figures(step, p, cap),
        "kernel_classes": classes,
        "ops": {
            "top_host": top(tables["all"], "host_ms"),
            "top_device": top(tables["all"], "device_ms") if cuda else None,
            "top_kernels": top(tables["kernels"], "device_ms") if cuda else None,
            "all": tables["all"],
        },
    }
