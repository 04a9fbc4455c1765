"""One training step of the decoder; every optimization is a switch of :class:`StepOptions`.

The defaults of ``StepOptions`` are the eager baseline, the seeds' slow training loop: bf16 autocast,
eager kernels, full-logits cross-entropy, a Python loop for gradient statistics and AdamW, ``loss.item()``
every step, and a causal mask rebuilt on every forward. :data:`VARIANTS` names the overrides that turn one
switch on; :func:`build_step` builds a :class:`TrainStep` (model, AdamW, fixed random batch) and
:func:`check_against` compares two of them after one step from the same init and batch.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import torch
from torch import Tensor

from kernels.adamw import MasterAdamW
from kernels.grad_stats import clip_coefficient
from models.config import ModelConfig, flops_per_token
from models.model import Decoder
from models.variants import VARIANTS, reference, switches  # noqa: F401 (VARIANTS: re-exported)

LR, WEIGHT_DECAY, MAX_GRAD_NORM = 1e-4, 0.1, 1.0
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
GRAPHED_COMPILE_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that use CUDA graphs

Precision = Literal["fp32", "tf32", "bf16", "fp16"]
KernelImpl = Literal["eager", "triton", "liger"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


class UnsupportedOptions(ValueError):
    """Options that this device, or the combination itself, cannot run; raised at build time."""


@dataclass(frozen=True)
class StepOptions:
    """Switches of one training step; the defaults are the eager baseline."""

    precision: Precision = "bf16"  # bf16/fp16: autocast (fp16 with a GradScaler); tf32: fp32, TF32 matmuls
    norm: KernelImpl = "eager"  # RMSNorm layers
    mlp: KernelImpl = "eager"  # SwiGLU activation
    qk_norm: Literal["eager", "triton"] | None = None  # None: the model has no QK-norm
    loss: Literal["eager", "chunked", "fused", "liger"] = "eager"  # LM head + cross-entropy
    checkpoint_every: int = 0  # activation checkpointing of every k-th block; 0: off
    grad_stats: Literal["none", "loop", "foreach"] = "loop"  # grad/param norms and clipping at MAX_GRAD_NORM
    # AdamW foreach=False / foreach=True / fused=True / bitsandbytes' AdamW8bit (1-byte moment states) /
    # 'master': bf16 matmul weights in the model, fp32 master weights in our one-pass Triton AdamW (kernels.adamw)
    optimizer: Literal["loop", "foreach", "fused", "adamw8bit", "master"] = "loop"
    item_sync: bool = True  # loss.item() every step; False keeps the losses on the device
    attn_mask: Literal["rebuilt", "cached", "is_causal"] = "rebuilt"
    fused_proj: bool = False  # q, k, v as one GEMM and gate, up as another (weights stacked; same values)
    # RoPE of q and k: 'triton' rotates them out of the packed q/k/v GEMM output (needs fused_proj, no QK-norm)
    # and writes that output's gradient in one piece; with fused_proj, mlp='triton' does the same for gate/up.
    rope: Literal["eager", "triton"] = "eager"
    cuda_graph: bool = False  # capture forward, backward and optimizer step into one CUDA graph
    compile: CompileMode | None = None  # torch.compile mode of forward + loss (with cuda_graph: captured too)
    # What compile compiles: 'model', forward + loss as one graph; 'blocks' (regional compilation), each block,
    # the final norm and the loss on their own: the blocks share one compiled graph, so compile time does not
    # grow with depth, and nothing fuses across a block's boundary.
    compile_scope: Literal["model", "blocks"] = "model"
    batch_size: int = 8
    seq_len: int = 1024

    def replace(self, **changes: Any) -> StepOptions:
        return dataclasses.replace(self, **changes)


BASELINE = StepOptions()

# (loss_rtol, grad_rtol) of a candidate against its reference, per precision; a pair of precisions uses the
# looser one. The loss is checked before and after the update (one AdamW step moves it by ~4% at 500M, so
# 1e-3 catches a wrong or missing update). fp32: only the summation order differs (blocked kernels, chunked
# logits, foreach reductions), ~1e-7 per op: 1e-5 / 1e-4. tf32 rounds matmul inputs to 10 mantissa bits
# (2^-11) on one side only: 1e-3 / 2e-2. bf16/fp16 autocast: both sides round to 8 (bf16) or 11 (fp16) bits
# but at different places, and the eager reference's own backward is not deterministic (atomics in the
# masked SDPA and embedding backward): 1e-3 / 5e-2. Measured on an H100 at 500M, B8 S1024 (2026-11-22):
# loss <= 7e-5 everywhere; gradients 1.0e-2 for variants with the reference's exact math (the noise floor),
# <= 2.1e-2 for Triton kernels and torch.compile, 2.9e-2 fp16 vs bf16, 2.8e-3 tf32 vs fp32.
TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-5, 1e-4),
    "tf32": (1e-3, 2e-2),
    "bf16": (1e-3, 5e-2),
    "fp16": (1e-3, 5e-2),
}


def variant_options(name: str, base: StepOptions = BASELINE) -> tuple[StepOptions, StepOptions]:
    """(reference, candidate) options of the variant ``name`` ('eager' too) on top of ``base`` (e.g. fp32 on a
    CPU): the reference is the candidate of ``models.variants.reference(name)``; both are the variant's own
    options where it is its own reference ('eager', a reference model)."""
    ref = reference(name)
    reference_options = base.replace(**switches(name)) if ref == name else variant_options(ref, base)[1]
    return reference_options, reference_options.replace(**switches(name))


def _allowed(hint: Any) -> tuple[Any, ...]:
    """Values a Literal (or Optional Literal) annotation allows; () for other annotations."""
    if get_origin(hint) is Literal:
        return get_args(hint)
    if get_origin(hint) in (Union, types.UnionType):
        return tuple(v for arg in get_args(hint) for v in ((None,) if arg is type(None) else _allowed(arg)))
    return ()


def validate(options: StepOptions, device: str | torch.device, profile: Any = None) -> None:
    """Raise UnsupportedOptions listing every reason ``options`` cannot run on ``device``.

    ``profile`` (optional, e.g. optbench.hardware.HardwareProfile) has ``supports_bf16``, ``supports_tf32``
    and ``key``; without it, a CUDA device's own capabilities are asked.
    """
    problems = []
    hints = get_type_hints(StepOptions)
    for field in dataclasses.fields(StepOptions):
        allowed, value = _allowed(hints[field.name]), getattr(options, field.name)
        if allowed and value not in allowed:
            problems.append(f"{field.name}={value!r} is not one of {allowed}")
    if options.compile_scope != "model" and options.compile is None:
        problems.append(f"compile_scope={options.compile_scope!r} needs a compile mode")
    if options.rope != "eager" and (not options.fused_proj or options.qk_norm is not None):
        problems.append(f"rope={options.rope!r} rotates the packed q/k/v projection: it needs fused_proj=True "
                        "and no QK-norm")
    if options.checkpoint_every < 0 or options.batch_size < 1 or options.seq_len < 1:
        problems.append("checkpoint_every must be >= 0, batch_size and seq_len >= 1")

    device = torch.device(device)
    where = profile.key if profile is not None else device.type
    if device.type != "cuda":
        impls = {options.norm, options.mlp, options.qk_norm, options.loss, options.rope}
        if "liger" in impls:
            problems.append("Liger-Kernel needs a CUDA device (its kernels do not run on a CPU)")
        if ("triton" in impls or options.loss == "fused" or options.optimizer == "master") \
                and os.environ.get("TRITON_INTERPRET") != "1":
            problems.append("Triton kernels need a CUDA device, or TRITON_INTERPRET=1 to interpret them")
        if options.cuda_graph:
            problems.append("cuda_graph needs a CUDA device")
        if options.optimizer == "fused":
            problems.append("optimizer='fused' (the fused CUDA AdamW) needs a CUDA device")
        if options.optimizer == "adamw8bit":
            problems.append("optimizer='adamw8bit' (bitsandbytes' 8-bit kernels) needs a CUDA device")
        if options.compile in GRAPHED_COMPILE_MODES:
            problems.append(f"compile={options.compile!r} uses CUDA graphs; use 'default' or "
                            "'max-autotune-no-cudagraphs' on a CPU")
    if options.optimizer == "master" and options.precision != "bf16":
        problems.append("optimizer='master' keeps bf16 weights for bf16 autocast: it needs precision='bf16'")
    if options.precision == "bf16":
        bf16 = profile.supports_bf16 if profile is not None else (
            device.type != "cuda" or torch.cuda.is_bf16_supported(including_emulation=False))
        if not bf16:
            problems.append(f"precision='bf16' is not supported on {where}")
    if options.precision == "tf32":
        tf32 = profile.supports_tf32 if profile is not None else (
            device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0))
        if not tf32:
            problems.append(f"precision='tf32' is not supported on {where}")
    if options.cuda_graph:
        if options.precision == "fp16":
            problems.append("cuda_graph cannot capture fp16's GradScaler (its inf check syncs with the host)")
        if options.item_sync:
            problems.append("cuda_graph cannot capture loss.item(): set item_sync=False")
        if options.compile in GRAPHED_COMPILE_MODES:
            problems.append(f"cuda_graph captures the whole step itself: compile={options.compile!r} would "
                            "capture CUDA graphs inside it; use 'default' or 'max-autotune-no-cudagraphs'")
        if options.optimizer == "adamw8bit":
            problems.append("cuda_graph: bitsandbytes' AdamW8bit is not capturable")
    if problems:
        raise UnsupportedOptions("; ".join(problems))


def _loss_fn(kind: str) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Mean cross-entropy of ``hidden (N, H) @ weight (V, H).T`` against targets (N,), by implementation."""
    if kind == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss()
        return lambda hidden, weight, target: liger(weight, hidden, target)
    if kind == "fused":
        from kernels.fused_linear_ce import fused_linear_cross_entropy

        def fused(hidden: Tensor, weight: Tensor, target: Tensor) -> Tensor:
            device = hidden.device.type
            if torch.is_autocast_enabled(device):  # its matmuls write to out= buffers, which autocast skips
                dtype = torch.get_autocast_dtype(device)
                hidden, weight = hidden.to(dtype), weight.to(dtype)
            return fused_linear_cross_entropy(hidden, weight, target)

        return fused
    from kernels.cross_entropy import chunked_cross_entropy, fused_linear_cross_entropy_eager

    return chunked_cross_entropy if kind == "chunked" else fused_linear_cross_entropy_eager


