"""One training step of the decoder; every optimization is a switch of :class:`StepOptions`.

The defaults of ``StepOptions`` are the eager baseline, the seeds' slow training loop: bf16
autocast, eager kernels, full-logits cross-entropy, a Python loop for gradient statistics and AdamW,
``loss.item()`` every step, and a causal mask rebuilt on every forward. :data:`VARIANTS` names the
overrides that turn one switch on; :func:`build_step` builds a :class:`TrainStep` (model, AdamW,
fixed random batch).
:func:`check_against` checks a candidate step against a high-precision reference run from the same
init and batch (:func:`baseline_of`), with tolerances from the eager step's own error against it, in
the same run. FP8 matmuls (``fp8``, torchao's float8 training) change the numerics on purpose: their
check is the loose
:data:`FP8_CHECK_TOLERANCE`, and whether they train like eager is the convergence check's call
(``optbench.suite.convergence``; ``models.variants.numerics``).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import importlib.util
import os
import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import torch
import torch._functorch.config
from torch import Tensor

from kernels.adamw import MasterAdamW
from kernels.grad_stats import clip_coefficient
from kernels.numerics import rel_err
from models.config import ModelConfig, flops_per_token
from models.model import Decoder, FusedLinear
from models.variants import (  # noqa: F401 (VARIANTS, GRAPHED_COMPILE_MODES: re-exported)
    GRAPHED_COMPILE_MODES,
    VARIANTS,
    reference,
    switches,
)

LR, WEIGHT_DECAY, MAX_GRAD_NORM = 1e-4, 0.1, 1.0  # what a step trains with (TrainStep.hyper)
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# FP8 tensor cores (torch._scaled_mm): Ada sm89, Hopper sm90, Blackwell sm100/sm120
FP8_MIN_CC = (8, 9)

# A compiled step with our kernels' autograd Functions (or torchao's float8 one) may reuse
# AOTAutograd's cached forward/backward on a warm cache; by default torch bypasses that cache for
# any graph holding a custom autograd Function and traces and partitions the joint graph again on
# every compile. The cache is keyed on the graph dynamo traced, which holds each Function's forward
# and backward as traced, and our Triton launches are opaque custom ops called by name when the step
# runs: nothing a Function does is left out of the key.
torch._functorch.config.autograd_cache_allow_custom_autograd_functions = True

Precision = Literal["fp64", "fp32", "tf32", "bf16", "fp16"]
Fp8Recipe = Literal["off", "tensorwise", "rowwise"]
Fp8Linear = Literal["torchao", "triton"]
KernelImpl = Literal["eager", "triton", "liger"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


class UnsupportedOptions(ValueError):
    """Options that this device, or the combination itself, cannot run; raised at build time."""


@dataclass(frozen=True)
class StepOptions:
    """Switches of one training step; the defaults are the eager baseline."""

    # bf16/fp16: autocast (fp16 with a GradScaler); tf32: fp32, TF32 matmuls; fp64: the check's
    # reference
    precision: Precision = "bf16"
    norm: KernelImpl = "eager"  # RMSNorm layers
    mlp: KernelImpl = "eager"  # SwiGLU activation
    qk_norm: Literal["eager", "triton"] | None = None  # None: the model has no QK-norm
    loss: Literal["eager", "chunked", "fused", "liger"] = "eager"  # LM head + cross-entropy
    checkpoint_every: int = 0  # activation checkpointing of every k-th block; 0: off
    # grad/param norms and clipping (Hyper.max_grad_norm)
    grad_stats: Literal["none", "loop", "foreach"] = "loop"
    # AdamW foreach=False / foreach=True / fused=True / bitsandbytes' AdamW8bit (1-byte moment
    # states) / 'master': bf16 matmul weights in the model, fp32 master weights in our one-pass
    # Triton AdamW (kernels.adamw)
    optimizer: Literal["loop", "foreach", "fused", "adamw8bit", "master"] = "loop"
    item_sync: bool = True  # loss.item() every step; False keeps the losses on the device
    attn_mask: Literal["rebuilt", "cached", "is_causal"] = "rebuilt"
    # q, k, v as one GEMM and gate, up as another (weights stacked; same values)
    fused_proj: bool = False
    # RoPE of q and k: 'triton' rotates them out of the packed q/k/v GEMM output (needs fused_proj,
    # no QK-norm) and writes that output's gradient in one piece; with fused_proj, mlp='triton' does
    # the same for gate/up.
    rope: Literal["eager", "triton"] = "eager"
    cuda_graph: bool = False  # capture forward, backward and optimizer step into one CUDA graph
    # torch.compile mode of forward + loss (with cuda_graph: captured too)
    compile: CompileMode | None = None
    # What compile compiles: 'model', forward + loss as one graph; 'blocks' (regional compilation),
    # each block, the final norm and the loss on their own: the blocks share one compiled graph, so
    # compile time does not grow with depth, and nothing fuses across a block's boundary.
    compile_scope: Literal["model", "blocks"] = "model"
    # FP8 matmuls in the blocks' Linear layers (not the LM head) through torchao's float8 training,
    # with the scaling of its recipe: 'tensorwise' (one dynamic scale per tensor, e5m2 gradients;
    # cuBLAS) or 'rowwise' (one power-of-two scale per row, e4m3 throughout; CUTLASS). Needs FP8
    # tensor cores (sm89+).
    fp8: Fp8Recipe = "off"
    # With fp8: fast accumulation (no periodic promotion of the partial sums to fp32 inside the FP8
    # GEMM) in the two backward GEMMs too; torchao's recipes use it in the forward GEMM only. Needs
    # fp8.
    fp8_fast_accum: bool = False
    # With fp8='tensorwise': whose FP8 Linear layers run the recipe: torchao's Float8Linear (its
    # casts fused by torch.compile where the step compiles) or ours (kernels.fp8_linear: the same
    # scales and GEMMs, each operand cast in both layouts in one Triton pass).
    fp8_linear: Fp8Linear = "torchao"
    batch_size: int = 8
    seq_len: int = 1024

    def replace(self, **changes: Any) -> StepOptions:
        return dataclasses.replace(self, **changes)


BASELINE = StepOptions()


@dataclass(frozen=True)
class Hyper:
    """AdamW's learning rate and decoupled weight decay, and the global gradient L2 norm clipped
    to."""

    lr: float
    weight_decay: float
    max_grad_norm: float


def variant_options(name: str, base: StepOptions = BASELINE) -> tuple[StepOptions, StepOptions]:
    """(reference, candidate) options of the variant ``name`` ('eager' too) on top of ``base`` (e.g.
    fp32 on a CPU): the reference is the candidate of ``models.variants.reference(name)``; both are
    the variant's own options where it is its own reference ('eager', a reference model)."""
    ref = reference(name)
    reference_options = (
        base.replace(**switches(name)) if ref == name else variant_options(ref, base)[1]
    )
    return reference_options, reference_options.replace(**switches(name))


