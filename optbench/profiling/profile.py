"""``optbench profile``: a profiling report of the training step, with the figures users read off
torch.profiler by hand (time split, memory split, top operators, launches, host syncs and other smells);
``--diff`` compares two reports.

Usage::

    optbench profile --size 100M [--variant fused-ce | --options key=value ...] [--steps 3] [--warmup 2]
                     [--name NAME] [--out DIR] [--device cuda|cpu] [--fp8-ceiling-tflops X]
    optbench profile --diff A B [--out DIR]        A, B: report folders or their report.json

A report runs ``--warmup`` steps (the last one under the profiler's own warm-up), then ``--steps`` steps
under torch.profiler (CPU and CUDA activities, memory events, no shapes, no stacks). Every figure is per
step, averaged over the profiled steps. It writes report.json (all figures), report.md and report.html (the
same content), trace.json.gz (Chrome trace), time_split.png, memory_timeline.png and, on CUDA,
memory_snapshot.pickle (one more step recorded by ``torch.cuda.memory._record_memory_history``, for
pytorch.org/memory_viz) into ``results/<machine>/profiles/<commit[:12]>-<size>-<name>/`` or ``--out``. The
folder is built under a temporary name and renamed into place, so a crash leaves no half report.

Time split: the profiler's ``ProfilerStep#k`` ranges bound each step on the host, and ranges that torch
emits itself cut it into contiguous phases: optimizer (``Optimizer.zero_grad#...``), forward (up to the
first ``autograd::engine::evaluate_function`` event: forward and loss), backward (first to last of those
events, on whichever thread autograd runs them: the caller's on a CPU, a device thread on CUDA), optimizer
(up to the end of the last ``Optimizer.step#...`` range: unscaling, gradient statistics, clipping, AdamW)
and other (the loss copy, ``loss.item()``, the harness). Host data movement is the time inside CUDA memcpy
and synchronize calls, taken out of the phase it falls in. On CUDA the device time is split likewise: each
kernel goes to the phase in which its launching operator started (memcpys to data movement; kernels of no
operator, e.g. those of a CUDA graph replay, to unattributed). Wall time runs from the first step's start to
the later of the last step's end and the last device activity; the GPU busy fraction is the union of device
activity over it.

Kernel classes (CUDA): the same device time split by what the kernels do: FP8 GEMMs, other GEMMs, FP8 casts
and scale computation (amax, scales, casts to float8), attention, other. KERNEL_RULES decide, first match:
the launching operator (``aten::_scaled_mm``, ``aten::mm``, SDPA ops), an enclosing one (torchao's float8
autograd functions), else the kernel's name (a CUDA graph replay or inductor's kernels have no useful op); the
report keeps each class's top kernels and each rule's count, to audit them. The FP8 GEMMs' TFLOP/s divides the
Float8Linear layers' FLOPs (3 GEMMs of 2 x tokens x in x out each) by their device time, and
``--fp8-ceiling-tflops`` (a measured ceiling) gives its fraction of that ceiling.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import datetime as dt
import html
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, get_type_hints

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile, schedule

from models.step import StepOptions, TrainStep
from optbench.core.console import console, table
from optbench.core.store import write_json_atomic, write_text_atomic

PHASES = ("forward", "backward", "optimizer", "data_movement", "other")
HOST_PHASES = ("forward", "backward", "optimizer", "other")  # the segments' phases
COLORS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green",
          "data_movement": "tab:red", "other": "tab:gray", "unattributed": "tab:purple", "idle": "whitesmoke"}
BACKWARD = "autograd::engine::evaluate_function"
ZERO_GRAD, OPTIMIZER_STEP = "Optimizer.zero_grad#", "Optimizer.step#"
# CUDA runtime and driver calls as kineto names them (some with suffixes such as _ptsz or _v11060).
LAUNCH_CALL = re.compile(r"^cu(da)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)")
SYNC_CALL = re.compile(r"^(cuda(Stream|Device|Event|Thread)Synchronize|cu(Stream|Ctx|Event)Synchronize"
                       r"|cudaMemcpy(_ptds)?$)")
DATA_CALL = re.compile(rf"^cu(da)?Memcpy|{SYNC_CALL.pattern}")
DEVICE_COPIES = ("Memcpy", "Memset")  # kineto's names of device copies and fills; the rest are kernels
# CUPTI records the time a launch waited for a full command buffer as a device-side span: it is host
# back-pressure, not device work (counted, a 1B step showed 113 ms of "device time" in it).
NOT_DEVICE_WORK = ("Command Buffer Full",)
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero")  # ops that sync when their input is on a GPU
COPY_OPS = ("aten::copy_", "aten::to", "aten::_to_copy")
NORM_OPS = ("aten::linalg_vector_norm", "aten::norm", "aten::pow", "aten::sum", "aten::_foreach_norm")
HOST_MEMORY = (DeviceType.CPU, DeviceType.MKLDNN, DeviceType.IDEEP)
SMALL_KERNEL_US = 10.0
TOP = 15
CHANGED = 0.20  # relative change of an operator's calls or time that --diff lists ...
NOISE = 0.01  # ... where a time change is also above this fraction of A's wall time
FIGURE_SECTIONS = ("time", "launches", "smells", "memory", "kernel_classes")

# Kernel classes: each device activity of the steps goes to one (memcpys and memsets too, mostly to other).
KERNEL_CLASSES = ("gemm_fp8", "gemm", "fp8_cast", "attention", "other")
GEMM_NAME = r"nvjet|gemm|gemv|xmma|cutlass|cublas|triton_tem_fused\w*mm"  # GEMM libraries, inductor's mm templates
# FP8 operand types in GEMM names: cuBLAS(Lt) e4m3/e5m2, nvjet's operand letters (seen on an H100: 'qq' e4m3 x e4m3,
# 'qr' e4m3 x e5m2, against 'tst' for bf16), torch's rowwise CUTLASS f8f8bf16 (cutlass::float_e4m3_t), inductor's
# _scaled_mm template; hex hashes are no 'f8'.
FP8_NAME = r"e4m3|e5m2|fp8|float8|f8f8|(?<![0-9a-z])f8_|nvjet_(?:sm\d+_)?[qr][qr]|_scaled_mm"
# (evidence, regex, class), first match wins (re.IGNORECASE). Evidence 'op': the kernel's launching operator (the
# innermost host op the profiler attributes it to); 'within': that op or one enclosing it (torchao's float8 autograd
# functions hold the amax, scale and cast ops of eager FP8, and the reciprocals and layout copies of its mm);
# 'kernel': the kernel's name, for kernels of no operator (a CUDA graph replay, inductor's Triton launches) or of one
# no op rule names. Inductor names a fused kernel by its original aten ops, sorted: torchao's casts read
# 'triton_red_fused_abs_amax_0', 'triton_poi_fused__to_copy_abs_clamp_div_max_mul_reciprocal_t_1'.
KERNEL_RULES: tuple[tuple[str, str, str], ...] = (
    ("op", r"^aten::_scaled_mm", "gemm_fp8"),
    ("within", r"scaled_dot_product|flash_att|efficient_attention|cudnn_attention|flex_attention", "attention"),
    ("op", r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear)$", "gemm"),
    ("within", r"matmul_with_hp_or_float8_args|ToFloat8|Float8", "fp8_cast"),
    ("kernel", r"flash|fmha|sdpa|attention|dot_do_o", "attention"),
    ("kernel", rf"^(?=.*(?:{GEMM_NAME}))(?=.*(?:{FP8_NAME}))", "gemm_fp8"),
    ("kernel", GEMM_NAME, "gemm"),
    ("kernel", r"fused\w*_amax|fused\w*_abs\w*_max|fused\w*__to_copy\w*_clamp\w*_(mul|reciprocal)|float8|fp8|e4m3|e5m2",
     "fp8_cast"),
    ("kernel", r"", "other"),
)
_KERNEL_RULES = [(scope, re.compile(pattern, re.IGNORECASE), kind) for scope, pattern, kind in KERNEL_RULES]
TOP_PER_CLASS = 5
FP8_TARGET = 0.70  # the goal the report checks: FP8 GEMMs at 70% or more of the measured FP8 matmul ceiling

Segment = tuple[float, float, str]  # (start us, end us, phase) on the profiler's clock


# --- options ------------------------------------------------------------------------------------------------

def parse_options(pairs: Iterable[str]) -> dict[str, Any]:
    """``key=value`` strings to StepOptions overrides, typed by the field's annotation ('none' is None)."""
    hints = get_type_hints(StepOptions)
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in hints:
            raise SystemExit(f"optbench profile: bad option {pair!r}; keys: {', '.join(hints)}")
        if hints[key] is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise SystemExit(f"optbench profile: {key} takes true or false, not {value!r}")
            overrides[key] = value.lower() in ("true", "1")
        elif hints[key] is int:
            overrides[key] = int(value)
        else:
            overrides[key] = None if value.lower() == "none" else value
    return overrides