def _grad_stats_fns(kind: str) -> tuple[Callable, Callable] | None:
    """(stats(params) -> {'grad_norm', 'param_norm'}, clip(params, max_norm)) from kernels.grad_stats."""
    if kind == "none":
        return None
    from kernels import grad_stats

    return getattr(grad_stats, f"grad_stats_{kind}"), getattr(grad_stats, f"clip_grad_norm_{kind}")


def clips_in_optimizer(options: StepOptions) -> bool:
    """Whether gradient clipping rides on the fused (or master) AdamW's ``grad_scale`` input instead of its
    own pass: with foreach statistics (the norm is at hand on the device) and no GradScaler (which owns
    grad_scale)."""
    return (options.grad_stats == "foreach" and options.optimizer in ("fused", "master")
            and options.precision != "fp16")


def _adamw(model: Decoder, kind: str, capturable: bool) -> torch.optim.Optimizer | MasterAdamW:
    params = list(model.parameters())
    if kind == "master":  # the matmul weights become bf16; the embedding and norm weights stay fp32
        linear = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
        return MasterAdamW(params, linear, lr=LR, weight_decay=WEIGHT_DECAY)
    if kind == "adamw8bit":
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params, lr=LR, weight_decay=WEIGHT_DECAY)
    impl = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[kind]
    return torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, capturable=capturable, **impl)