def _allowed(hint: Any) -> tuple[Any, ...]:
    """Values a Literal (or Optional Literal) annotation allows; () for other annotations."""
    if get_origin(hint) is Literal:
        return get_args(hint)
    if get_origin(hint) in (Union, types.UnionType):
        return tuple(
            v for arg in get_args(hint) for v in ((None,) if arg is type(None) else _allowed(arg))
        )
    return ()


def _value_problems(options: StepOptions) -> list[str]:
    """Values outside an option's Literal, and combinations of options that cannot go together."""
    problems = []
    hints = get_type_hints(StepOptions)
    for field in dataclasses.fields(StepOptions):
        allowed, value = _allowed(hints[field.name]), getattr(options, field.name)
        if allowed and value not in allowed:
            problems.append(f"{field.name}={value!r} is not one of {allowed}")
    if options.compile_scope != "model" and options.compile is None:
        problems.append(f"compile_scope={options.compile_scope!r} needs a compile mode")
    if options.fp8_fast_accum and options.fp8 == "off":
        problems.append(
            "fp8_fast_accum sets the accumulation of FP8 GEMMs: it needs fp8='tensorwise' or "
            "'rowwise'"
        )
    if options.fp8_linear == "triton" and options.fp8 != "tensorwise":
        problems.append("fp8_linear='triton' runs the tensorwise recipe: it needs fp8='tensorwise'")
    if options.rope != "eager" and (not options.fused_proj or options.qk_norm is not None):
        problems.append(
            f"rope={options.rope!r} rotates the packed q/k/v projection: it needs fused_proj=True "
            "and no QK-norm"
        )
    if options.checkpoint_every < 0 or options.batch_size < 1 or options.seq_len < 1:
        problems.append("checkpoint_every must be >= 0, batch_size and seq_len >= 1")
    return problems


def _cpu_problems(options: StepOptions) -> list[str]:
    """The options that need a CUDA device, for a step on another device."""
    problems = []
    impls = {options.norm, options.mlp, options.qk_norm, options.loss, options.rope}
    if "liger" in impls:
        problems.append("Liger-Kernel needs a CUDA device (its kernels do not run on a CPU)")
    if (
        "triton" in impls or options.loss == "fused" or options.optimizer == "master"
    ) and os.environ.get("TRITON_INTERPRET") != "1":
        problems.append(
            "Triton kernels need a CUDA device, or TRITON_INTERPRET=1 to interpret them"
        )
    if options.cuda_graph:
        problems.append("cuda_graph needs a CUDA device")
    if options.optimizer == "fused":
        problems.append("optimizer='fused' (the fused CUDA AdamW) needs a CUDA device")
    if options.optimizer == "adamw8bit":
        problems.append("optimizer='adamw8bit' (bitsandbytes' 8-bit kernels) needs a CUDA device")
    if options.compile in GRAPHED_COMPILE_MODES:
        problems.append(
            f"compile={options.compile!r} uses CUDA graphs; use 'default' or "
            "'max-autotune-no-cudagraphs' on a CPU"
        )
    return problems


def _precision_problems(
    options: StepOptions, device: torch.device, profile: Any, where: str
) -> list[str]:
    """The precision and FP8 options that the device (``profile``'s, else its own) or each other
    rule out."""
    problems = []
    if options.precision == "fp64" and {
        options.norm,
        options.mlp,
        options.qk_norm,
        options.loss,
        options.rope,
    } & {"triton", "liger", "fused"}:
        problems.append("precision='fp64' (the check's reference) runs eager kernels only")
    if options.fp8 != "off":
        fp8 = (
            getattr(profile, "fp8", False)
            if profile is not None
            else (device.type == "cuda" and torch.cuda.get_device_capability(device) >= FP8_MIN_CC)
        )
        if device.type != "cuda" or not fp8:
            problems.append(
                f"fp8={options.fp8!r} (FP8 matmuls) needs a GPU with FP8 tensor cores "
                f"(sm89+); {where} has none"
            )
        if options.precision == "fp64":
            problems.append("precision='fp64' (the check's reference) runs no FP8 matmuls")
    if options.optimizer == "master" and options.precision != "bf16":
        problems.append(
            "optimizer='master' keeps bf16 weights for bf16 autocast: it needs precision='bf16'"
        )
    if options.precision == "bf16":
        bf16 = (
            profile.supports_bf16
            if profile is not None
            else (device.type != "cuda" or torch.cuda.is_bf16_supported(including_emulation=False))
        )
        if not bf16:
            problems.append(f"precision='bf16' is not supported on {where}")
    if options.precision == "tf32":
        tf32 = (
            profile.supports_tf32
            if profile is not None
            else (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0))
        )
        if not tf32:
            problems.append(f"precision='tf32' is not supported on {where}")
    return problems


