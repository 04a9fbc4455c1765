"""Builds the work of each benchmark case: inputs, a correctness check, and the callables timed.

The asv suites (``benchmarks/bench_*.py``) and the pytest-benchmark twin both call these
builders, so each benchmark's work is defined once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from kernels.numerics import rel_err
from optbench.measure.memory import not_counted
from optbench.run.runner import Work, WrongResult
from optbench.store.settings import current
from optbench.store.store import DEVICE_CLOCK

if TYPE_CHECKING:
    from optbench.suite.ops import Op

# Relative-error tolerance of an optimized kernel against its eager baseline run in higher
# precision, per input dtype: bf16 keeps 8 bits of mantissa (rounding ~4e-3 per op, a few ops deep),
# fp16 11 bits.
KERNEL_RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def machine_profile(device: str):
    """The hardware profile the work must fit: the emulated target's, this GPU's, or the CPU's."""
    from optbench.measure.emulate import active_profile
    from optbench.measure.hardware import lookup

    return active_profile() if str(device).startswith("cuda") else lookup("cpu")


def skip_if(reason: str | None) -> None:
    """Raise the benchmark skip (NotImplementedError) with ``reason`` when there is one."""
    if reason:
        raise NotImplementedError(reason)


def require_cuda(device: str, what: str) -> None:
    """Skip (NotImplementedError) GPU-only work on a CPU."""
    if not str(device).startswith("cuda"):
        raise NotImplementedError(f"{what} needs a CUDA GPU; this machine has none")


