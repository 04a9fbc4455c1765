"""The training step's variants: plain data, importable without torch (which variants each benchmark
grid measures is in ``optbench.suite.catalog``).

A variant is one optimization switched on from its reference (:func:`reference`), itself a variant:
'eager' (the baseline ``models.step.BASELINE``) unless its entry names another. 'eager' and the
reference models (a model of their own, such as 'qknorm') are their own reference. ``best-*`` are
our best combinations (reference: eager); ``best-kernels-without-<switch>`` are generated: the
leave-one-out ablation of best-kernels (:data:`ABLATION`).

Numerics (:func:`numerics`): a variant is 'exact' (the default) when it computes what its reference
computes up to rounding: its step check (``models.step.check_against``: 3 steps against a
higher-precision reference, within 2.5x the eager step's own error) decides whether it is right. An
entry ``"numerics": "convergence"`` marks a variant that changes the numerics on purpose (FP8
matmuls, 8-bit optimizer states, bf16 weights with fp32 masters): rounding is not all that differs,
so whether it is right is decided by the convergence check (``optbench.suite.convergence``: a few
hundred steps of training against the spread of eager seeds), which the convergence suite runs for
it. Its step check still runs in the step grids, to catch broken plumbing: at the exact tolerance
where it passes it (the 8-bit and master AdamW on an H100), at the loose
``models.step.FP8_CHECK_TOLERANCE`` for FP8 matmuls (which would fail the exact one).
"""

from typing import Any

# torch.compile modes in which inductor captures CUDA graphs
GRAPHED_COMPILE_MODES = ("reduce-overhead", "max-autotune")

# The compiled-and-graphed best combinations, each one change on top of the one before.
_COMPILE_GRAPH = {
    "grad_stats": "foreach",
    "optimizer": "fused",
    "item_sync": False,
    "attn_mask": "is_causal",
    "compile": "default",
    "cuda_graph": True,
}
_MASTER = {**_COMPILE_GRAPH, "optimizer": "master"}
_FUSED = {**_MASTER, "fused_proj": True}
_KERNELS = {**_FUSED, "norm": "triton", "mlp": "triton", "rope": "triton"}