def _cuda_graph_problems(options: StepOptions) -> list[str]:
    """What a CUDA graph of the whole step cannot capture."""
    if not options.cuda_graph:
        return []
    problems = []
    if options.precision == "fp16":
        problems.append(
            "cuda_graph cannot capture fp16's GradScaler (its inf check syncs with the host)"
        )
    if options.item_sync:
        problems.append("cuda_graph cannot capture loss.item(): set item_sync=False")
    if options.compile in GRAPHED_COMPILE_MODES:
        problems.append(
            f"cuda_graph captures the whole step itself: compile={options.compile!r} would "
            "capture CUDA graphs inside it; use 'default' or 'max-autotune-no-cudagraphs'"
        )
    if options.optimizer == "adamw8bit":
        problems.append("cuda_graph: bitsandbytes' AdamW8bit is not capturable")
    return problems


def validate(options: StepOptions, device: str | torch.device, profile: Any = None) -> None:
    """Raise UnsupportedOptions listing every reason ``options`` cannot run on ``device``.

    ``profile`` (optional, e.g. optbench.measure.hardware.HardwareProfile) has ``supports_bf16``,
    ``supports_tf32``, ``fp8`` (FP8 tensor cores; False where it lacks the attribute) and ``key``;
    without it, a CUDA device's own capabilities are asked.
    """
    device = torch.device(device)
    where = profile.key if profile is not None else device.type
    problems = [
        *_value_problems(options),
        *(_cpu_problems(options) if device.type != "cuda" else []),
        *_precision_problems(options, device, profile, where),
        *_cuda_graph_problems(options),
    ]
    if problems:
        raise UnsupportedOptions("; ".join(problems))