def step_options_for(size: str, variant: str | None, overrides: dict[str, Any], device: str) -> StepOptions:
    """The profiled step's options: the variant's candidate, or the device's baseline with ``overrides``."""
    from optbench.suite.workloads import step_options

    return step_options(size, variant or "eager", device)[1].replace(**overrides)


# --- profiling ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Capture:
    """A finished profile, with the bytes allocated on the device right after it."""

    prof: profile
    end_bytes: int
    allocator_peak: int | None  # CUDA: max_memory_allocated over the profiled steps


def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors' elements."""
    return sum(t.numel() * t.element_size() for t in tensors)


def step_tensors(step: TrainStep) -> dict[str, int]:
    """Bytes of the step's weights, gradients and optimizer state (AdamW's step counters included, host
    scalars unless the optimizer is capturable or fused)."""
    state = [v for s in step.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {"weights_bytes": nbytes(step.params),
            "gradients_bytes": nbytes(p.grad for p in step.params if p.grad is not None),
            "optimizer_state_bytes": nbytes(state)}


def allocated_bytes(step: TrainStep) -> int:
    """Bytes allocated on the step's device now: the CUDA allocator's count; on a CPU the step's own tensors
    (weights, gradients, optimizer state, buffers, batch), as the host allocator keeps no total."""
    if step.device.type == "cuda":
        return torch.cuda.memory_allocated(step.device)
    return sum(step_tensors(step).values()) + nbytes(step.model.buffers()) + nbytes((step.idx, step.targets))


def capture(step: TrainStep, steps: int, warmup: int) -> Capture:
    """Run ``warmup`` steps, the last one under the profiler's warm-up, then profile ``steps`` steps."""
    cuda = step.device.type == "cuda"
    wait, warm = max(warmup - 1, 0), min(warmup, 1)
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])],
                 schedule=schedule(wait=wait, warmup=warm, active=steps, repeat=1), record_shapes=False,
                 profile_memory=True, with_stack=False) as prof:
        for i in range(wait + warm + steps):
            if cuda and i == wait + warm:
                torch.cuda.reset_peak_memory_stats(step.device)
            step()
            prof.step()  # the profiler synchronizes the device before it stops
    peak = torch.cuda.max_memory_allocated(step.device) if cuda else None
    return Capture(prof, allocated_bytes(step), peak)


def dump_memory_snapshot(step: TrainStep, path: Path) -> None:
    """One more step under the CUDA allocator's history (Python stacks of allocations), saved to ``path``."""
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python")
    try:
        step()
        torch.cuda.synchronize(step.device)
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


# --- the steps' timeline ------------------------------------------------------------------------------------

def step_segments(events: list[FunctionEvent], start: float, end: float) -> list[Segment]:
    """Contiguous phases of one step's host time (see the module's doc); all 'other' without a backward."""
    inside = [e for e in events if start <= e.time_range.start < end]
    backward = [e for e in inside if e.name.startswith(BACKWARD)]
    if not backward:
        return [(start, end, "other")]
    b0 = min(e.time_range.start for e in backward)
    b1 = min(max(e.time_range.end for e in backward), end)
    f0 = max((e.time_range.end for e in inside if e.name.startswith(ZERO_GRAD) and e.time_range.end <= b0),
             default=start)
    o1 = min(max((e.time_range.end for e in inside
                  if e.name.startswith(OPTIMIZER_STEP) and e.time_range.start >= b1), default=b1), end)
    bounds = [(start, f0, "optimizer"), (f0, b0, "forward"), (b0, b1, "backward"), (b1, o1, "optimizer"),
              (o1, end, "other")]
    return [s for s in bounds if s[1] > s[0]]


@dataclasses.dataclass
class Timeline:
    """The profiled steps on the host: their ranges and phase segments (us on the profiler's clock)."""

    ranges: list[tuple[float, float]]
    segments: list[Segment]

    @classmethod
    def of(cls, host: list[FunctionEvent]) -> Timeline:
        ranges = sorted((e.time_range.start, e.time_range.end) for e in host
                        if e.name.startswith("ProfilerStep"))
        if not ranges:
            raise RuntimeError("the profile holds no ProfilerStep range: no step was profiled")
        return cls(ranges, [s for a, b in ranges for s in step_segments(host, a, b)])

    @property
    def n(self) -> int:
        return len(self.ranges)

    def phase_at(self, t: float) -> str | None:
        """Phase of the segment holding time ``t``; None outside the steps."""
        i = bisect.bisect_right(self.segments, (t, math.inf, "")) - 1
        return self.segments[i][2] if i >= 0 and t < self.segments[i][1] else None

    def step_phases(self) -> Iterator[tuple[float, float, dict[str, tuple[float, float]]]]:
        """(start, end, {phase: (its first start, its last end)}) of each step."""
        for a, b in self.ranges:
            spans: dict[str, tuple[float, float]] = {}
            for s0, s1, phase in (s for s in self.segments if a <= s[0] < b):
                spans[phase] = (spans.get(phase, (s0,))[0], s1)
            yield a, b, spans