# Name -> the StepOptions overrides that turn one optimization on, on top of its reference's
# options. An optional "reference" entry names the variant it is checked and timed against (default
# 'eager'; see models.step.variant_options): tf32 against fp32; triton-qknorm against an eager
# QK-norm model; cuda-graph against a step that already has its prerequisites, so only the graph is
# measured; triton-rope against the eager RoPE of the same fused model. A variant that names itself
# is a reference model of its own.
VARIANTS: dict[str, dict] = {
    "fp32": {"precision": "fp32"},  # a de-optimization: fp32 against the bf16-autocast baseline
    "tf32": {"precision": "tf32", "reference": "fp32"},
    "fp16-scaler": {"precision": "fp16"},
    "triton-norm": {"norm": "triton"},
    "triton-swiglu": {"mlp": "triton"},
    # The eager model with QK-norm: a model of its own (its own reference, as eager is),
    # triton-qknorm's reference.
    "qknorm": {"qk_norm": "eager", "reference": "qknorm"},
    "triton-qknorm": {"qk_norm": "triton", "reference": "qknorm"},
    "liger-norm": {"norm": "liger"},
    "liger-swiglu": {"mlp": "liger"},
    "chunked-ce": {"loss": "chunked"},
    "fused-ce": {"loss": "fused"},
    "liger-flce": {"loss": "liger"},
    "checkpoint": {"checkpoint_every": 1},
    "foreach-stats": {"grad_stats": "foreach"},
    "foreach-adamw": {"optimizer": "foreach"},
    "fused-adamw": {"optimizer": "fused"},
    # 1-byte moments, block-wise scaled
    "adamw-8bit": {"optimizer": "adamw8bit", "numerics": "convergence"},
    # bf16 weights, fp32 masters in our one-pass Triton AdamW
    "master-adamw": {"optimizer": "master", "numerics": "convergence"},
    "no-item-sync": {"item_sync": False},
    "cached-mask": {"attn_mask": "cached"},
    "sdpa-causal": {"attn_mask": "is_causal"},
    "fused-proj": {"fused_proj": True},  # one GEMM for q, k, v and one for gate, up
    # RoPE in Triton out of the packed q/k/v projection, against the eager RoPE of the same fused
    # model.
    "triton-rope": {"rope": "triton", "reference": "fused-proj"},
    # What a captured step needs: capturable fused AdamW, no item sync, is_causal (no mask built on
    # the host).
    "graph-prereqs": {"optimizer": "fused", "item_sync": False, "attn_mask": "is_causal"},
    "cuda-graph": {"cuda_graph": True, "reference": "graph-prereqs"},
    "compile-default": {"compile": "default"},
    "compile-reduce-overhead": {"compile": "reduce-overhead"},
    "compile-max-autotune": {"compile": "max-autotune"},
    "compile-max-autotune-no-cudagraphs": {"compile": "max-autotune-no-cudagraphs"},
    # Regional compilation: each block compiled on its own (one graph shared by all but the first),
    # not the model.
    "compile-regional": {"compile": "default", "compile_scope": "blocks"},
    # Our best combinations, three ways: Triton kernels + our fused linear CE under torch.compile;
    # inductor's own fusions of the eager model; Triton kernels in one captured CUDA graph (no
    # compile time).
    "best": {
        "precision": "bf16",
        "norm": "triton",
        "mlp": "triton",
        "loss": "fused",
        "grad_stats": "foreach",
        "optimizer": "fused",
        "item_sync": False,
        "attn_mask": "is_causal",
        "compile": "default",
    },
    "best-inductor": {
        "grad_stats": "foreach",
        "optimizer": "fused",
        "item_sync": False,
        "attn_mask": "is_causal",
        "compile": "default",
    },
    "best-graph": {
        "norm": "triton",
        "mlp": "triton",
        "loss": "fused",
        "grad_stats": "foreach",
        "optimizer": "fused",
        "item_sync": False,
        "attn_mask": "is_causal",
        "cuda_graph": True,
    },
    # inductor's fusions and no host in the loop: the compiled forward/backward and the optimizer in
    # one graph.
    "best-compile-graph": _COMPILE_GRAPH,
    # best-compile-graph with bf16 weights and our AdamW over fp32 masters (no weight or gradient
    # casts).
    "best-master": _MASTER,
    # best-master with the fused projections: fewer, larger GEMMs (the small k/v projections run
    # slowest).
    "best-fused": _FUSED,
    # best-fused with our Triton kernels: the RMSNorm adds the residual in its pass and, backward,
    # writes the residual gradient in fp32 and bf16 at once (inductor casts it in a pass of its
    # own); SwiGLU and RoPE read the packed gate/up and q/k/v outputs in place and write their
    # gradients in one piece (inductor concatenates the parts' gradients in passes of their own).
    "best-kernels": _KERNELS,
    # best-compile-graph with regional compilation: compile time that does not grow with depth.
    "best-regional": {**_COMPILE_GRAPH, "compile_scope": "blocks"},
    # FP8 matmuls in the blocks' Linear layers through torchao's float8 training
    # (models.step.to_float8), eager otherwise: per-tensor scales (the fastest recipe) or per-row
    # power-of-two scales (the more accurate one).
    "fp8-tensorwise": {"fp8": "tensorwise", "numerics": "convergence"},
    "fp8-rowwise": {"fp8": "rowwise", "numerics": "convergence"},
    # best-kernels with FP8 matmuls: torchao's casts fused by torch.compile, in the captured step.
    "best-kernels-fp8-tensorwise": {**_KERNELS, "fp8": "tensorwise", "numerics": "convergence"},
    "best-kernels-fp8-rowwise": {**_KERNELS, "fp8": "rowwise", "numerics": "convergence"},
    # best-kernels-fp8-tensorwise with fast accumulation in the backward GEMMs too (torchao's:
    # forward only).
    "best-kernels-fp8-tensorwise-fast-accum": {
        **_KERNELS,
        "fp8": "tensorwise",
        "fp8_fast_accum": True,
        "numerics": "convergence",
    },
    # best-kernels-fp8-tensorwise-fast-accum with our FP8 Linear layers (kernels.fp8_linear): the
    # same recipe, each operand cast in both layouts in one Triton pass.
    "best-kernels-fp8-triton": {
        **_KERNELS,
        "fp8": "tensorwise",
        "fp8_fast_accum": True,
        "fp8_linear": "triton",
        "numerics": "convergence",
    },
}