def _loss_fn(kind: str) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Mean cross-entropy of ``hidden (N, H) @ weight (V, H).T`` against targets (N,), by
    implementation."""
    if kind == "liger":
        from kernels.liger import liger

        flce = liger("transformers").LigerFusedLinearCrossEntropyLoss()
        return lambda hidden, weight, target: flce(weight, hidden, target)
    if kind == "fused":
        from kernels.fused_linear_ce import fused_linear_cross_entropy

        def fused(hidden: Tensor, weight: Tensor, target: Tensor) -> Tensor:
            device = hidden.device.type
            # its matmuls write to out= buffers, which autocast skips
            if torch.is_autocast_enabled(device):
                dtype = torch.get_autocast_dtype(device)
                hidden, weight = hidden.to(dtype), weight.to(dtype)
            return fused_linear_cross_entropy(hidden, weight, target)

        return fused
    from kernels.cross_entropy import chunked_cross_entropy, fused_linear_cross_entropy_eager

    return chunked_cross_entropy if kind == "chunked" else fused_linear_cross_entropy_eager


def _grad_stats_fns(kind: str) -> tuple[Callable, Callable] | None:
    """(stats(params) -> {'grad_norm', 'param_norm'}, clip(params, max_norm)) from
    kernels.grad_stats."""
    if kind == "none":
        return None
    from kernels import grad_stats

    return getattr(grad_stats, f"grad_stats_{kind}"), getattr(grad_stats, f"clip_grad_norm_{kind}")


def compile_kwargs(options: StepOptions) -> dict[str, Any]:
    """``torch.compile``'s arguments for ``options.compile``: its mode. FP8 rowwise takes the mode's
    settings with ``emulate_precision_casts`` added: inductor then rounds each intermediate it fuses
    to the dtype eager stores it in. Without it, the fused bf16 -> float8 casts of torchao's
    rowwise recipe keep fp32 intermediates and round differently from eager (pytorch/pytorch#150859;
    torchtitan sets it for this recipe)."""
    if options.fp8 != "rowwise":
        return {"mode": options.compile}
    from torch._inductor import list_mode_options

    return {"options": {**list_mode_options(options.compile), "emulate_precision_casts": True}}


def clips_in_optimizer(options: StepOptions) -> bool:
    """Whether gradient clipping rides on the fused (or master) AdamW's ``grad_scale`` input instead
    of its own pass: with foreach statistics (the norm is at hand on the device) and no GradScaler
    (which owns grad_scale)."""
    return (
        options.grad_stats == "foreach"
        and options.optimizer in ("fused", "master")
        and options.precision != "fp16"
    )


def fp8_eligible(module: torch.nn.Module, fqn: str) -> bool:
    """Whether torchao may swap the Linear layer ``module`` (at ``fqn`` in the Decoder) for FP8:
    torchao's advice, as its ``module_filter_fn`` example gives it: not the output layer (the LM
    head: our losses read its weight directly, so it stays bf16 either way), and only dims that are
    multiples of 16 (torch._scaled_mm's constraint)."""
    return (
        fqn != "lm_head"
        and isinstance(module, torch.nn.Linear)
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def to_float8(
    model: Decoder,
    recipe: str,
    emulate: bool = False,
    fast_accum: bool = False,
    linear: Fp8Linear = "torchao",
) -> list[str]:
    """Swap ``model``'s eligible Linear layers (:func:`fp8_eligible`) for FP8 ones with the scaling
    recipe ``recipe`` ('tensorwise' | 'rowwise', torchao's ``Float8LinearConfig.from_recipe_name``),
    in place; the weights stay the same Parameters. ``linear`` (``StepOptions.fp8_linear``):
    torchao's Float8Linear, or 'triton', ours (kernels.fp8_linear; the tensorwise recipe only).
    ``emulate``: torchao's emulation (FP8 rounding, matmuls in high precision), what a device
    without FP8 tensor cores can run (tests on a CPU; ours runs its GEMMs on a CPU as they are).
    ``fast_accum``: the backward GEMMs (grad input, grad weight) accumulate fast as the forward one
    does (``StepOptions.fp8_fast_accum``). Returns the swapped layers' names."""
    fused = {name: m.parts for name, m in model.named_modules() if isinstance(m, FusedLinear)}
    if linear == "triton":
        swapped = _to_fp8_linear(model, recipe, fast_accum)
    else:
        _to_torchao_float8(model, recipe, emulate, fast_accum)
        swapped = [name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
    for name in swapped:
        if name in fused:  # keeps splitting its output into the parts
            layer = model.get_submodule(name)
            layer.__class__, layer.parts = _fused(type(layer)), fused[name]
    return swapped


def _to_torchao_float8(model: Decoder, recipe: str, emulate: bool, fast_accum: bool) -> None:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.config import Float8GemmConfig

    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)
    if fast_accum:
        fast = Float8GemmConfig(use_fast_accum=True)
        config = dataclasses.replace(
            config, gemm_config_grad_input=fast, gemm_config_grad_weight=fast
        )
    convert_to_float8_training(model, module_filter_fn=fp8_eligible, config=config)


def _to_fp8_linear(model: Decoder, recipe: str, fast_accum: bool) -> list[str]:
    from kernels.fp8_linear import FP8Linear

    if recipe != "tensorwise":
        raise ValueError(f"kernels.fp8_linear runs the tensorwise recipe, not {recipe!r}")
    swapped = []
    for name, m in model.named_modules():
        if fp8_eligible(m, name):
            if m.bias is not None:
                raise ValueError(f"{name}: kernels.fp8_linear's layers have no bias")
            m.__class__, m.fast_accum = FP8Linear, fast_accum
            swapped.append(name)
    return swapped


@functools.cache
def _fused(layer: type) -> type:
    """The FP8 Linear class ``layer`` that is also a :class:`FusedLinear` (its forward,
    FusedLinear's ``split`` and ``parts``), for a fused projection swapped to FP8: the model splits
    its output and names its gradient by the parts (``Decoder.unfused``)."""
    name = layer.__name__.replace("Linear", "FusedLinear")
    return type(name, (layer, FusedLinear), {"__doc__": _fused.__doc__})


def _adamw(
    model: Decoder, kind: str, capturable: bool, hyper: Hyper
) -> torch.optim.Optimizer | MasterAdamW:
    params, lr, weight_decay = list(model.parameters()), hyper.lr, hyper.weight_decay
    if kind == "master":  # the matmul weights become bf16; the embedding and norm weights stay fp32
        linear = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
        return MasterAdamW(params, linear, lr=lr, weight_decay=weight_decay)
    if kind == "adamw8bit":
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params, lr=lr, weight_decay=weight_decay)
    impl = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[
        kind
    ]
    return torch.optim.AdamW(
        params, lr=lr, weight_decay=weight_decay, capturable=capturable, **impl
    )


def _set_hyper(optimizer: torch.optim.Optimizer | MasterAdamW, hyper: Hyper) -> None:
    """Give ``optimizer`` the learning rate and weight decay of ``hyper`` from its next step on."""
    groups = [vars(optimizer)] if isinstance(optimizer, MasterAdamW) else optimizer.param_groups
    for group in groups:
        group.update(lr=hyper.lr, weight_decay=hyper.weight_decay)


def _model_loss(
    model: Decoder, loss: Callable[[Tensor, Tensor, Tensor], Tensor], idx: Tensor, targets: Tensor
) -> Tensor:
    """Forward + loss, what ``compile`` compiles; a function, not a method, so a TrainStep holds no
    cycle."""
    hidden = model(idx).flatten(0, 1)
    return loss(hidden, model.lm_head.weight, targets.flatten())


class TrainStep:
    """A decoder, its AdamW and one fixed random batch; calling it runs one optimizer step as
    options say.

    ``stats`` holds the last step's {'grad_norm', 'param_norm'} (device tensors) when grad_stats is
    on; ``hyper`` what it trains with (:meth:`tuned` changes it). precision 'fp64' runs the model in
    float64; fp8 on a device without FP8 tensor cores runs torchao's emulation (what tests on a CPU
    build directly).
    """

    def __init__(
        self,
        config: ModelConfig,
        options: StepOptions,
        device: str | torch.device,
        seed: int,
        capture: bool = True,
    ):
        self.options, self.device = options, torch.device(device)
        self.config = dataclasses.replace(config, qk_norm=options.qk_norm is not None)
        torch.manual_seed(seed)  # the model init: identical for every step built with this seed
        with self.device:
            self.model = Decoder(
                self.config,
                norm_impl=options.norm,
                mlp_impl=options.mlp,
                qk_norm_impl=options.qk_norm or "eager",
                attn_mask=options.attn_mask,
                fused_proj=options.fused_proj,
                rope_impl=options.rope,
            )
        if options.precision == "fp64":
            self.model.double()
        # emulated where no FP8 tensor cores are (validate keeps that to tests)
        if options.fp8 != "off":
            to_float8(
                self.model,
                options.fp8,
                emulate=self.device.type != "cuda",
                fast_accum=options.fp8_fast_accum,
                linear=options.fp8_linear,
            )
        self.model.checkpoint_every = options.checkpoint_every
        self.params = list(self.model.parameters())
        self.hyper = Hyper(LR, WEIGHT_DECAY, MAX_GRAD_NORM)
        self.optimizer = _adamw(self.model, options.optimizer, options.cuda_graph, self.hyper)
        gen = torch.Generator(self.device).manual_seed(seed)
        shape = (options.batch_size, options.seq_len + 1)
        tokens = torch.randint(0, config.vocab_size, shape, generator=gen, device=self.device)
        self.idx, self.targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        self.tokens_per_step = options.batch_size * options.seq_len
        self.flops_per_step = flops_per_token(self.config, options.seq_len) * self.tokens_per_step

        self.amp_dtype = AMP_DTYPES.get(options.precision)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=options.precision == "fp16")
        self._loss, self._stats = _loss_fn(options.loss), _grad_stats_fns(options.grad_stats)
        self._clip_in_optimizer = clips_in_optimizer(options)
        # MasterAdamW takes the parameter norm in its own pass and divides the gradients without
        # writing them back: grads() applies the last step's divisor, so checks see the gradients
        # the update used.
        self._master = isinstance(self.optimizer, MasterAdamW)
        self._grad_divisor: Tensor | None = None
        self._model_loss_fn = _model_loss
        if options.compile and options.compile_scope == "blocks":
            for module in (*self.model.blocks, self.model.norm):
                module.compile(**compile_kwargs(options))
            self._loss = torch.compile(self._loss, **compile_kwargs(options))
        elif options.compile:
            self._model_loss_fn = torch.compile(_model_loss, **compile_kwargs(options))
        self.stats: dict[str, Tensor] | None = None
        self._losses: list[float | Tensor] = []
        self._graph: torch.cuda.CUDAGraph | None = None
        # the captured step's loss, rewritten by every replay
        self._graph_loss: Tensor | None = None
        # eager steps before a capture; DDP's reducer needs 11 (PyTorch's CUDA graphs notes)
        self.capture_warmup = 3
        # the side stream of every capture's warm-up: cuBLAS keeps a workspace (32 MiB) per stream
        # it ran on, so a new stream for each capture (a tuned step captures again) would leave
        # one more workspace a capture
        self._warmup_stream: torch.cuda.Stream | None = None
        if options.cuda_graph and capture:
            self.capture()

    @property
    def loss_history(self) -> list[float]:
        """Loss of every step so far (reading it syncs once when item_sync is off)."""
        return [float(loss) for loss in self._losses]

    def feed(self, tokens: Tensor) -> None:
        """Train on ``tokens`` (batch_size, seq_len + 1) from the next step on: inputs and
        next-token targets copied into the step's batch in place (where a captured graph or a
        compiled function reads it)."""
        self.idx.copy_(tokens[:, :-1])
        self.targets.copy_(tokens[:, 1:])

    def __call__(self) -> Tensor:
        """Run one optimizer step; returns its loss (that of the weights before the update),
        detached."""
        with self._matmul_precision():
            if self._graph is not None:
                self._graph.replay()
                loss = self._graph_loss
            else:
                loss = self._step()
        loss = loss.clone()  # graph replays (ours, or compile's) overwrite their outputs in place
        self._losses.append(loss.item() if self.options.item_sync else loss)
        return loss

    def forward_loss(self) -> Tensor:
        """Forward and loss only, building the autograd graph as training does (eager under
        cuda_graph)."""
        with self._matmul_precision():
            return self._forward_loss().detach()

    def grads(self) -> dict[str, Tensor]:
        """Copies of the gradients the last optimizer step used (unscaled and clipped), by parameter
        name (of the unfused model: a fused projection's gradient is split into its layers')."""
        named = self.model.named_parameters()
        divisor = self._grad_divisor
        return self.model.unfused(
            {
                name: p.grad.detach().clone()
                if divisor is None
                else p.grad.detach().float() / divisor
                for name, p in named
                if p.grad is not None
            }
        )

    def weights(self) -> dict[str, Tensor]:
        """The weights the optimizer updates (the fp32 masters of bf16 ones), live, by parameter
        name of the unfused model."""
        named = dict(self.model.named_parameters())
        return self.model.unfused(
            dict(zip(named, self.optimizer.masters)) if self._master else named
        )

    @contextmanager
    def tuned(self, hyper: Hyper) -> Iterator[None]:
        """Train with ``hyper`` inside the block, then with the previous one again; a graphed step
        is captured again on entry and exit (its warm-up steps leave weights and optimizer state as
        they were)."""
        previous = self.hyper
        self.tune(hyper)
        try:
            yield
        finally:
            self.tune(previous)

    def tune(self, hyper: Hyper) -> None:
        """Train with ``hyper`` from now on (a graphed step is captured again)."""
        self.hyper = hyper
        _set_hyper(self.optimizer, hyper)
        if self._graph is not None:
            # frees the old graph's memory pool before the new capture
            self._graph = self._graph_loss = None
            self.capture()

    @contextmanager
    def _matmul_precision(self) -> Iterator[None]:
        """TF32 matmuls on (precision 'tf32') or off (any other) for forward, backward and
        optimizer."""
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.options.precision == "tf32"
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous

    def _forward_loss(self) -> Tensor:
        if self.options.compile in GRAPHED_COMPILE_MODES:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(
            self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None
        ):
            return self._model_loss_fn(self.model, self._loss, self.idx, self.targets)

    def _step(self) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._forward_loss()
        self.scaler.scale(loss).backward()
        if self._stats is not None:
            stats, clip = self._stats
            self.scaler.unscale_(self.optimizer)
            # MasterAdamW takes it in its pass
            self.stats = stats(self.params, param_norm=not self._master)
            if self._clip_in_optimizer:
                # The fused AdamW divides each gradient by its grad_scale (writing it back) in the
                # same pass as the update: one read and write of every gradient fewer than a
                # separate clip.
                self.optimizer.grad_scale = 1.0 / clip_coefficient(
                    self.stats["grad_norm"], self.hyper.max_grad_norm
                )
                if self._master:
                    self._grad_divisor = self.optimizer.grad_scale
            elif self.options.grad_stats == "foreach":  # reuses the norm the statistics just took
                clip(self.params, self.hyper.max_grad_norm, self.stats["grad_norm"])
            else:  # the loop implementation takes the norm a second time
                clip(self.params, self.hyper.max_grad_norm)
        self.scaler.step(self.optimizer)
        if self.stats is not None and "param_norm" not in self.stats:
            self.stats["param_norm"] = self.optimizer.param_norm()
        if self._clip_in_optimizer:
            del self.optimizer.grad_scale
        self.scaler.update()
        return loss.detach()

    def capture(self) -> None:
        """Record ``_step`` into one CUDA graph, after ``capture_warmup`` eager steps on a side
        stream (PyTorch's recipe for whole-network capture); then restore the initial weights and a
        fresh optimizer state in place. Every later call replays it. A step built with
        ``capture=False`` (to be wrapped first, as DDP wraps it) calls this itself."""
        initial = self.snapshot()
        if self._warmup_stream is None:
            self._warmup_stream = torch.cuda.Stream(self.device)
        side, main = self._warmup_stream, torch.cuda.current_stream(self.device)
        side.wait_stream(main)
        with self._matmul_precision(), torch.cuda.stream(side):
            for _ in range(self.capture_warmup):
                self._step()
        main.wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with self._matmul_precision(), torch.cuda.graph(self._graph):
            self._graph_loss = self._step()
        self.restore(initial)

    def snapshot(self) -> Any:
        """What :meth:`restore` puts back: the weights (MasterAdamW: its own snapshot, masters
        included)."""
        return (
            self.optimizer.snapshot() if self._master else [p.detach().clone() for p in self.params]
        )

    def restore(self, initial: Any) -> None:
        """The weights of ``initial`` (:meth:`snapshot`) and a fresh optimizer state, in place,
        where a captured graph keeps reading them."""
        if self._master:
            self.optimizer.restore(initial)
            return
        with torch.no_grad():
            torch._foreach_copy_(self.params, initial)
            for state in self.optimizer.state.values():
                for value in state.values():
                    if torch.is_tensor(value):
                        value.zero_()