@dataclasses.dataclass
class MemoryCurve:
    """Bytes allocated on the step's device after each allocator event (times in us, the profiler's clock)."""

    times: np.ndarray
    levels: np.ndarray
    initial: float

    @classmethod
    def of(cls, prof: profile, device: torch.device, end_bytes: int) -> MemoryCurve:
        """From the profiler's memory events, anchored so that the last level is ``end_bytes`` (a CPU profile
        misses frees of blocks allocated before it started: anchored at the end, the curve is exact from the
        first step's zero_grad on)."""
        results = prof.profiler.kineto_results
        cuda = device.type == "cuda"
        index = (torch.cuda.current_device() if device.index is None else device.index) if cuda else None

        def mine(e: Any) -> bool:
            if cuda:
                return e.device_type() == DeviceType.CUDA and e.device_index() == index
            return e.device_type() in HOST_MEMORY

        t0 = results.trace_start_ns()
        mem = sorted(((e.start_ns() - t0) / 1e3, e.nbytes()) for e in results.events()
                     if e.name() == "[memory]" and mine(e))
        levels = np.cumsum([b for _, b in mem], dtype=float)
        offset = end_bytes - (levels[-1] if len(levels) else 0.0)
        return cls(np.array([t for t, _ in mem], dtype=float), levels + offset, offset)

    def at(self, t: float) -> float:
        i = int(np.searchsorted(self.times, t, side="right"))
        return float(self.levels[i - 1]) if i else self.initial

    def peak(self, a: float, b: float) -> float:
        i, j = np.searchsorted(self.times, [a, b], side="right")
        return max(self.at(a), *self.levels[i:j].tolist())


@dataclasses.dataclass
class Parsed:
    """A capture's events, split once: host events within the steps, device activity (kernels, memcpys,
    memsets; not the device-side spans of record_function ranges), the timeline and the memory curve."""

    host: list[FunctionEvent]
    device: list[FunctionEvent]
    line: Timeline
    curve: MemoryCurve

    @classmethod
    def of(cls, cap: Capture, device: torch.device) -> Parsed:
        events = list(cap.prof.events())
        host = [e for e in events if e.device_type == DeviceType.CPU]
        line = Timeline.of(host)
        return cls([e for e in host if line.phase_at(e.time_range.start)],
                   [e for e in events if e.device_type != DeviceType.CPU and not e.is_user_annotation
                    and e.name not in NOT_DEVICE_WORK],
                   line, MemoryCurve.of(cap.prof, device, cap.end_bytes))


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of intervals."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


# --- figures ------------------------------------------------------------------------------------------------

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
    """Device ms per step by the phase of each kernel's launching operator; sums to the device's total."""
    ms = dict.fromkeys((*PHASES, "unattributed"), 0.0)
    for e in p.host:
        phase = None if e.is_user_annotation else p.line.phase_at(e.time_range.start)
        for k in e.kernels if phase else ():
            if k.name not in NOT_DEVICE_WORK:
                ms["data_movement" if k.name.startswith("Memcpy") else phase] += k.duration / 1e3
    total = sum(e.time_range.elapsed_us() for e in p.device) / 1e3
    ms["unattributed"] = max(total - sum(ms.values()), 0.0)
    return {k: v / p.line.n for k, v in ms.items()}


def kernel_rule(name: str, ops: Sequence[str] = ()) -> int:
    """Index in KERNEL_RULES of the rule that classifies the device kernel ``name``; ``ops``: its launching
    operator, then the ops enclosing it, innermost first (none where no operator launched it)."""
    for i, (scope, pattern, _) in enumerate(_KERNEL_RULES):
        texts = ops[:1] if scope == "op" else ops if scope == "within" else (name,)
        if any(pattern.search(t) for t in texts):
            return i
    raise AssertionError("the last kernel rule matches every name")


def kernel_class(name: str, ops: Sequence[str] = ()) -> str:
    """The class (KERNEL_CLASSES) of the device kernel ``name`` launched by ``ops[0]`` (see kernel_rule)."""
    return KERNEL_RULES[kernel_rule(name, ops)][2]


def op_stack(e: FunctionEvent) -> tuple[str, ...]:
    """Names of ``e`` and of the host ops enclosing it, innermost first."""
    names = []
    while e is not None:
        names.append(e.name)
        e = e.cpu_parent
    return tuple(names)


def classified_kernels(p: Parsed) -> dict[tuple[str, int], list[float]]:
    """{(kernel name, deciding rule): [calls, us]} over all device activity (the device split's): the kernels
    of the operators that device_split attributes, by their ops and names; the rest of each name, by its name."""
    rows: dict[tuple[str, int], list[float]] = {}
    left: dict[str, list[float]] = {}
    for e in p.device:
        row = left.setdefault(e.name, [0, 0.0])
        row[0], row[1] = row[0] + 1, row[1] + e.time_range.elapsed_us()

    def add(name: str, rule: int, calls: float, us: float) -> None:
        row = rows.setdefault((name, rule), [0, 0.0])
        row[0], row[1] = row[0] + calls, row[1] + us

    for e in p.host:
        kernels = [] if e.is_user_annotation else [k for k in e.kernels if k.name not in NOT_DEVICE_WORK]
        stack = op_stack(e) if kernels else ()
        for k in kernels:
            add(k.name, kernel_rule(k.name, stack), 1, k.duration)
            row = left.setdefault(k.name, [0, 0.0])
            row[0], row[1] = row[0] - 1, row[1] - k.duration
    for name, (calls, us) in left.items():
        if calls > 0 or us > 0:
            add(name, kernel_rule(name), max(calls, 0), max(us, 0.0))
    return rows


def class_split(p: Parsed) -> dict[str, Any]:
    """Device ms (and kernels) per step by kernel class, summing to the device split's total; the rules that
    decided (kernels and ms each) and each class's top kernels (calls, ms per step, rule), to audit them."""
    n, rows = p.line.n, classified_kernels(p)
    ms, calls = dict.fromkeys(KERNEL_CLASSES, 0.0), dict.fromkeys(KERNEL_CLASSES, 0.0)
    by_rule = [[0.0, 0.0] for _ in KERNEL_RULES]
    for (_, rule), (c, us) in rows.items():
        kind = KERNEL_RULES[rule][2]
        ms[kind] += us / 1e3 / n
        calls[kind] += c / n
        by_rule[rule][0] += c / n
        by_rule[rule][1] += us / 1e3 / n
    top_rows = sorted(rows.items(), key=lambda r: -r[1][1])
    return {"total_ms": sum(ms.values()), "ms": ms, "kernels": calls,
            "top": {kind: [{"name": name, "calls": c / n, "ms": us / 1e3 / n, "rule": rule}
                           for (name, rule), (c, us) in top_rows if KERNEL_RULES[rule][2] == kind][:TOP_PER_CLASS]
                    for kind in KERNEL_CLASSES},
            "rules": [{"rule": i, "evidence": scope, "pattern": pattern, "class": kind, "kernels": c, "ms": t}
                      for i, ((scope, pattern, kind), (c, t)) in enumerate(zip(KERNEL_RULES, by_rule))]}