def _model_loss(model: Decoder, loss: Callable[[Tensor, Tensor, Tensor], Tensor], idx: Tensor,
                targets: Tensor) -> Tensor:
    """Forward + loss, what ``compile`` compiles; a function, not a method, so a TrainStep holds no cycle."""
    hidden = model(idx).flatten(0, 1)
    return loss(hidden, model.lm_head.weight, targets.flatten())


class TrainStep:
    """A decoder, its AdamW and one fixed random batch; calling it runs one optimizer step as options say.

    ``stats`` holds the last step's {'grad_norm', 'param_norm'} (device tensors) when grad_stats is on.
    """

    def __init__(self, config: ModelConfig, options: StepOptions, device: str | torch.device, seed: int):
        self.options, self.device = options, torch.device(device)
        self.config = dataclasses.replace(config, qk_norm=options.qk_norm is not None)
        torch.manual_seed(seed)  # the model init: identical for every step built with this seed
        with self.device:
            self.model = Decoder(self.config, norm_impl=options.norm, mlp_impl=options.mlp,
                                 qk_norm_impl=options.qk_norm or "eager", attn_mask=options.attn_mask,
                                 fused_proj=options.fused_proj, rope_impl=options.rope)
        self.model.checkpoint_every = options.checkpoint_every
        self.params = list(self.model.parameters())
        self.optimizer = _adamw(self.model, options.optimizer, capturable=options.cuda_graph)
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
        # MasterAdamW takes the parameter norm in its own pass and divides the gradients without writing
        # them back: grads() applies the last step's divisor, so checks see the gradients the update used.
        self._master = isinstance(self.optimizer, MasterAdamW)
        self._grad_divisor: Tensor | None = None
        self._model_loss_fn = _model_loss
        if options.compile and options.compile_scope == "blocks":
            for module in (*self.model.blocks, self.model.norm):
                module.compile(mode=options.compile)
            self._loss = torch.compile(self._loss, mode=options.compile)
        elif options.compile:
            self._model_loss_fn = torch.compile(_model_loss, mode=options.compile)
        self.stats: dict[str, Tensor] | None = None
        self._losses: list[float | Tensor] = []
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_loss: Tensor | None = None  # the captured step's loss, rewritten by every replay
        if options.cuda_graph:
            self._capture()

    @property
    def loss_history(self) -> list[float]:
        """Loss of every step so far (reading it syncs once when item_sync is off)."""
        return [float(loss) for loss in self._losses]

    def __call__(self) -> Tensor:
        """Run one optimizer step; returns its loss (that of the weights before the update), detached."""
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
        """Forward and loss only, building the autograd graph as training does (eager under cuda_graph)."""
        with self._matmul_precision():
            return self._forward_loss().detach()

    def grads(self) -> dict[str, Tensor]:
        """Copies of the gradients the last optimizer step used (unscaled and clipped), by parameter name
        (of the unfused model: a fused projection's gradient is split into its layers')."""
        named = self.model.named_parameters()
        divisor = self._grad_divisor
        return self.model.unfused({name: p.grad.detach().clone() if divisor is None else p.grad.detach().float()
                                   / divisor for name, p in named if p.grad is not None})

    @contextmanager
    def _matmul_precision(self) -> Iterator[None]:
        """TF32 matmuls on (precision 'tf32') or off (any other) for forward, backward and optimizer."""
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.options.precision == "tf32"
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous

    def _forward_loss(self) -> Tensor:
        if self.options.compile in GRAPHED_COMPILE_MODES:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            return self._model_loss_fn(self.model, self._loss, self.idx, self.targets)

    def _step(self) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._forward_loss()
        self.scaler.scale(loss).backward()
        if self._stats is not None:
            stats, clip = self._stats
            self.scaler.unscale_(self.optimizer)
            self.stats = stats(self.params, param_norm=not self._master)  # MasterAdamW takes it in its pass
            if self._clip_in_optimizer:
                # The fused AdamW divides each gradient by its grad_scale (writing it back) in the same pass
                # as the update: one read and write of every gradient fewer than a separate clip.
                self.optimizer.grad_scale = 1.0 / clip_coefficient(self.stats["grad_norm"], MAX_GRAD_NORM)
                if self._master:
                    self._grad_divisor = self.optimizer.grad_scale
            elif self.options.grad_stats == "foreach":  # reuses the norm the statistics just took
                clip(self.params, MAX_GRAD_NORM, self.stats["grad_norm"])
            else:  # the seeds' loop takes the norm a second time
                clip(self.params, MAX_GRAD_NORM)
        self.scaler.step(self.optimizer)
        if self.stats is not None and "param_norm" not in self.stats:
            self.stats["param_norm"] = self.optimizer.param_norm()
        if self._clip_in_optimizer:
            del self.optimizer.grad_scale
        self.scaler.update()
        return loss.detach()

    def _capture(self) -> None:
        """Record ``_step`` into one CUDA graph, after warm-up steps on a side stream (PyTorch's recipe for
        whole-network capture); then restore the initial weights and a fresh optimizer state in place."""
        initial = self.optimizer.snapshot() if self._master else [p.detach().clone() for p in self.params]
        side, main = torch.cuda.Stream(self.device), torch.cuda.current_stream(self.device)
        side.wait_stream(main)
        with self._matmul_precision(), torch.cuda.stream(side):
            for _ in range(3):
                self._step()
        main.wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with self._matmul_precision(), torch.cuda.graph(self._graph):
            self._graph_loss = self._step()
        if self._master:
            self.optimizer.restore(initial)
            return
        with torch.no_grad():
            torch._foreach_copy_(self.params, initial)
            for state in self.optimizer.state.values():
                for value in state.values():
                    value.zero_()