def build_step(
    config: ModelConfig,
    options: StepOptions,
    device: str | torch.device = "cpu",
    seed: int = 0,
    profile: Any = None,
    capture: bool = True,
) -> TrainStep:
    """Validate ``options`` for ``device`` (and ``profile``) and build the step; seed fixes init,
    batch. ``capture=False`` leaves a ``cuda_graph`` step uncaptured (:meth:`TrainStep.capture`)."""
    validate(options, device, profile)
    if options.optimizer == "adamw8bit" and importlib.util.find_spec("bitsandbytes") is None:
        raise UnsupportedOptions(
            "optimizer='adamw8bit' needs bitsandbytes, which is not installed here"
        )
    if options.fp8 != "off" and importlib.util.find_spec("torchao") is None:
        raise UnsupportedOptions(
            f"fp8={options.fp8!r} needs torchao's float8 training: torchao is not installed"
        )
    if options.seq_len > config.max_seq_len:
        raise UnsupportedOptions(
            f"seq_len {options.seq_len} exceeds max_seq_len {config.max_seq_len}"
        )
    return TrainStep(config, options, device, seed, capture)


# The check runs CHECK_STEPS optimizer steps under CHECK from one init and batch (TrainStep.tuned:
# what is timed trains with its own hyper). Adam's first step is ~lr * sign(g), blind to the
# gradients' scale, so the first step's clipped gradients and pre-clip norm are compared too; CHECK
# clips far under the init gradient norm (0.8 tiny at B2 S128; baseline_of refuses a reference that
# does not clip), and its weight decay, 20 at the training lr (0.2% per step), moves each weight by
# 6e-3 relative in 3 steps: 11x the bf16 eager step's own worst weight error on tiny (6e-4, from
# gradients' signs flipped by rounding), where the tolerance is 2.5x. Bias-corrected Adam barely
# depends on betas in 3 steps: dropped momentum (beta1 0) shows, at 4.4x. CHECK_FLOOR, the least
# tolerance: 16 fp32 roundings (2^-24 each), the spread of an fp32 reduction summed in another order
# (tiny's foreach gradient norm: 3.6e-7 from fp64, the loop's 6.6e-8); a bug moves far more. A
# scalar's eager error is one draw of its rounding noise, at times near 0 by chance (a candidate as
# noisy exceeds 2.5x of it one time in four: |X/Y| of two normals), so the scalars' tolerance is no
# less than what bounds them: the gradient norm's, the gradients' (a norm is within any relative
# error its vector is); the loss's, UNIT_ROUNDOFF / sqrt(tokens) (the mean of per-token losses each
# rounded at the precision's unit).
CHECK_STEPS = 3
CHECK = Hyper(lr=LR, weight_decay=20.0, max_grad_norm=0.01)
CHECK_FACTOR, CHECK_FLOOR = 2.5, 1e-6
UNIT_ROUNDOFF = {
    "fp64": 2.0**-53,
    "fp32": 2.0**-24,
    "tf32": 2.0**-11,
    "fp16": 2.0**-11,
    "bf16": 2.0**-8,
}
# The most a step in each precision may be off, whatever its eager step measured: where the
# candidate is the eager step in its own precision (fp32, tf32, fp16-scaler), 2.5x its own error
# would pass anything finite. About 5x the largest error of a correct bf16 step at our sizes
# (gradients, 4.4e-2 at 1B), scaled by the unit roundoff.
CHECK_CEILING = {"fp64": 1e-9, "fp32": 1e-3, "tf32": 5e-2, "fp16": 5e-2, "bf16": 0.3}
# FP8 matmuls (options.fp8) round their operands to 3 mantissa bits (e4m3; tensorwise's gradients
# e5m2, 2 bits): a numerics change on purpose, 16-32x bf16's rounding, which the 2.5x-of-eager
# tolerance is not made for. torchao's own numerics test (test/float8/test_numerics_integration.py)
# holds one LLaMA FFN in FP8 to an SQNR over 20 dB against bf16 (relative error under 0.1) in its
# output and gradients, per layer; errors compound with depth. torchao's emulated FP8 steps on a CPU
# (tests/test_fp8.py), worst gradient: 0.09-0.12 on tiny (2 layers; bf16 eager 0.008), 0.18-0.28 at
# 12 layers (d_model 64 and 256; bf16 eager 0.019-0.025, as at 100M: 0.021). The exact check refuses
# that. An FP8 step's check catches broken plumbing instead: every quantity within
# FP8_CHECK_TOLERANCE, 2.5x the worst of those FP8 errors and under what gross bugs give (a lost or
# unrelated gradient: 1 or sqrt 2; a sign flip: 2). Whether FP8 trains like eager is the convergence
# check's call (optbench.suite.convergence).
FP8_CHECK_TOLERANCE = 0.7