def is_float8_linear(module: torch.nn.Module) -> bool:
    """Whether ``module`` is torchao's Float8Linear (or a subclass: models.step's Float8FusedLinear)."""
    return any(cls.__name__ == "Float8Linear" for cls in type(module).__mro__)


def linear_gemm_flops(model: torch.nn.Module, tokens: int) -> dict[str, float]:
    """FLOPs per step of the GEMMs of ``model``'s Linear layers, 3 each (forward, grad input, grad weight) of
    2 x tokens x in x out FLOPs: 'fp8' of the Float8Linear layers, 'other' of the rest (the LM head included),
    with the layers' counts ('fp8_layers', 'other_layers'). Recomputed forwards (checkpointing) not counted."""
    out = {"fp8": 0.0, "other": 0.0, "fp8_layers": 0, "other_layers": 0}
    for m in model.modules():
        kind = "fp8" if is_float8_linear(m) else "other" if isinstance(m, torch.nn.Linear) else None
        if kind:
            rows, cols = m.weight.shape
            out[kind] += 3 * 2.0 * tokens * rows * cols
            out[f"{kind}_layers"] += 1
    return out


def tflops(flops: float, ms: float) -> float | None:
    """TFLOP/s of ``flops`` in ``ms`` (None without either)."""
    return flops / (ms / 1e3) / 1e12 if flops and ms > 0 else None


def matmul_figures(step: TrainStep, ms: dict[str, float], fp8_ceiling: float | None) -> dict[str, Any]:
    """TFLOP/s of the FP8 GEMMs (the Float8Linear layers' FLOPs over the gemm_fp8 class's device ms) and its
    fraction of the FP8 matmul ceiling ``fp8_ceiling`` (TFLOP/s, measured; None: no fraction); of the other
    GEMMs likewise (the other Linear layers' FLOPs over the gemm class's ms, which holds every other matmul)."""
    flops = linear_gemm_flops(step.model, step.tokens_per_step)
    achieved = tflops(flops["fp8"], ms["gemm_fp8"])
    return {"fp8_layers": flops["fp8_layers"], "gemm_fp8_tflop_per_step": flops["fp8"] / 1e12,
            "gemm_fp8_tflops_achieved": achieved, "fp8_ceiling_tflops": fp8_ceiling,
            "gemm_fp8_ceiling_fraction": achieved / fp8_ceiling if achieved and fp8_ceiling else None,
            "fp8_target_fraction": FP8_TARGET,
            "other_layers": flops["other_layers"], "gemm_tflop_per_step": flops["other"] / 1e12,
            "gemm_tflops_achieved": tflops(flops["other"], ms["gemm"])}


def class_notes(split: dict[str, Any], matmul: dict[str, Any]) -> list[str]:
    """Caveats of the kernel classes' figures."""
    out = []
    if matmul["fp8_layers"] and not split["ms"]["gemm_fp8"]:
        out.append(f"{matmul['fp8_layers']} Float8Linear layers but no kernel classed as an FP8 GEMM: their GEMMs' "
                   "names may lack a known FP8 marker (FP8_NAME) and count as gemm; see its top kernels.")
    if matmul["fp8_layers"] and matmul["fp8_ceiling_tflops"] is None:
        out.append("No FP8 ceiling given (--fp8-ceiling-tflops, as scripts/probes/fp8_matmul_ceiling.py measures "
                   "it): no fraction of it.")
    fraction = matmul["gemm_fp8_ceiling_fraction"]
    if fraction is not None:
        out.append(f"FP8 GEMMs at {fraction:.0%} of the measured FP8 matmul ceiling "
                   f"({'at or above' if fraction >= FP8_TARGET else 'below'} the {FP8_TARGET:.0%} target).")
    if fraction is not None and fraction > 1:
        out.append("Above the ceiling: a measurement problem until explained. Check that ceiling's accumulation "
                   "(torchao's forward GEMM uses fast accumulation) and its clock: back-to-back GEMMs run at the "
                   "power cap, GEMMs between memory-bound kernels at a higher clock; then the FP8 GEMMs' kernels "
                   "(a kernel counted in gemm_fp8 that is none) and the FLOP count.")
    return out


def kernel_class_figures(step: TrainStep, p: Parsed, fp8_ceiling: float | None = None) -> dict[str, Any] | None:
    """The device time split by kernel class with the GEMMs' TFLOP/s (None on a CPU: no device kernels)."""
    if step.device.type != "cuda":
        return None
    split = class_split(p)
    matmul = matmul_figures(step, split["ms"], fp8_ceiling)
    return {**split, "matmul": matmul, "notes": class_notes(split, matmul)}


def time_figures(step: TrainStep, p: Parsed) -> dict[str, Any]:
    """Wall ms per step, the host (and device) split, GPU busy fraction, tokens/s, MFU of the dtype's peak."""
    from optbench.core.hardware import detect
    from optbench.core.roofline import Ceilings

    start, cuda = p.line.ranges[0][0], step.device.type == "cuda"
    end = max([p.line.ranges[-1][1], *(e.time_range.end for e in p.device)])
    wall_ms = (end - start) / 1e3 / p.line.n
    busy = union_us((max(e.time_range.start, start), e.time_range.end) for e in p.device) / 1e3 / p.line.n
    peak = Ceilings.from_profile(detect(step.device)).peak(step.options.precision) if cuda else None
    return {"wall_ms": wall_ms,
            "host_ms": host_split(p),
            "device_ms": device_split(p) if cuda else None,
            "device_busy_ms": busy if cuda else None,
            "gpu_busy_fraction": busy / wall_ms if cuda else None,
            "tokens_per_s": step.tokens_per_step / wall_ms * 1e3,
            "mfu": step.flops_per_step / (wall_ms / 1e3) / (peak * 1e12) if peak else None}