def build_step(config: ModelConfig, options: StepOptions, device: str | torch.device = "cpu", seed: int = 0,
               profile: Any = None) -> TrainStep:
    """Validate ``options`` for ``device`` (and ``profile``) and build the step; seed fixes init, batch."""
    validate(options, device, profile)
    if options.optimizer == "adamw8bit" and importlib.util.find_spec("bitsandbytes") is None:
        raise UnsupportedOptions("optimizer='adamw8bit' needs bitsandbytes, which is not installed here")
    if options.seq_len > config.max_seq_len:
        raise UnsupportedOptions(f"seq_len {options.seq_len} exceeds max_seq_len {config.max_seq_len}")
    return TrainStep(config, options, device, seed)


@dataclass(frozen=True)
class CheckResult:
    """Candidate vs reference after one step from one init and batch, as relative differences.

    ``loss_rel``: the step's loss; ``grad_rel``: the worst parameter's gradient (``worst_param``);
    ``after_loss_rel``: the loss at the updated weights, which checks the optimizer step too.
    """

    loss_rel: float
    grad_rel: float
    worst_param: str
    after_loss_rel: float
    tolerance: tuple[float, float]  # (loss_rtol, grad_rtol)

    @property
    def ok(self) -> bool:
        loss_rtol, grad_rtol = self.tolerance
        return max(self.loss_rel, self.after_loss_rel) <= loss_rtol and self.grad_rel <= grad_rtol