@dataclass(frozen=True)
class Reference:
    """What a freshly built step did in the check: the first step's loss, gradients as its optimizer
    used them (unscaled and clipped; by parameter name of the unfused model) and gradient norm
    before clipping (None without grad_stats), and the weights after CHECK_STEPS steps (fp32 masters
    of bf16 weights)."""

    precision: str
    loss: Tensor
    grads: dict[str, Tensor]
    grad_norm: Tensor | None
    weights: dict[str, Tensor]

    @property
    def device(self) -> torch.device:
        return self.loss.device

    @property
    def nbytes(self) -> int:
        """Bytes of its tensors (all on one device)."""
        tensors = [self.loss, *self.grads.values(), *self.weights.values()]
        tensors += [] if self.grad_norm is None else [self.grad_norm]
        return sum(t.numel() * t.element_size() for t in tensors)

    def copy_to(self, device: str | torch.device) -> Reference:
        """A copy of every tensor on ``device``."""

        def copy(t: Tensor) -> Tensor:
            return t.detach().to(device, copy=True)

        return Reference(
            self.precision,
            copy(self.loss),
            {k: copy(v) for k, v in self.grads.items()},
            None if self.grad_norm is None else copy(self.grad_norm),
            {k: copy(v) for k, v in self.weights.items()},
        )


