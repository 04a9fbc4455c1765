"""What a machine can run: one decision for ``optbench plan`` and for the workloads at run time.

``optbench plan --gpu t4`` lists every case of the asv suite (benchmark x params) with 'run' or
'skip', the reason, and its *datasheet floor*: the roofline lower bound from the profile's datasheet
peaks (``optbench.measure.roofline.floor_ms``), never a measurement. The workloads call the same
``*_skip_reason`` functions with the profile they run under
(``optbench.measure.emulate.active_profile``), so a plan and a run agree.

Skip reasons read '<category>: <detail>'; categories: no CUDA, no bf16, no TF32, no Triton, no FP8
(FP8 matmuls without FP8 tensor cores: T4, A100, a CPU), same as eager, unsupported
(``models.step.validate``), memory. A convergence case (``optbench.suite.convergence``) skips where
its variant's step or the eager step would.

The memory estimates behind the 'memory' skips are ``optbench.suite.memory_estimate``'s; the step
baseline each variant builds on is ``optbench.suite.baseline``'s.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass

import torch

from models.config import CONFIGS, flops_per_token, param_count
from models.step import StepOptions, UnsupportedOptions, validate
from models.variants import reference
from optbench.measure.hardware import PROFILES, HardwareProfile, dtype_name, lookup, torch_dtype
from optbench.measure.roofline import Ceilings, floor_ms
from optbench.run.console import console, table
from optbench.run.helptext import plain
from optbench.suite import catalog
from optbench.suite.baseline import base_options, baseline_notes, step_pair
from optbench.suite.memory_estimate import (
    STATE_BYTES,
    gb,
    kernel_bytes,
    memory_remedy,
    over_usable,
    step_memory_bytes,
    usable_bytes,
)
from optbench.suite.ops import OPS

GPU_ALIASES = {"h100": "h100-sxm"}


@dataclass(frozen=True)
class PlanRow:
    """One case of the suite on one machine; floor_ms is the datasheet floor (None if skipped or
    unknown)."""

    benchmark: str
    params: dict[str, str]
    action: str  # 'run' | 'skip'
    reason: str  # why it skips, or a note on how it runs ('' if none)
    floor_ms: float | None


def _sm(profile: HardwareProfile) -> str:
    return (
        "sm" + "".join(map(str, profile.compute_capability))
        if profile.compute_capability
        else "no CUDA"
    )


def _device(profile: HardwareProfile) -> str:
    return f"{profile.name} ({_sm(profile)})"


def _cuda_reason(profile: HardwareProfile, what: str) -> str | None:
    return (
        None
        if profile.compute_capability
        else f"no CUDA: {what} needs a CUDA GPU, not a {profile.name}"
    )


def _precision_reason(profile: HardwareProfile, precision: str, what: str) -> str | None:
    if precision == "bf16" and not profile.supports_bf16:
        return f"no bf16: {what} is bf16; {_device(profile)} has no bf16 hardware"
    if precision == "tf32" and not profile.supports_tf32:
        return f"no TF32: {what} uses TF32; {_device(profile)} has no TF32 tensor cores (sm80+)"
    return None


def _fp8_reason(profile: HardwareProfile, options: StepOptions, what: str) -> str | None:
    """FP8 matmuls (torchao's float8 training or ours) on a device without FP8 tensor cores
    (sm89+)."""
    if options.fp8 == "off" or profile.fp8:
        return None
    whose = "torchao float8" if options.fp8_linear == "torchao" else "optbench's Triton casts"
    return (
        f"no FP8: {what} runs FP8 matmuls ({whose}, {options.fp8} scaling); "
        f"{_device(profile)} has no FP8 tensor cores (sm89+)"
    )


def _triton_reason(profile: HardwareProfile, users: list[str]) -> str | None:
    """Triton (ours, Liger-Kernel's, inductor's) on a GPU architecture it does not support."""
    if not users or not profile.compute_capability or profile.triton:
        return None
    return f"no Triton: {', '.join(users)} runs Triton kernels, which {_device(profile)} cannot run"


def _first(*reasons: str | None) -> str | None:
    return next((r for r in reasons if r), None)


# --- kernels
# ------------------------------------------------------------------------------------------------


def _kernel_memory_reason(profile: HardwareProfile, op: str, shape: str, impl: str) -> str | None:
    usable = usable_bytes(profile)
    if usable is None or (need := kernel_bytes(op, shape, impl)) <= usable:
        return None
    return f"memory: {op}/{impl} at {shape} holds {over_usable(need, usable, profile)}"


def kernel_dtype(profile: HardwareProfile, op: str) -> torch.dtype:
    """The dtype ``op`` is measured in on ``profile``: its own (bf16 for the model's kernels), or
    fp16 where the GPU has no bf16 (a T4), as the step's baseline does there."""
    dtype = OPS[op].dtype
    return torch.float16 if dtype == torch.bfloat16 and not profile.supports_bf16 else dtype


def kernel_skip_reason(profile: HardwareProfile, op: str, shape: str, impl: str) -> str | None:
    """Why ``op`` at ``shape`` with ``impl`` cannot run on ``profile``; None if it can."""
    what = f"{op}/{impl}"
    # inductor, ours, Liger-Kernel
    needs_triton = impl == "compile" or impl.startswith(("triton", "liger"))
    dtype = dtype_name(kernel_dtype(profile, op))
    return _first(
        _cuda_reason(profile, what),
        _precision_reason(profile, dtype, what),
        _triton_reason(profile, [what] if needs_triton else []),
        _kernel_memory_reason(profile, op, shape, impl),
    )


def matmul_skip_reason(profile: HardwareProfile, mode: str) -> str | None:
    """Why the matmul in precision ``mode`` ('fp32', 'tf32', 'bf16', 'fp16') cannot run on
    ``profile``."""
    what = f"the {mode} matmul"
    return _first(_cuda_reason(profile, what), _precision_reason(profile, mode, what))


# --- training steps
# -----------------------------------------------------------------------------------------


def _step_memory_reason(profile: HardwareProfile, size: str, options: StepOptions) -> str | None:
    cfg, usable = CONFIGS[size], usable_bytes(profile)
    need = step_memory_bytes(cfg, options)
    if usable is None or need <= usable:
        return None
    states = gb(STATE_BYTES * param_count(cfg))
    return (
        f"memory: {size} at B={options.batch_size}, S={options.seq_len} ({options.precision}), "
        f"with {states} of fp32 weights, grads and AdamW states, needs "
        f"{over_usable(need, usable, profile)}; {memory_remedy(cfg, options, usable)}"
    )


def _triton_users(options: StepOptions) -> list[str]:
    """The switches of ``options`` that run Triton kernels (ours, Liger-Kernel's, inductor's)."""
    switches = {
        "norm": options.norm,
        "mlp": options.mlp,
        "qk_norm": options.qk_norm,
        "loss": options.loss,
    }
    users = [f"{k}={v}" for k, v in switches.items() if v in ("triton", "liger", "fused")]
    return users + ([f"compile={options.compile}"] if options.compile else [])


def _validate_reason(profile: HardwareProfile, *options: StepOptions) -> str | None:
    device = "cuda" if profile.compute_capability else "cpu"
    try:
        for opts in options:
            validate(opts, device, profile)
    except UnsupportedOptions as exc:
        return f"unsupported: {exc}"
    return None


def step_skip_reason(profile: HardwareProfile, size: str, variant: str) -> str | None:
    """Why the training step of ``size`` with ``variant`` cannot run on ``profile``; None if it
    can."""
    reference_options, candidate = step_pair(profile, size, variant)
    what = f"{size}/{variant}"
    same = reference(variant) != variant and candidate == reference_options
    return _first(
        _precision_reason(profile, reference_options.precision, f"{what}'s reference"),
        _precision_reason(profile, candidate.precision, what),
        _triton_reason(profile, _triton_users(candidate)),
        _fp8_reason(profile, candidate, what),
        f"same as eager: {variant} changes nothing on this machine's baseline" if same else None,
        _validate_reason(profile, reference_options, candidate),
        _step_memory_reason(profile, size, reference_options),
        _step_memory_reason(profile, size, candidate),
    )


def distributed_step_variant(variant: str) -> str:
    """The single-GPU step variant (models.variants) that the distributed ``variant`` wraps:
    'ddp-best' -> 'best'."""
    return catalog.DISTRIBUTED_VARIANTS[variant][1]


def distributed_skip_reason(
    profile: HardwareProfile, size: str, variant: str, world: int
) -> str | None:
    """Why the ``world``-GPU step of the distributed ``variant`` cannot run on ``profile``: where
    its single-GPU step cannot (a profile does not say how many GPUs a machine has: the case itself
    skips where it has fewer than ``world``), or on a CPU (the suite launches one process per
    GPU)."""
    return _first(
        _cuda_reason(profile, f"the {world}-GPU step of {size}/{variant}"),
        step_skip_reason(profile, size, distributed_step_variant(variant)),
    )


def convergence_skip_reason(profile: HardwareProfile, size: str, variant: str) -> str | None:
    """Why the convergence check of ``variant`` at ``size`` cannot run on ``profile``: where its
    step, or the eager step whose seeds it is compared with, cannot (optbench.suite.convergence); a
    model larger than tiny (what a CPU runs) needs a GPU to train for hundreds of steps."""
    what = f"the convergence check of {size}/{variant}"
    return _first(
        _cuda_reason(profile, what) if size != "tiny" else None,
        step_skip_reason(profile, size, "eager"),
        step_skip_reason(profile, size, variant),
    )


def anchor_skip_reason(profile: HardwareProfile, size: str) -> str | None:
    """Why the HF + torch.compile anchor of ``size`` (optbench.suite.anchors) cannot run on
    ``profile``: it needs CUDA and bf16, and what our compiled step of the size needs (Triton,
    memory at the baseline's batch)."""
    what = f"the HF anchor at {size}"
    return _first(
        _cuda_reason(profile, what),
        _precision_reason(profile, "bf16", what),
        step_skip_reason(profile, size, "compile-default"),
    )


def _step_note(profile: HardwareProfile, size: str, variant: str) -> str:
    causal = step_pair(profile, size, variant)[1].attn_mask == "is_causal"
    if causal and profile.compute_capability and not profile.flash_attention:
        return f"SDPA: memory-efficient attention (no FlashAttention on {_sm(profile)})"
    return ""


# --- floors and the plan
# ------------------------------------------------------------------------------------


def expected_floor_ms(
    profile: HardwareProfile, benchmark: str, params: dict[str, str]
) -> float | None:
    """Datasheet floor in ms (roofline from the profile's datasheet peaks; not a measurement) of the
    case's lead metric: fwd+bwd for kernels with a backward, else fwd; the matmul; one optimizer
    step (its model FLOPs, models.config.flops_per_token, at the step's precision). None where a
    peak is unknown."""
    ceilings, entry = Ceilings.from_profile(profile), catalog.benchmark(benchmark)
    if entry.kind in ("cpu", "convergence"):  # untimed, or not a time
        return None
    if entry.kind == "kernel":
        op, dtype = OPS[entry.op], kernel_dtype(profile, entry.op)
        dims, metric = op.shapes[params["shape"]], "fwdbwd" if op.backward else "fwd"
        flops, nbytes = op.flops(dims)[metric], op.bytes(dims, dtype.itemsize)[metric]
        return floor_ms(flops, nbytes, ceilings, dtype_name(dtype))
    if entry.kind == "matmul":
        n, itemsize = int(params["n"]), torch_dtype(params["mode"]).itemsize
        return floor_ms(2.0 * n**3, 3.0 * n * n * itemsize, ceilings, params["mode"])
    size, variant = params.get("size", entry.size), params.get("variant", "eager")
    if entry.kind == "distributed":  # per GPU: each rank's step at the single-GPU batch
        variant = distributed_step_variant(variant)
    options = step_pair(profile, size, variant)[1]
    flops = flops_per_token(CONFIGS[size], options.seq_len) * options.batch_size * options.seq_len
    return floor_ms(flops, 0.0, ceilings, options.precision)


def skip_reason(profile: HardwareProfile, benchmark: str, params: dict[str, str]) -> str | None:
    """Why one case of the suite cannot run on ``profile``, by its benchmark's kind; None if it
    can."""
    entry = catalog.benchmark(benchmark)
    if entry.kind == "kernel":
        return kernel_skip_reason(profile, entry.op, params["shape"], params["impl"])
    if entry.kind == "matmul":
        return matmul_skip_reason(profile, params["mode"])
    if entry.kind == "anchor":
        return anchor_skip_reason(profile, params["size"])
    if entry.kind == "cpu":
        return None
    if entry.kind == "convergence":
        return convergence_skip_reason(profile, entry.size, params["variant"])
    if entry.kind == "distributed":
        return distributed_skip_reason(
            profile, entry.size, params["variant"], int(params["world_size"])
        )
    return step_skip_reason(profile, entry.size, params["variant"])


def plan(profile: HardwareProfile, suite: str = "full") -> list[PlanRow]:
    """Every case of ``suite`` on ``profile``: run or skip, why, and its datasheet floor."""
    rows = []
    for benchmark, params in catalog.suite_cases(suite):
        reason = skip_reason(profile, benchmark, params)
        if reason:
            rows.append(PlanRow(benchmark, params, "skip", reason, None))
            continue
        entry = catalog.benchmark(benchmark)
        note = _step_note(profile, entry.size, params["variant"]) if entry.kind == "step" else ""
        rows.append(
            PlanRow(benchmark, params, "run", note, expected_floor_ms(profile, benchmark, params))
        )
    return rows


def skip_counts(rows: list[PlanRow]) -> Counter[str]:
    """Skipped cases per reason category (the text before the first ':')."""
    return Counter(row.reason.split(":", 1)[0] for row in rows if row.action == "skip")


# --- command line
# -------------------------------------------------------------------------------------------


def _describe(profile: HardwareProfile) -> str:
    memory = f", {profile.mem_gb:g} GB" if profile.mem_gb else ""
    return f"{profile.name} ({profile.key}{memory}, {_sm(profile)})"


def _baseline_lines(profile: HardwareProfile, rows: list[PlanRow]) -> list[str]:
    """One line per model size in the plan: its step baseline and why it departs from the
    default."""
    steps = (catalog.benchmark(r.benchmark) for r in rows)
    sizes = dict.fromkeys(b.size for b in steps if b.kind == "step")
    lines = []
    for size in sizes:
        base = base_options(profile, size)
        peak = gb(step_memory_bytes(CONFIGS[size], base))
        notes = "".join(f"; {note}" for note in baseline_notes(profile, size))
        shape = f"B={base.batch_size}, S={base.seq_len}"
        lines.append(f"{size}: {base.precision}, {shape}, peak ~{peak} (estimate){notes}")
    return lines


def _summary(profile: HardwareProfile, suite: str, rows: list[PlanRow]) -> list[str]:
    skips = skip_counts(rows)
    head = (
        f"{_describe(profile)}, {suite} suite: {len(rows)} cases, {len(rows) - skips.total()} run, "
        f"{skips.total()} skip"
    )
    return [
        head,
        *(f"skip ({category}): {n}" for category, n in skips.most_common()),
        *(f"step baseline {line}" for line in _baseline_lines(profile, rows)),
        *(
            [f"kernels in fp16: {profile.name} has no bf16"]
            if profile.compute_capability
            and not profile.supports_bf16
            and any(catalog.kind(r.benchmark) == "kernel" for r in rows)
            else []
        ),
    ]


def _markdown(profile: HardwareProfile, suite: str, rows: list[PlanRow]) -> str:
    head, *rest = _summary(profile, suite, rows)
    skipped = [
        (r.benchmark, ", ".join(r.params.values()), r.reason) for r in rows if r.action == "skip"
    ]
    details = [
        "",
        f"<details><summary>{len(skipped)} skipped cases</summary>",
        "",
        table(("benchmark", "params", "skip reason"), skipped, "markdown"),
        "",
        "</details>",
    ]
    return "\n".join(
        [f"**{head}**", "", *(f"- {line}" for line in rest), *(details if skipped else [])]
    )


def _print_table(profile: HardwareProfile, suite: str, rows: list[PlanRow]) -> None:
    floor = "datasheet floor ms"
    cells = [
        (
            r.benchmark,
            ", ".join(r.params.values()),
            r.action,
            r.reason,
            "-" if r.floor_ms is None else f"{r.floor_ms:.3g}",
        )
        for r in rows
    ]
    out = console()
    out.print(
        table(
            ("benchmark", "params", "plan", "reason / note", floor),
            cells,
            title=f"optbench plan: {_describe(profile)}, {suite} suite",
            right=(floor,),
        )
    )
    out.print("\n".join(_summary(profile, suite, rows)))
    out.print("Floors are datasheet floors: roofline bounds from vendor peaks, not measurements.")


def main(argv: list[str] | None = None) -> int:
    """``optbench plan``: what each case of the suite does on a GPU (default: this machine's)."""
    p = argparse.ArgumentParser(prog="optbench plan", description=plain(main.__doc__))
    p.add_argument(
        "--gpu",
        choices=sorted({*GPU_ALIASES, *PROFILES}),
        help="hardware profile ('h100' = 'h100-sxm'); default: this machine, or what it emulates",
    )
    p.add_argument(
        "--suite", choices=["quick", "full", "sweep", "ablation", "convergence"], default="full"
    )
    p.add_argument("--markdown", action="store_true", help="summary and skipped cases as Markdown")
    args = p.parse_args(argv)
    if args.gpu:
        profile = lookup(GPU_ALIASES.get(args.gpu, args.gpu))
    else:
        from optbench.measure.emulate import active_profile

        profile = active_profile()
    rows = plan(profile, args.suite)
    if args.markdown:
        print(_markdown(profile, args.suite, rows))
    else:
        _print_table(profile, args.suite, rows)
    return 0