def op_tables(prof: profile, n: int) -> dict[str, list[dict[str, Any]]]:
    """Every host operator or range (calls, self host ms, self device ms per step; a record_function range
    has no device time of its own) and every device kernel, memcpy and memset (calls, device ms per step)."""
    averages = prof.key_averages()
    ops = [{"name": a.key, "calls": a.count / n, "host_ms": a.self_cpu_time_total / 1e3 / n,
            "device_ms": 0.0 if a.is_user_annotation else a.self_device_time_total / 1e3 / n}
           for a in averages
           if a.device_type == DeviceType.CPU and not a.key.startswith(("ProfilerStep", "[memory]", *NOT_DEVICE_WORK))]
    kernels = [{"name": a.key, "calls": a.count / n, "device_ms": a.device_time_total / 1e3 / n}
               for a in averages if a.device_type != DeviceType.CPU and not a.is_user_annotation
               and a.key not in NOT_DEVICE_WORK]
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
    """Kernel launches per step and the median kernel (us); on a CPU, aten leaf ops and their median."""
    n = p.line.n
    if cuda:
        kernels = kernel_us(p)
        return {"what": "CUDA kernel launches (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch, ...)",
                "per_step": sum(bool(LAUNCH_CALL.match(e.name)) for e in p.host) / n,
                "kernels_per_step": len(kernels) / n,
                "median_us": statistics.median(kernels) if kernels else None,
                "median_of": "device kernel duration"}
    leaves = [e for e in p.host if e.name.startswith("aten::")
              and not any(c.name.startswith("aten::") for c in e.cpu_children)]
    return {"what": "ops per step: aten leaf ops (operators calling no other aten op; a CPU runs no kernels)",
            "per_step": len(leaves) / n,
            "kernels_per_step": None,
            "median_us": statistics.median(e.time_range.elapsed_us() for e in leaves) if leaves else None,
            "median_of": "host duration of those ops"}


def host_syncs(p: Parsed, cuda: bool) -> dict[str, Any]:
    """Host-device syncs per step, by issuing operator and by phase: CUDA synchronize and synchronous memcpy
    calls on CUDA; on a CPU, calls of the ops that sync when their input is on a GPU (SYNC_OPS)."""
    syncs = [e for e in p.host if (SYNC_CALL.match(e.name) if cuda else e.name in SYNC_OPS)]
    by_op = Counter(e.cpu_parent.name if cuda and e.cpu_parent else e.name for e in syncs)
    by_phase = Counter(p.line.phase_at(e.time_range.start) for e in syncs)
    return {"host_syncs": len(syncs) / p.line.n,
            "host_syncs_by_op": {k: v / p.line.n for k, v in sorted(by_op.items())},
            "host_syncs_by_phase": {k: by_phase[k] / p.line.n for k in HOST_PHASES}}


def in_foreach(e: FunctionEvent) -> bool:
    """Whether ``e`` runs inside a ``torch._foreach_*`` op (which a CPU runs one tensor at a time)."""
    parent = e.cpu_parent
    while parent is not None and not parent.name.startswith("aten::_foreach_"):
        parent = parent.cpu_parent
    return parent is not None


def smell_figures(step: TrainStep, p: Parsed, cuda: bool) -> dict[str, Any]:
    """The seeds' smells per step: copies, host syncs, small kernels (CUDA), and the loops over parameters:
    norm and foreach ops called from Python (not from inside a foreach op)."""
    n, calls, kernels = p.line.n, Counter(e.name for e in p.host), kernel_us(p)
    small = sum(d < SMALL_KERNEL_US for d in kernels)
    python = Counter(e.name for e in p.host if e.name.startswith(("aten::_foreach_", *NORM_OPS))
                     and not in_foreach(e))
    foreach = sum(v for k, v in python.items() if k.startswith("aten::_foreach_"))
    return {"copy_calls": {op: calls[op] / n for op in COPY_OPS},
            **host_syncs(p, cuda),
            "small_kernels": small / n if cuda else None,
            "small_kernel_fraction": small / len(kernels) if cuda and kernels else None,
            "loops": {"param_tensors": len(step.params),
                      "norm_ops": {op: python[op] / n for op in NORM_OPS},
                      "foreach_calls": foreach / n}}


def logits_bytes(step: TrainStep) -> int:
    """Estimate: the (tokens, vocab) logits in their dtype where the loss materializes them, else one chunk
    of next_pow2(ceil(N / ceil(V / H))) tokens (the chunk of our chunked and fused losses, and of Liger's)."""
    from kernels.cross_entropy import default_chunk_size

    cfg, n = step.config, step.tokens_per_step
    rows = n if step.options.loss == "eager" else default_chunk_size(n, cfg.d_model, cfg.vocab_size)
    return rows * cfg.vocab_size * (step.amp_dtype or torch.float32).itemsize