def _record(step: TrainStep) -> Reference:
    """Run the check on freshly built ``step``; its weights in the record are the step's own
    (live)."""
    if step.loss_history:
        raise ValueError("the check needs a freshly built step (same init, no step taken)")
    with step.tuned(CHECK):
        loss = step()
        grads = step.grads()
        grad_norm = None if step.stats is None else step.stats["grad_norm"].detach().clone()
        for _ in range(CHECK_STEPS - 1):
            step()
    return Reference(step.options.precision, loss, grads, grad_norm, step.weights())


def reference_of(step: TrainStep, host: bool = False) -> Reference:
    """Run the check on freshly built ``step`` and keep a copy of what it did, on the host with
    ``host=True`` (so that the GPU is free for the candidate: a 1B step and its reference do not
    both fit on 80 GB)."""
    return _record(step).copy_to("cpu" if host else step.device)


def _recorded_and_freed(
    build: Callable[[], TrainStep], record: Callable[..., Reference]
) -> Reference:
    """``record`` of the step ``build`` makes, that step gone on return. A reference cycle can hold
    a step after its last name is dropped (the first ``torch.optim`` optimizer of a process lazily
    imports a module, and the frames that import kept hold the step being built): the high-precision
    step (a 1B fp32 step: 16 bytes per parameter) then stays on the device until the collector
    runs, under the next step built. Collected here where it is still alive."""
    step = build()
    alive = weakref.ref(step)
    try:
        return record(step)
    finally:
        del step
        if alive() is not None:
            gc.collect()


def _errors(ref: Reference, got: Reference) -> tuple[dict[str, float], dict[str, str]]:
    """Relative errors of ``got`` against ``ref``: 'loss', 'grad_norm' (where ``ref`` has one; inf
    where only ``ref`` has), 'grads' and 'weights' (the worst parameter's); and the worst
    parameters' names."""
    if ref.grads.keys() != got.grads.keys() or ref.weights.keys() != got.weights.keys():
        raise ValueError(f"parameters differ: {sorted(ref.grads.keys() ^ got.grads.keys())}")
    errors, worst = {"loss": rel_err(got.loss, ref.loss)}, {}
    if ref.grad_norm is not None:
        errors["grad_norm"] = (
            float("inf") if got.grad_norm is None else rel_err(got.grad_norm, ref.grad_norm)
        )
    for quantity in ("grads", "weights"):
        ours, theirs = getattr(got, quantity), getattr(ref, quantity)
        per_param = {name: rel_err(ours[name], theirs[name]) for name in theirs}
        worst[quantity] = max(per_param, key=per_param.__getitem__)
        errors[quantity] = per_param[worst[quantity]]
    return errors, worst