def _as_tuple(out: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _grads_and_output(fn, inputs, out_grad) -> list[torch.Tensor]:
    """Outputs of ``fn(*inputs)`` and, when ``out_grad`` is given, the gradients of its float
    inputs."""
    leaves = [t for t in inputs if t.requires_grad]
    for t in leaves:
        t.grad = None
    outs = _as_tuple(fn(*inputs))
    if out_grad is not None:
        torch.autograd.backward(outs, out_grad)
    return [
        *(o.detach().clone() for o in outs),
        *(t.grad.clone() for t in leaves if out_grad is not None),
    ]


def _with_grad(t: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    t.grad = grad
    return t


def grad_stats_errors(
    fn: Callable[..., torch.Tensor],
    baseline: Callable[..., torch.Tensor],
    params: tuple[torch.Tensor, ...],
    ref_params: tuple[torch.Tensor, ...],
) -> list[float]:
    """Relative errors of a gradient-statistics implementation against its baseline: [its
    statistics, its worst clipped gradient]. ``params`` carry gradients and stay unchanged (``fn``
    clips copies); ``ref_params`` are their copies in the reference dtype, given copies of the
    gradients and clipped by ``baseline``."""
    for r, p in zip(ref_params, params, strict=True):
        r.grad = p.grad.detach().to(r.dtype, copy=True)
    got_params = [_with_grad(p.detach().clone(), p.grad.clone()) for p in params]
    stats_err = rel_err(fn(*got_params), baseline(*ref_params))
    return [stats_err, max(rel_err(g.grad, r.grad) for g, r in zip(got_params, ref_params))]


# (inputs, output gradients or None)
InputSet = tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]


def set_bytes(input_set: InputSet) -> int:
    """Bytes of one input set: its inputs, the gradients they carry, and its output gradients."""
    inputs, out_grad = input_set
    tensors = [*inputs, *(t.grad for t in inputs if t.grad is not None), *(out_grad or ())]
    return sum(t.numel() * t.element_size() for t in tensors)


def input_sets(
    op: Op,
    dims: dict[str, int],
    dtype: torch.dtype,
    device: str,
    gen: torch.Generator,
    fn: Callable[..., Any],
    l2_bytes: int,
) -> list[InputSet]:
    """Fresh random input sets of ``op`` (with output gradients where it has a backward, shaped like
    ``fn``'s outputs), drawn from ``gen`` one after another: as many as a cold-L2 rotation on an
    ``l2_bytes`` cache needs (:func:`optbench.measure.timing.rotation_sets`). Set 0 is drawn first,
    as a single set would be."""
    from optbench.measure.timing import rotation_sets

    inputs = op.make_inputs(dims, dtype, device, gen)
    outs = _as_tuple(fn(*inputs)) if op.backward else ()

    def out_grad() -> tuple[torch.Tensor, ...] | None:
        if not op.backward:
            return None
        return tuple(
            torch.ones((), device=device)
            if op.loss_like
            else torch.randn(o.shape, generator=gen, device=device, dtype=torch.float32).to(o.dtype)
            for o in outs
        )

    sets = [(inputs, out_grad())]
    count = rotation_sets(set_bytes(sets[0]), l2_bytes)
    sets += [(op.make_inputs(dims, dtype, device, gen), out_grad()) for _ in range(count - 1)]
    return sets


def _timed_calls(fn: Callable[..., Any], input_set: InputSet) -> dict[str, Callable[[], Any]]:
    """fwd (and fwdbwd where the set has output gradients) of ``fn`` on one input set."""
    inputs, out_grad = input_set
    leaves = [t for t in inputs if t.requires_grad]

    def fwd() -> Any:
        return fn(*inputs)

    def fwdbwd() -> None:
        for t in leaves:
            t.grad = None
        torch.autograd.backward(_as_tuple(fn(*inputs)), out_grad)

    return {"fwd": fwd} if out_grad is None else {"fwd": fwd, "fwdbwd": fwdbwd}


def kernel_work(op_name: str, shape: str, impl: str, device: str, seed: int = 0) -> Work:
    """One kernel op at one shape and implementation: checked against eager on input set 0 (not
    where an earlier run of this commit did, ``Settings.checked_in``), then fwd and fwd+bwd timed
    over a rotation of input sets (a cold L2; set 0 alone for the warm-L2 figure). ``info``
    records the bytes of one set (``set_bytes``), the device's L2 (``l2_bytes``), whether a set
    fits in it (``fits_l2``) and the number of sets rotated (``input_sets``)."""
    from optbench.measure.timing import l2_cache_bytes
    from optbench.suite.ops import OPS
    from optbench.suite.plan import kernel_dtype, kernel_skip_reason

    op = OPS[op_name]
    require_cuda(device, f"{op.name} at {shape}")
    skip_if(kernel_skip_reason(machine_profile(device), op_name, shape, impl))
    dtype = kernel_dtype(machine_profile(device), op_name)  # fp16 where the GPU has no bf16
    if impl.startswith("liger"):
        _require_liger()
    dims = op.shapes[shape]
    gen = torch.Generator(device=device).manual_seed(seed)
    fn = op.impl(impl, dims)
    baseline = op.impl(op.impls[0], dims)
    l2_bytes = l2_cache_bytes(device)
    sets = input_sets(op, dims, dtype, device, gen, fn, l2_bytes)
    leaves = [t for t in sets[0][0] if t.requires_grad]

    checked_in = current().checked_in
    check = partial(_check_kernel, op, f"{op.name}/{impl} at {shape}", fn, baseline, sets[0], dtype)
    per_set = [_timed_calls(fn, s) for s in sets]
    rotation = plant_slowdown(
        f"{op.name}/{impl}", {m: tuple(calls[m] for calls in per_set) for m in per_set[0]}
    )
    itemsize = dtype.itemsize

    def drop_grads() -> None:
        for t in leaves:
            t.grad = None

    one_set = set_bytes(sets[0])
    return Work(
        timed={m: fns[0] for m, fns in rotation.items()},
        rotation=rotation,
        check=None if checked_in else check,
        checked_in=checked_in,
        memory=tuple(rotation)[-1:],
        before_memory=drop_grads,
        flops=op.flops(dims),
        bytes=op.bytes(dims, itemsize),
        info={
            "dtype": str(dtype),
            "dims": dims,
            "device_clock": DEVICE_CLOCK,
            "set_bytes": one_set,
            "l2_bytes": l2_bytes,
            "fits_l2": one_set <= l2_bytes,
            "input_sets": len(sets),
        },
    )


def _require_liger() -> None:
    """Raise NotImplementedError (the case skips) where liger-kernel's ops cannot be imported."""
    try:
        from kernels.liger import liger

        liger("ops")
    except ImportError as exc:
        raise NotImplementedError("liger-kernel is not installed") from exc


def _check_kernel(
    op: Any,
    case: str,
    fn: Callable[..., Any],
    baseline: Callable[..., Any],
    input_set: InputSet,
    dtype: torch.dtype,
) -> dict[str, Any]:
    """``fn`` against the op's eager ``baseline`` on one input set of ``dtype``: the output's and
    each gradient's relative error against the baseline run one precision up (fp64 for fp32
    inputs, else fp32), within the op's tolerance (``op.rtol``, else ``KERNEL_RTOL[dtype]``);
    raises WrongResult, naming ``case``, over it."""
    inputs, out_grad = input_set
    ref_dtype = torch.float64 if dtype == torch.float32 else torch.float32
    ref_inputs = tuple(
        t.detach().to(ref_dtype).requires_grad_(t.requires_grad) if t.is_floating_point() else t
        for t in inputs
    )
    if op.name == "grad_stats":  # parameters carry their own gradients
        errs = grad_stats_errors(fn, baseline, inputs, ref_inputs)
    else:
        ref_grad = None if out_grad is None else tuple(g.to(ref_dtype) for g in out_grad)
        ref = _grads_and_output(baseline, ref_inputs, ref_grad)
        got = _grads_and_output(fn, inputs, out_grad)
        errs = [rel_err(g, r) for g, r in zip(got, ref)]
    tol = KERNEL_RTOL[dtype] if op.rtol is None else op.rtol
    if not max(errs) <= tol:
        raise WrongResult(f"{case}: rel. errors {errs} over tolerance {tol}")
    return {
        "max_rel_err": max(errs),
        "rel_errs": errs,
        "tolerance": tol,
        "reference": str(ref_dtype),
    }


def plant_slowdown(
    name: str, rotation: dict[str, tuple[Callable[[], Any], ...]]
) -> dict[str, tuple[Callable[[], Any], ...]]:
    """For the regression gate's own check only: ``OPTBENCH_PLANT_SLOWDOWN="rmsnorm/triton=0.10"``
    makes that case's timed callables (one per input set) 10% slower on the device (a GPU spin after
    each call, sized on the cold-L2 device time)."""
    spec = current().plant_slowdown
    target, _, fraction = spec.partition("=")
    if target != name or not torch.cuda.is_available():
        return rotation
    from optbench.measure.timing import measure

    probe = lambda: torch.cuda._sleep(1_000_000)  # noqa: E731
    cycles_per_ms = 1_000_000 / measure(probe, device="cuda").device.median_ms
    slowed = {}
    for metric, fns in rotation.items():
        cycles = int(float(fraction) * measure(fns, device="cuda").device.median_ms * cycles_per_ms)
        slowed[metric] = tuple(
            lambda fn=fn, cycles=cycles: (fn(), torch.cuda._sleep(cycles))[0] for fn in fns
        )
    return slowed


def matmul_work(n: int, mode: str, device: str, seed: int = 0) -> Work:
    """An n x n x n matmul in one precision mode (TF32 on/off for fp32), checked against float64."""
    require_cuda(device, "matmul precision modes")
    from optbench.measure.hardware import torch_dtype
    from optbench.suite.plan import matmul_skip_reason

    dtype, tf32 = torch_dtype(mode), mode == "tf32"
    skip_if(matmul_skip_reason(machine_profile(device), mode))
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(n, n, generator=gen, device=device).to(dtype)
    b = torch.randn(n, n, generator=gen, device=device).to(dtype)

    def mm() -> torch.Tensor:
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            return a @ b
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before

    def check() -> dict[str, Any]:
        rows = slice(0, 256)  # a row block against float64 is enough to catch a wrong mode
        err = rel_err(mm()[rows], a[rows].double() @ b.double())
        tol = {"fp32": 1e-5, "tf32": 3e-3, "bf16": 2e-2, "fp16": 5e-3}[mode]
        if not err <= tol:
            raise WrongResult(f"matmul {mode}: rel. error {err} over {tol}")
        return {"max_rel_err": err, "tolerance": tol, "reference": "torch.float64"}

    return Work(
        timed={"mm": mm},
        check=check,
        flops={"mm": 2.0 * n**3},
        bytes={"mm": 3.0 * n * n * dtype.itemsize},
        info={"dtype": mode, "dims": {"n": n}},
    )


# (size, reference options, candidate precision) -> models.step.Baseline: the high-precision
# reference run and the eager step's errors against it. Its reference (fp32 or fp64 gradients and
# weights: 8.8 GB at 1B) stays on the device where the memory estimate has room for it beside the
# steps built while it is in use (reference_home), and waits on the host otherwise and while
# another size's or reference's is in use: a 1B reference takes ~7 s to cross to the host and
# ~1.3 s back for each comparison on an H100 host (scripts/probes/reference_transfer.py).
_REFERENCES: dict[tuple, Any] = {}
# the least recently used goes first: most variants use eager's, kept by its use
_KEEP_REFERENCES = 3


def reference_home(config: Any, reference: Any, options: Any, device: str) -> str:
    """Where the check's reference for candidate ``options`` (against ``reference``) is kept:
    ``device`` where the memory estimate of the largest step built beside it (its high-precision
    step while it is copied, the eager step, the candidate), its own bytes (gradients and weights
    at the high precision) and what the process holds beyond the cached references (earlier
    cases' leftovers: :func:`held_beside_references`) fit the usable memory, else 'cpu'."""
    from models.config import param_count
    from models.step import high_precision
    from optbench.suite.memory_estimate import step_memory_bytes, usable_bytes

    usable = usable_bytes(machine_profile(device))
    if usable is None:
        return device
    high = high_precision(reference, options.precision)
    steps = (high, reference.replace(precision=options.precision), options)
    own = 2 * param_count(config) * (8 if high.precision == "fp64" else 4)
    need = own + max(step_memory_bytes(config, s) for s in steps)
    return device if held_beside_references(device) + need <= usable else "cpu"


def held_beside_references(device: str) -> int:
    """Bytes this process has allocated on ``device`` besides the cached references (which
    :func:`place_references` moves or the estimate counts): 0 without CUDA."""
    if not (str(device).startswith("cuda") and torch.cuda.is_available()):
        return 0
    cached = sum(reference_bytes(key, device) for key in _REFERENCES)
    return max(0, torch.cuda.memory_allocated(device) - cached)


def place_references(key: tuple, home: str) -> None:
    """Put the cached reference of ``key`` (if any) at its ``home`` and every other on the host:
    out of the device memory of the case about to be built, and the one it uses where its checks
    read it without a copy. Each moves only where it is not already in place."""
    for other, baseline in _REFERENCES.items():
        where = home if other == key else "cpu"
        if baseline.reference.device.type != torch.device(where).type:
            _REFERENCES[other] = dataclasses.replace(
                baseline, reference=baseline.reference.copy_to(where)
            )


def reference_bytes(key: tuple, device: str) -> int:
    """Bytes the check's reference of ``key`` keeps on ``device`` (0 where it waits on the host)."""
    baseline = _REFERENCES.get(key)  # none where building it failed
    if baseline is None or baseline.reference.device.type != torch.device(device).type:
        return 0
    return baseline.reference.nbytes


def step_options(size: str, variant: str, device: str):
    """(reference, candidate) StepOptions of ``variant`` at ``size`` on this machine: its baseline
    is ``optbench.suite.baseline.base_options`` (bf16 autocast, fp16 + GradScaler without bf16, fp32
    on a CPU; tiny at B=2, S=128; the batch halved until the memory estimate fits)."""
    from optbench.suite.baseline import step_pair

    return step_pair(machine_profile(device), size, variant)


# A training step on a GPU is timed after up to STEP_WARMUP_MS of steps and over at least
# STEP_REP_MS, so that its figure is that of the sustained clock, as in training; the forward, timed
# right after, finds the GPU in the same state. Under sustained load a power-capped GPU lowers its
# SM clock within about a second (an H100 SXM at its 700 W cap: ~1700 MHz, from a 1980 MHz boost),
# and a window of a few steps times the boost clock, a few percent fast. A step that stays clear of
# the cap keeps its clock: its warm-up ends once the GPU shows that
# (optbench.measure.machine.PowerSettle, at least half a second in; the host-bound 100M steps draw
# 290-560 W). A step held at the cap runs at a clock that swings over a second or so (1B on an
# H200: 104 to 112 ms and back within its 10 samples, their phase alike in every process), so the
# median of one second's samples moves with the swing's phase (+-1% between processes): such a step
# is timed over at least STEP_HELD_MIN_SAMPLES samples, three swings at 1B.
STEP_WARMUP_MS, STEP_REP_MS = 2000.0, 1000.0
STEP_HELD_MIN_SAMPLES = 30


def step_timing(device: str, info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``timing.measure``'s keywords for a training step's metrics (ours and the anchors'): on a
    GPU, the ``step`` metric's: at least STEP_REP_MS of samples after STEP_WARMUP_MS of steps, or
    fewer where PowerSettle finds the GPU not held back (the warm-up's ms then go to
    ``info['step_warmup_ms']``); at least STEP_HELD_MIN_SAMPLES samples where it never does. On a
    CPU (no boost to wait out) the default budgets, and the ``step`` and ``forward`` samples timed
    by the CPU time of the thread that runs them (``time.thread_time``; ``measure`` runs them on one
    torch thread): on a CPU that other processes share, a step's wall time also counts the time the
    scheduler gives its core to them, which moves a tiny step's median several times over between
    two processes of the same code."""
    if not str(device).startswith("cuda"):
        return {metric: {"clock": time.thread_time} for metric in ("step", "forward")}
    from optbench.measure.machine import PowerSettle

    settle = PowerSettle(on_settled=lambda ms: info.__setitem__("step_warmup_ms", round(ms, 1)))
    return {
        "step": {
            "warmup_ms": STEP_WARMUP_MS,
            "rep_ms": STEP_REP_MS,
            "settled": settle,
            "held_min_reps": STEP_HELD_MIN_SAMPLES,
        }
    }


def step_work(size: str, variant: str, device: str, seed: int = 0) -> Work:
    """One training step of ``size`` with ``variant`` on: checked against its baseline, then
    timed; where an earlier run of this commit checked it (``Settings.checked_in``), neither the
    check nor its reference is built."""
    from models.config import CONFIGS
    from models.step import UnsupportedOptions, build_step, check_against
    from optbench.suite.baseline import baseline_notes
    from optbench.suite.plan import step_skip_reason

    profile = machine_profile(device)
    skip_if(step_skip_reason(profile, size, variant))
    reference, options = step_options(size, variant, device)
    config, key = CONFIGS[size], (size, reference, options.precision)
    checked_in = current().checked_in
    try:
        if checked_in is None:
            _prepare_reference(key, config, reference, options, device, seed, profile)
        step = build_step(config, options, device, seed, profile=profile)
    except UnsupportedOptions as exc:
        raise NotImplementedError(str(exc)) from exc

    def check() -> dict[str, Any]:
        result = check_against(_REFERENCES[key], step)
        if not result.ok:
            raise WrongResult(f"step {size}/{variant}: {result.record()}")
        return result.record()

    info = {
        "tokens": step.tokens_per_step,
        "primary_clock": "wall",
        "precision": options.precision,
        "batch_size": options.batch_size,
        "seq_len": options.seq_len,
        "params": sum(p.numel() for p in step.params),
        "baseline_notes": baseline_notes(profile, size),
    }
    return Work(
        timed={"step": step, "forward": step.forward_loss},
        check=None if checked_in else check,
        checked_in=checked_in,
        memory=("step",),
        flops={"step": float(step.flops_per_step)},
        graph=False,
        timing=step_timing(device, info),
        info=info,
    )


def _prepare_reference(
    key: tuple, config: Any, reference: Any, options: Any, device: str, seed: int, profile: Any
) -> None:
    """The check's baseline of ``key`` (:func:`models.step.baseline_of`) in ``_REFERENCES``, built
    where it is missing, at its home (:func:`reference_home`), the least recently used dropped."""
    from models.step import baseline_of, build_step

    home = reference_home(config, reference, options, device)
    if key in _REFERENCES:
        _REFERENCES[key] = _REFERENCES.pop(key)  # now the most recently used
    while key not in _REFERENCES and len(_REFERENCES) >= _KEEP_REFERENCES:
        del _REFERENCES[next(iter(_REFERENCES))]  # a 1B reference is 8.8 GB of host memory
    # the check's reference is not the step's memory (records.CaseMemory.reference_bytes)
    with not_counted(kept=lambda: reference_bytes(key, device)):
        place_references(key, home)
        if key not in _REFERENCES:
            _REFERENCES[key] = baseline_of(
                lambda opts: build_step(config, opts, device, seed, profile=profile),
                reference,
                options.precision,
                host=home == "cpu",
            )