def mean_or_none(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def memory_figures(step: TrainStep, p: Parsed, cap: Capture) -> dict[str, Any]:
    """Memory split in bytes: the step's tensors, activations (peak of forward + backward above the level at
    the forward's start), the logits estimate, the peaks of backward and of the step, the level after it."""
    activations, backward, peaks, after = [], [], [], []
    for a, b, spans in p.line.step_phases():
        peaks.append(p.curve.peak(a, b))
        after.append(p.curve.at(b))
        if "forward" in spans and "backward" in spans:
            f0, (b0, b1) = spans["forward"][0], spans["backward"]
            activations.append(p.curve.peak(f0, b1) - p.curve.at(f0))
            backward.append(p.curve.peak(b0, b1))
    return {**step_tensors(step),
            "activations_bytes": mean_or_none(activations),
            "logits_bytes_estimate": logits_bytes(step),
            "peak_backward_bytes": mean_or_none(backward),
            "peak_step_bytes": mean_or_none(peaks),
            "after_step_bytes": mean_or_none(after),
            "allocator_peak_bytes": cap.allocator_peak}


def notes(step: TrainStep, p: Parsed, cuda: bool) -> list[str]:
    """Caveats that qualify this report's figures."""
    out = []
    if not cuda:
        out += ["No GPU: device times, GPU busy fraction, small kernels, kernels and kernel classes are null; "
                "'launches' counts aten leaf ops per step; host data movement is 0 (no device to copy to).",
                "Host syncs on a CPU count the ops that sync when their input is on a GPU (.item() through "
                "aten::_local_scalar_dense, aten::nonzero): nothing waits here, and AdamW (not capturable, "
                "not fused) reads its step counters with .item() on host tensors: no sync on a GPU either.",
                "Memory levels on a CPU are anchored to the step's tensors (weights, gradients, optimizer "
                "state, buffers, batch) after the last step, as the host allocator keeps no total.",
                "A CPU runs torch._foreach_* ops one tensor at a time: their inner per-tensor ops count as "
                "ops per step (not as loop norm ops); on CUDA each is one multi-tensor kernel per group."]
    else:
        out.append("Host phases show where the host spends its time, for a GPU-bound step mostly waiting "
                   "(blocked in launches or syncs); the device split shows where the GPU spends its own.")
    if sum(phase == "backward" for *_, phase in p.line.segments) < p.line.n:
        out.append("Some steps show no autograd backward on the host (a CUDA graph replay): their host time "
                   "is 'other', their device time 'unattributed', and activations are not split out.")
    if step.options.compile:
        out.append("torch.compile: forward and backward kernels come from inductor's compiled graphs.")
    return out


def analyze(step: TrainStep, cap: Capture, p: Parsed, meta: dict[str, Any],
            fp8_ceiling: float | None = None) -> dict[str, Any]:
    """The report's figures (report.json) from one capture; ``fp8_ceiling``: the FP8 matmul ceiling, TFLOP/s."""
    cuda = step.device.type == "cuda"
    tables = op_tables(cap.prof, p.line.n)
    return {"meta": {**meta, "profiled_steps": p.line.n},
            "notes": notes(step, p, cuda),
            "time": time_figures(step, p),
            "launches": launch_figures(p, cuda),
            "smells": smell_figures(step, p, cuda),
            "memory": memory_figures(step, p, cap),
            "kernel_classes": kernel_class_figures(step, p, fp8_ceiling),
            "ops": {"top_host": top(tables["all"], "host_ms"),
                    "top_device": top(tables["all"], "device_ms") if cuda else None,
                    "top_kernels": top(tables["kernels"], "device_ms") if cuda else None,
                    "all": tables["all"]}}


# --- charts -------------------------------------------------------------------------------------------------

def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_time_split(time: dict[str, Any], path: Path) -> None:
    """Stacked bars of the host's (and the device's) ms per step by phase, against the wall time."""
    plt = pyplot()
    bars = {"host": time["host_ms"]}
    if time["device_ms"] is not None:
        bars["device"] = {**time["device_ms"], "idle": max(time["wall_ms"] - time["device_busy_ms"], 0.0)}
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.5 * len(bars)))
    labelled: set[str] = set()
    for row, parts in bars.items():
        lefts = np.cumsum([0.0, *parts.values()])[:-1]
        for (phase, ms), left in zip(parts.items(), lefts):
            ax.barh(row, ms, left=left, color=COLORS[phase], edgecolor="white",
                    label=None if phase in labelled else phase.replace("_", " "))
            labelled.add(phase)
    ax.axvline(time["wall_ms"], color="black", linestyle="--", linewidth=1, label="wall")
    ax.set_xlabel("ms per step")
    ax.invert_yaxis()
    fig.legend(ncol=8, fontsize=8, loc="lower center", frameon=False)
    fig.subplots_adjust(bottom=0.45 if len(bars) == 1 else 0.35)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_memory(curve: MemoryCurve, line: Timeline, path: Path) -> None:
    """Allocated MiB over the profiled steps, their phases shaded."""
    plt = pyplot()
    from matplotlib.patches import Patch

    t0, t1 = line.ranges[0][0], line.ranges[-1][1]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for s0, s1, phase in line.segments:
        ax.axvspan((s0 - t0) / 1e3, (s1 - t0) / 1e3, color=COLORS[phase], alpha=0.15, linewidth=0)
    keep = (curve.times >= t0) & (curve.times <= t1)
    times = np.concatenate([[t0], curve.times[keep], [t1]])
    levels = np.concatenate([[curve.at(t0)], curve.levels[keep], [curve.at(t1)]])
    ax.step((times - t0) / 1e3, levels / 2**20, where="post", color="black", linewidth=1)
    ax.set_xlabel("ms since the first profiled step")
    ax.set_ylabel("allocated MiB")
    phases = dict.fromkeys(phase for *_, phase in line.segments)
    ax.legend(handles=[Patch(color=COLORS[p], alpha=0.3, label=p) for p in phases], fontsize=8,
              loc="upper right")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


# --- report documents ---------------------------------------------------------------------------------------

Block = tuple  # ("h", level, text) | ("p", text) | ("table", headers, rows) | ("img", alt, file)


def fmt(value: Any, key: str = "") -> str:
    """A figure for a table: bytes in MiB, fractions in %, other numbers to 4 significant digits."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if key.endswith(("bytes", "bytes_estimate")):
        return f"{value / 2**20:,.1f} MiB"
    if key.endswith(("fraction", "share", "mfu")):
        return f"{100 * value:.1f}%"
    return f"{value:,.4g}"


def short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def op_rows(rows: list[dict[str, Any]] | None, key: str) -> list[list[str]]:
    """Table rows (name, calls, ``key`` ms, share) of a top list."""
    return [[short(r["name"]), fmt(r["calls"]), fmt(r[key]), fmt(r["share"], "share")] for r in rows or []]


def smell_rows(r: dict[str, Any]) -> list[list[str]]:
    """Table rows of the launches and smells."""
    launches, s = r["launches"], r["smells"]
    return [[launches["what"], fmt(launches["per_step"])],
            ["device kernels", fmt(launches["kernels_per_step"])],
            [f"median {launches['median_of']} (us)", fmt(launches["median_us"])],
            *[[f"{op} calls", fmt(v)] for op, v in s["copy_calls"].items()],
            ["host syncs", fmt(s["host_syncs"])],
            *[[f"host syncs from {k}", fmt(v)] for k, v in s["host_syncs_by_op"].items()],
            *[[f"host syncs in {k}", fmt(v)] for k, v in s["host_syncs_by_phase"].items()],
            [f"small kernels (< {SMALL_KERNEL_US:g} us)", fmt(s["small_kernels"])],
            ["small kernel fraction", fmt(s["small_kernel_fraction"], "fraction")],
            ["parameter tensors", fmt(s["loops"]["param_tensors"])],
            *[[f"{op} calls", fmt(v)] for op, v in s["loops"]["norm_ops"].items()],
            ["aten::_foreach_* calls", fmt(s["loops"]["foreach_calls"])]]


def class_blocks(kc: dict[str, Any]) -> list[Block]:
    """The kernel classes' section: ms per class, the GEMMs' TFLOP/s, each class's top kernels and the rules."""
    total, matmul = kc["total_ms"], kc["matmul"]
    classes = [[kind, fmt(kc["kernels"][kind]), fmt(ms), fmt(ms / total if total else None, "share")]
               for kind, ms in kc["ms"].items()]
    tops = [[kind, short(t["name"]), fmt(t["calls"]), fmt(t["ms"]), str(t["rule"])]
            for kind, rows in kc["top"].items() for t in rows]
    rules = [[str(r["rule"]), r["evidence"], r["pattern"] or "(any)", r["class"], fmt(r["kernels"]), fmt(r["ms"])]
             for r in kc["rules"]]
    return [("h", 2, "Device time by kernel class (per step)"),
            ("p", "Each kernel goes to one class by the first rule that matches (table below): its launching "
                  "operator, an operator enclosing it, else its name. gemm_fp8: FP8 GEMMs; gemm: other matmuls; "
                  "fp8_cast: FP8 amax, scales and casts; attention; other: the rest, memcpys and memsets."),
            ("table", ["class", "kernels", "device ms", "share"], [*classes, ["total", "", fmt(total), ""]]),
            ("table", ["figure", "value"], [[k, fmt(v, k)] for k, v in matmul.items()]),
            *[("p", note) for note in kc["notes"]],
            ("table", ["class", f"top kernels (up to {TOP_PER_CLASS})", "calls", "device ms", "rule"], tops),
            ("table", ["rule", "evidence", "pattern (re.IGNORECASE)", "class", "kernels", "device ms"], rules)]