def _rel(out: Tensor, ref: Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; inf when out is not finite."""
    out, ref = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


@dataclass(frozen=True)
class Reference:
    """What a freshly built step did in one optimizer step: its loss, its gradients (by parameter name),
    and the loss at the updated weights. Held on the host with ``host=True``, so the GPU is free for the
    candidate (a 1B step and its reference do not both fit beside each other on an 80 GB card)."""

    precision: str
    loss: Tensor
    grads: dict[str, Tensor]
    after_loss: Tensor


def reference_of(step: TrainStep, host: bool = False) -> Reference:
    """Run one step of a freshly built ``step`` and record it (see :class:`Reference`)."""
    if step.loss_history:
        raise ValueError("a reference needs a freshly built step (same init, no step taken)")
    move = (lambda t: t.cpu()) if host else (lambda t: t)
    loss = move(step())
    grads = {name: move(g) for name, g in step.grads().items()}
    return Reference(step.options.precision, loss, grads, move(step.forward_loss().clone()))


def check_against(baseline: TrainStep | Reference, candidate: TrainStep) -> CheckResult:
    """Run one step of ``candidate`` (freshly built with the baseline's seed) and compare its loss, its
    gradients and its loss after the update with the baseline's. The tolerance is the looser of the two
    precisions' :data:`TOLERANCES`."""
    ref = baseline if isinstance(baseline, Reference) else reference_of(baseline)
    got = reference_of(candidate)
    if ref.grads.keys() != got.grads.keys():
        raise ValueError(f"parameters differ: {sorted(ref.grads.keys() ^ got.grads.keys())}")
    errors = {name: _rel(got.grads[name], ref.grads[name].to(got.grads[name].device)) for name in ref.grads}
    worst = max(errors, key=errors.__getitem__)
    after = _rel(got.after_loss, ref.after_loss.to(got.after_loss.device))
    tol_b, tol_c = TOLERANCES[ref.precision], TOLERANCES[candidate.options.precision]
    tolerance = (max(tol_b[0], tol_c[0]), max(tol_b[1], tol_c[1]))
    return CheckResult(_rel(got.loss, ref.loss.to(got.loss.device)), errors[worst], worst, after, tolerance)