def high_precision(reference: StepOptions, precision: str) -> StepOptions:
    """The options of the check's high-precision reference for a candidate in ``precision`` against
    ``reference``: float64 where either is fp32, else fp32 (TF32 off)."""
    return reference.replace(
        precision="fp64" if "fp32" in (reference.precision, precision) else "fp32"
    )


@dataclass(frozen=True)
class Baseline:
    """What a candidate in ``precision`` is checked against: the high-precision reference and the
    errors against it of the eager step (the reference options in ``precision``), measured in the
    same run."""

    reference: Reference
    precision: str
    eager: dict[str, float]
    tokens: int  # per step


def _tolerance(eager: dict[str, float], precision: str, tokens: int) -> dict[str, float]:
    """Per quantity: CHECK_FACTOR times the eager step's error, at least CHECK_FLOOR and at most the
    precision's CHECK_CEILING; for the scalars, at least the bound above (the gradients' tolerance
    for their norm, UNIT_ROUNDOFF / sqrt(tokens) for the loss)."""
    tolerance = {
        quantity: min(max(CHECK_FACTOR * error, CHECK_FLOOR), CHECK_CEILING[precision])
        for quantity, error in eager.items()
    }
    tolerance["loss"] = max(tolerance["loss"], UNIT_ROUNDOFF[precision] / tokens**0.5)
    if "grad_norm" in tolerance:
        tolerance["grad_norm"] = max(tolerance["grad_norm"], tolerance["grads"])
    return tolerance


def baseline_of(
    build: Callable[[StepOptions], TrainStep],
    reference: StepOptions,
    precision: str,
    host: bool = False,
) -> Baseline:
    """Run the check on ``high_precision(reference, precision)`` and on ``reference`` in
    ``precision``, each built fresh by ``build``, and measure the latter against the former (kept on
    the host with ``host``)."""
    high = high_precision(reference, precision)
    ref = _recorded_and_freed(lambda: build(high), functools.partial(reference_of, host=host))
    if ref.grad_norm is not None and not float(ref.grad_norm) > CHECK.max_grad_norm:
        raise ValueError(
            f"the check's clip ({CHECK.max_grad_norm}) does not engage: gradient norm "
            f"{float(ref.grad_norm):.3g} at init, so a skipped clip would pass"
        )
    eager_step = reference.replace(precision=precision)
    eager, _ = _errors(ref, _recorded_and_freed(lambda: build(eager_step), _record))
    return Baseline(ref, precision, eager, reference.batch_size * reference.seq_len)


@dataclass(frozen=True)
class CheckResult:
    """A candidate's relative errors against the high-precision reference (``errors``, per quantity
    of
    :func:`_errors`) beside the eager step's (``eager``); it passes when each is within
    ``tolerance`` (:func:`_tolerance`). ``worst``: the parameter of the worst grads and weights
    error."""

    errors: dict[str, float]
    eager: dict[str, float]
    tolerance: dict[str, float]
    worst: dict[str, str]
    reference: str  # the high-precision reference's precision
    precision: str  # the candidate's and eager step's
    numerics: str = "exact"  # 'fp8': FP8 matmuls, held to FP8_CHECK_TOLERANCE only

    @property
    def ok(self) -> bool:
        return all(
            self.errors[quantity] <= tolerance for quantity, tolerance in self.tolerance.items()
        )

    def record(self) -> dict[str, Any]:
        """The check's record: errors, the eager step's errors and the tolerances, per quantity."""
        return {
            "errors": self.errors,
            "eager_errors": self.eager,
            "tolerance": self.tolerance,
            "worst_param": self.worst,
            "reference": self.reference,
            "precision": self.precision,
            "factor": CHECK_FACTOR,
            "floor": CHECK_FLOOR,
            "steps": CHECK_STEPS,
            "hyper": dataclasses.asdict(CHECK),
            "numerics": self.numerics,
        }


def check_against(baseline: Baseline, candidate: TrainStep) -> CheckResult:
    """Run the check on freshly built ``candidate`` (the baseline's seed, precision and batch) and
    compare it with the baseline's reference; a candidate with FP8 matmuls within
    FP8_CHECK_TOLERANCE at least."""
    if candidate.options.precision != baseline.precision:
        raise ValueError(
            f"a {candidate.options.precision} candidate against a {baseline.precision} baseline"
        )
    if candidate.tokens_per_step != baseline.tokens:
        raise ValueError(
            f"{candidate.tokens_per_step} tokens per step against a baseline of {baseline.tokens}"
        )
    errors, worst = _errors(baseline.reference, _record(candidate))
    tolerance = _tolerance(baseline.eager, baseline.precision, baseline.tokens)
    numerics = "fp8" if candidate.options.fp8 != "off" else "exact"
    if numerics == "fp8":
        tolerance = {quantity: max(t, FP8_CHECK_TOLERANCE) for quantity, t in tolerance.items()}
    return CheckResult(
        errors,
        baseline.eager,
        tolerance,
        worst,
        baseline.reference.precision,
        baseline.precision,
        numerics,
    )