def report_blocks(r: dict[str, Any]) -> list[Block]:
    """The report as blocks, rendered to Markdown and HTML alike."""
    m, t = r["meta"], r["time"]
    host, dev = t["host_ms"], t["device_ms"] or {}
    options = ", ".join(f"{k}={v}" for k, v in m["options"].items())
    blocks: list[Block] = [
        ("h", 1, f"Profile: {m['size']} {m['name']} @ {m['commit'][:12]} on {m['machine']}"),
        ("p", f"{m['device']}, torch {m['torch']}, {m['profiled_steps']} profiled steps after {m['warmup']} "
              f"warm-up steps, {m['date']}. Options: {options}."),
        ("h", 2, "Time per step"),
        ("table", ["phase", "host ms", "% of wall", "device ms"],
         [[p, fmt(host.get(p)), fmt(host[p] / t["wall_ms"] if p in host else None, "fraction"),
           fmt(dev.get(p))] for p in (*PHASES, *(["unattributed"] if dev else []))]),
        ("table", ["figure", "value"],
         [[k, fmt(t[k], k)]
          for k in ("wall_ms", "device_busy_ms", "gpu_busy_fraction", "tokens_per_s", "mfu")]),
        ("img", "time split", "time_split.png"),
        ("h", 2, "Launches and smells (per step)"),
        ("table", ["figure", "value"], smell_rows(r)),
        ("h", 2, "Top operators by host time (self)"),
        ("table", ["operator", "calls", "host ms", "share"], op_rows(r["ops"]["top_host"], "host_ms")),
    ]
    if r["ops"]["top_device"] is not None:
        blocks += [("h", 2, "Top operators by device time (self: the kernels each launched)"),
                   ("table", ["operator", "calls", "device ms", "share"],
                    op_rows(r["ops"]["top_device"], "device_ms")),
                   ("h", 2, "Top kernels by device time"),
                   ("table", ["kernel", "calls", "device ms", "share"],
                    op_rows(r["ops"]["top_kernels"], "device_ms"))]
    if r.get("kernel_classes"):
        blocks += class_blocks(r["kernel_classes"])
    return [*blocks,
            ("h", 2, "Memory"),
            ("table", ["figure", "value"], [[k, fmt(v, k)] for k, v in r["memory"].items()]),
            ("img", "memory timeline", "memory_timeline.png"),
            ("h", 2, "Notes"),
            *[("p", note) for note in r["notes"]]]


def to_markdown(blocks: list[Block]) -> str:
    out = []
    for kind, *rest in blocks:
        if kind == "h":
            out.append(f"{'#' * rest[0]} {rest[1]}")
        elif kind == "p":
            out.append(rest[0])
        elif kind == "img":
            out.append(f"![{rest[0]}]({rest[1]})")
        else:
            out.append(table(*rest, "markdown"))
    return "\n\n".join(out) + "\n"


def to_html(blocks: list[Block]) -> str:
    esc, out = html.escape, []
    for kind, *rest in blocks:
        if kind == "h":
            out.append(f"<h{rest[0]}>{esc(rest[1])}</h{rest[0]}>")
        elif kind == "p":
            out.append(f"<p>{esc(rest[0])}</p>")
        elif kind == "img":
            out.append(f'<p><img src="{esc(rest[1])}" alt="{esc(rest[0])}"></p>')
        else:
            out.append(table(*rest, "html"))
    title = esc(next(b[2] for b in blocks if b[0] == "h"))
    style = ("body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse;"
             "margin:1em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}")
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{title}</title><style>{style}</style>'
            "</head><body>\n" + "\n".join(out) + "\n</body></html>\n")


# --- writing ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def staging(final: Path) -> Iterator[Path]:
    """A temporary folder beside ``final``, renamed to it (replacing an older one) when the block succeeds;
    removed when it fails."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        tmp.chmod(0o755)
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_report(step: TrainStep, cap: Capture, p: Parsed, report: dict[str, Any], folder: Path) -> None:
    """Every file of a report into ``folder``."""
    cap.prof.export_chrome_trace(str(folder / "trace.json.gz"))  # gzipped by the name's suffix
    plot_time_split(report["time"], folder / "time_split.png")
    plot_memory(p.curve, p.line, folder / "memory_timeline.png")
    if step.device.type == "cuda":
        dump_memory_snapshot(step, folder / "memory_snapshot.pickle")
    report["files"] = sorted([*(f.name for f in folder.iterdir()), "report.html", "report.json", "report.md"])
    blocks = report_blocks(report)
    write_json_atomic(folder / "report.json", report)
    write_text_atomic(folder / "report.md", to_markdown(blocks))
    write_text_atomic(folder / "report.html", to_html(blocks))


# --- diff ---------------------------------------------------------------------------------------------------

def load_report(path: str | Path) -> tuple[dict[str, Any], Path]:
    """(report, its folder) from a report folder or its report.json."""
    file = Path(path)
    file = file / "report.json" if file.is_dir() else file
    return json.loads(file.read_text(encoding="utf-8")), file.parent


def figures(report: dict[str, Any]) -> dict[str, float | None]:
    """Every scalar figure of a report's FIGURE_SECTIONS (numbers and nulls) by dotted key."""
    out: dict[str, float | None] = {}

    def walk(obj: Any, key: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{key}.{k}")
        elif obj is None or (isinstance(obj, (int, float)) and not isinstance(obj, bool)):
            out[key] = obj

    for section in FIGURE_SECTIONS:
        walk(report.get(section), section)  # kernel_classes: none in older reports
    return out


def figure_rows(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any, Any, Any]]:
    """(figure, A, B, B - A, B / A) of every scalar figure of either report."""
    fa, fb = figures(a), figures(b)
    rows = []
    for key in dict.fromkeys([*fa, *fb]):
        x, y = fa.get(key), fb.get(key)
        both = x is not None and y is not None
        rows.append((key, x, y, y - x if both else None, y / x if both and x else None))
    return rows


def op_changes(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, str, dict | None, dict | None]]:
    """(operator, 'appeared' | 'disappeared' | 'changed', A's row, B's row): operators of one side only, and
    those of either side's top lists whose calls, or whose time by more than NOISE of A's wall time, changed
    by more than CHANGED."""
    ra, rb = ({r["name"]: r for r in x["ops"]["all"]} for x in (a, b))
    tops = {r["name"] for x in (a, b) for key in ("top_host", "top_device") for r in x["ops"][key] or []}
    floor = NOISE * a["time"]["wall_ms"]

    def changed(x: dict, y: dict) -> bool:
        return abs(y["calls"] - x["calls"]) > CHANGED * x["calls"] or any(
            abs(y[k] - x[k]) > max(CHANGED * x[k], floor) for k in ("host_ms", "device_ms"))

    out = [(name, "disappeared" if name in ra else "appeared", ra.get(name), rb.get(name))
           for name in dict.fromkeys([*ra, *rb]) if (name in ra) != (name in rb)]
    out += [(name, "changed", ra[name], rb[name]) for name in sorted(tops)
            if name in ra and name in rb and changed(ra[name], rb[name])]
    return sorted(out, key=lambda c: -max(r["host_ms"] + r["device_ms"] for r in c[2:] if r))