# Option -> the options it needs set as the combination sets them (models.step.validate's rules, as
# data; tests/test_step.py holds them to validate): setting one of those back to the baseline's
# removes it too.
NEEDS: dict[str, tuple[str, ...]] = {"rope": ("fused_proj",), "cuda_graph": ("item_sync",)}
# the combination whose leave-one-out ablation the Ablation<size> grids measure
ABLATED = "best-kernels"


def reference(name: str) -> str:
    """The variant that ``name`` is checked and timed against: its entry's "reference", else
    'eager'."""
    return "eager" if name == "eager" else VARIANTS[name].get("reference", "eager")


NUMERICS = ("exact", "convergence")
_NOT_OPTIONS = ("reference", "numerics")  # an entry's keys that are not StepOptions overrides


def switches(name: str) -> dict[str, Any]:
    """The StepOptions overrides of ``name`` on top of its reference's options ({} for 'eager')."""
    return (
        {}
        if name == "eager"
        else {k: v for k, v in VARIANTS[name].items() if k not in _NOT_OPTIONS}
    )


def numerics(name: str) -> str:
    """What decides whether ``name`` is right (module docstring): 'exact', its step check;
    'convergence', the convergence check (it changes the numerics on purpose)."""
    return "exact" if name == "eager" else VARIANTS[name].get("numerics", "exact")


def switch_name(option: str, value: Any) -> str:
    """The variant that sets ``option`` to ``value`` and nothing else ('triton-norm' for
    norm='triton'), else 'option=value'."""
    return next(
        (name for name in VARIANTS if switches(name) == {option: value}), f"{option}={value}"
    )


def _needing(options: dict[str, Any], option: str) -> list[str]:
    """The options of ``options`` that need ``option`` (NEEDS), directly or through one another, in
    order."""
    gone = {option}
    while more := {k for k in options if k not in gone and gone & set(NEEDS.get(k, ()))}:
        gone |= more
    return [k for k in options if k in gone - {option}]


def leave_one_out(best: str) -> dict[str, tuple[str, ...]]:
    """``<best>-without-<switch>`` for each option that ``best`` sets -> the options it sets back to
    the baseline's: that one, then those that need it (:data:`NEEDS`), which the combination cannot
    keep."""
    options = switches(best)
    return {
        f"{best}-without-{switch_name(k, v)}": (k, *_needing(options, k))
        for k, v in options.items()
    }


ABLATION = leave_one_out(ABLATED)
# Switches that change the numerics on purpose, each added alone on top of best-kernels in the
# ablation grids: what it is worth inside the best step (its convergence check says whether it may
# be used).
ADDED = ("best-kernels-fp8-tensorwise",)


def added_note(name: str) -> str:
    """What the variant ``name`` of :data:`ADDED` adds to best-kernels, in words: 'best-kernels with
    fp8-tensorwise'."""
    extra = {k: v for k, v in switches(name).items() if switches(ABLATED).get(k) != v}
    return f"{ABLATED} with " + ", ".join(switch_name(k, v) for k, v in extra.items())


def ablation_note(name: str) -> str:
    """What the variant ``name`` of :data:`ABLATION` leaves out of best-kernels, in words."""
    first, *rest = ABLATION[name]
    options = switches(ABLATED)
    note = f"{ABLATED} without {switch_name(first, options[first])}"
    if rest:
        needing = ", ".join(switch_name(k, options[k]) for k in rest)
        note += f"; also without {needing}, which {'needs' if len(rest) == 1 else 'need'} it"
    return note


VARIANTS.update(
    {
        name: {k: v for k, v in switches(ABLATED).items() if k not in removed}
        for name, removed in ABLATION.items()
    }
)