def diff_markdown(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> str:
    """The diff of two reports as Markdown: every scalar figure, then the operators that changed."""
    rows = [[key, fmt(x, key), fmt(y, key), fmt(d, key), "—" if r is None else f"{r:.3f}×"]
            for key, x, y, d, r in figure_rows(a, b)]
    cols = ("calls", "host_ms", "device_ms")
    ops = [[short(name), what, *(fmt(row[k]) if row else "—" for row in (ra, rb) for k in cols)]
           for name, what, ra, rb in op_changes(a, b)]
    return to_markdown([
        ("h", 1, f"Profile diff: A = {names[0]}, B = {names[1]}"),
        ("table", ["figure", "A", "B", "B − A", "B / A"], rows),
        ("h", 2, f"Operators that appeared, disappeared or changed by more than {CHANGED:.0%} "
                 f"(times: and by more than {NOISE:.0%} of A's wall time)"),
        ("table", ["operator", "change", *(f"{side} {c}" for side in "AB" for c in cols)], ops),
    ])


def run_diff(paths: list[str], out: str | None) -> int:
    """``--diff A B``: print the diff and write diff.md into ``out`` or B's folder."""
    from rich.markdown import Markdown

    (a, _), (b, folder) = load_report(paths[0]), load_report(paths[1])
    text = diff_markdown(a, b, (paths[0], paths[1]))
    target = (Path(out) if out else folder) / "diff.md"
    write_text_atomic(target, text)
    terminal = console()
    terminal.print(Markdown(text))
    terminal.print(f"written: {target}")
    return 0


# --- main ---------------------------------------------------------------------------------------------------

def summary(report: dict[str, Any], folder: Path) -> None:
    """A short rich table of the headline figures."""
    m, t, s, mem, kc = report["meta"], report["time"], report["smells"], report["memory"], report["kernel_classes"]
    rows = [("wall ms", fmt(t["wall_ms"])), ("tokens/s", fmt(t["tokens_per_s"])),
            *((f"host {p} ms", fmt(v)) for p, v in t["host_ms"].items()),
            ("GPU busy", fmt(t["gpu_busy_fraction"], "fraction")),
            ("kernel launches" if t["device_ms"] is not None else "aten ops",
             fmt(report["launches"]["per_step"])),
            ("host syncs", fmt(s["host_syncs"])),
            ("aten::copy_ calls", fmt(s["copy_calls"]["aten::copy_"])),
            ("small kernels", fmt(s["small_kernels"])),
            ("activations", fmt(mem["activations_bytes"], "bytes")),
            ("peak during backward", fmt(mem["peak_backward_bytes"], "bytes")),
            *(((f"device {k} ms", fmt(v)) for k, v in kc["ms"].items()) if kc else ()),
            *((("FP8 GEMM TFLOP/s", fmt(kc["matmul"]["gemm_fp8_tflops_achieved"])),) if kc else ())]
    terminal = console()
    terminal.print(table(("figure", "per step"), rows,
                         title=f"optbench profile: {m['size']} {m['name']} on {m['device']}"))
    terminal.print(f"report: {folder}")


def parser() -> argparse.ArgumentParser:
    from models.config import CONFIGS
    from models.variants import VARIANTS

    p = argparse.ArgumentParser(prog="optbench profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=list(CONFIGS), help="model size")
    pick = p.add_mutually_exclusive_group()
    pick.add_argument("--variant", choices=["eager", *VARIANTS], help="profile this variant's candidate step")
    pick.add_argument("--options", nargs="+", default=[], metavar="KEY=VALUE",
                      help="StepOptions overrides of the baseline, e.g. item_sync=false grad_stats=foreach")
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--warmup", type=int, default=2, help="steps before them")
    p.add_argument("--name", help="report name (default: the variant, 'custom' with --options, else 'eager')")
    p.add_argument("--out", help="report folder (default results/<machine>/profiles/<commit>-<size>-<name>); "
                                 "with --diff, the folder of diff.md (default: B's)")
    p.add_argument("--device", help="cuda or cpu (default: cuda where available)")
    p.add_argument("--fp8-ceiling-tflops", type=float, metavar="X",
                   help="the measured FP8 matmul ceiling (TFLOP/s, scripts/probes/fp8_matmul_ceiling.py): the report "
                        "gives the FP8 GEMMs' fraction of it")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="compare two reports")
    return p


def main(argv: list[str] | None = None) -> int:
    """``optbench profile``: write a profiling report, or diff two (see the module's doc)."""
    from models.config import CONFIGS
    from models.step import UnsupportedOptions, build_step
    from optbench.core.hardware import detect
    from optbench.core.machine import machine_info
    from optbench.core.runner import current_commit, current_machine
    from optbench.core.store import results_dir

    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.diff:
        missing = [d for d in args.diff if not (Path(d).is_file() or (Path(d) / "report.json").is_file())]
        if missing:
            p.error(f"--diff takes two profile folders or their report.json; no such report: {', '.join(missing)}")
        return run_diff(args.diff, args.out)
    if not args.size or args.steps < 1 or args.warmup < 0:
        p.error("--size is required, --steps must be at least 1 and --warmup at least 0")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    options = step_options_for(args.size, args.variant, parse_options(args.options), device)
    name = args.name or args.variant or ("custom" if args.options else "eager")
    try:
        step = build_step(CONFIGS[args.size], options, device,
                          profile=detect(device) if device.startswith("cuda") else None)
    except UnsupportedOptions as exc:
        print(f"optbench profile: cannot run {name} at {args.size} on {device}: {exc}", file=sys.stderr)
        return 2
    commit, machine = current_commit(), current_machine()
    folder = Path(args.out or results_dir() / machine / "profiles" / f"{commit[:12]}-{args.size}-{name}")
    meta = {"commit": commit, "machine": machine, "size": args.size, "name": name, "variant": args.variant,
            "device": str(step.device), "torch": torch.__version__, "options": dataclasses.asdict(options),
            "warmup": args.warmup, "tokens_per_step": step.tokens_per_step,
            "flops_per_step": step.flops_per_step,
            "params": sum(t.numel() for t in step.params), "machine_info": machine_info(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    with staging(folder) as tmp:
        cap = capture(step, args.steps, args.warmup)
        parsed = Parsed.of(cap, step.device)
        report = analyze(step, cap, parsed, meta, args.fp8_ceiling_tflops)
        write_report(step, cap, parsed, report, tmp)
    summary(report, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
