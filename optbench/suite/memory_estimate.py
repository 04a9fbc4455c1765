"""Device memory estimates of the suite's cases: what a card can hold, what a kernel case and a
training step need, and which remedy would make a step fit.

Memory of a training step (``step_memory_bytes``), an estimate for ``models.step.TrainStep``::

    bytes = P * 16 + 2 * P_cast [autocast] + B * S * (L * block + loss)

- 16 B/param: fp32 weights, grads, AdamW exp_avg and exp_avg_sq (10 B/param with an 8-bit
  optimizer's 1-byte states). Counted in full although the step frees its grads before the forward
  (``zero_grad( set_to_none=True)``), so the estimate errs high by 4 B/param.
- 2 B/param under bf16/fp16 autocast: the half-precision weight copies autocast caches in the
  forward and the backward keeps: the LM head's and those of the blocks that are not checkpointed
  (plus the one block being recomputed); the embedding lookup is not cast.
- block, bytes per token and layer that the eager block saves for backward, with a = 2 (autocast) or
  4 (fp32, tf32) bytes per activation, d = d_model, f = ffn_dim, the residual stream in fp32: 16d
  (each of the two eager RMSNorms keeps its fp32 input and normalized x) + 5ad under autocast (q, k,
  v, gate and up each keep their own half-precision copy of their input; 8d in fp32: one input per
  norm) + 4ad (SDPA's q, k, v and output, k and v expanded to every head by an explicit mask or in
  fp32; 2ad + 2a*kv_dim with is_causal under autocast) + ad (o_proj's input) + 4af (gate, up,
  silu(gate), their product). bf16 autocast with a mask: 36d + 8f; fp32: 44d + 16f. Checkpointing
  every k-th block keeps only the fp32 input (4d) of its L // k blocks, plus one block's activations
  live again while it is recomputed.
- loss, bytes per token: 12 per logit (V) for the eager loss, which holds the fp32 log-softmax
  output for backward and, at the start of the backward, its incoming and outgoing fp32 gradients;
  the chunked, fused and Liger losses hold one chunk of logits about the size of the hidden states
  (``default_chunk_size``): 12d.

A float64 step (the check's reference for an fp32 candidate) doubles every term. Triton/Liger
norms and SwiGLU, QK-norm and torch.compile change these terms by a few d (compile saves far
more); they are ignored, so for them the estimate is an upper bound. The CUDA context, library
workspaces and allocator fragmentation are left to ``MEMORY_MARGIN``. tests/test_plan.py
holds the estimate against the step peaks stored for the H100 in results/: never below them, and
within 25% where neither a CUDA graph nor torch.compile is on.
"""

from __future__ import annotations

from functools import cache

import torch

from models.config import ModelConfig, param_count
from models.step import StepOptions
from optbench.measure.hardware import HardwareProfile
from optbench.suite.ops import OPS

# share of a card's memory held back: CUDA context, cuBLAS workspaces, fragmentation
MEMORY_MARGIN = 0.10
STATE_BYTES = 16  # fp32 weights + grads + AdamW exp_avg + exp_avg_sq, per parameter
STATE_BYTES_8BIT = 10  # fp32 weights + grads + 1-byte exp_avg and exp_avg_sq
LOGIT_BYTES = 12  # fp32 log-softmax output + its incoming and outgoing gradients, per logit
# linear_ce implementations that hold the full (N, V) logits: eager and compile (fp32 log-softmax),
# and the CE-only kernels that take h @ w.T; the others compute the logits chunk by chunk.
_FULL_LOGITS = ("eager", "compile", "triton-ce", "liger-ce")


def gb(nbytes: float) -> str:
    """``nbytes`` in GB (1e9 bytes) for a message."""
    return f"{nbytes / 1e9:.1f} GB"


def usable_bytes(profile: HardwareProfile) -> float | None:
    """Device bytes a case may plan to use: the card's memory less MEMORY_MARGIN; None if unknown
    (CPU)."""
    return None if profile.mem_gb is None else profile.mem_gb * 1e9 * (1 - MEMORY_MARGIN)


def over_usable(need: float, usable: float, profile: HardwareProfile) -> str:
    """The message of an estimate ``need`` above the ``usable`` bytes of ``profile``'s card."""
    return f"~{gb(need)} (estimate) > {gb(usable)} usable of {profile.mem_gb:g} GB"


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


@cache
def kernel_bytes(op_name: str, shape: str, impl: str) -> int:
    """Device bytes one kernel case holds, estimated from its inputs built on the meta device:
    inputs and the gradients they carry; with a backward, their gradients plus the output and its
    gradient (each at most the largest input); the full fp32 logits (LOGIT_BYTES each) where
    linear_ce materializes them."""
    op = OPS[op_name]
    dims = op.shapes[shape]
    inputs = op.make_inputs(dims, op.dtype, "meta", None)
    held = sum(_nbytes(t) + _nbytes(t.grad) for t in inputs)
    if op.backward:
        held += sum(_nbytes(t) for t in inputs if t.requires_grad)
        held += 0 if op.loss_like else 2 * max(map(_nbytes, inputs))
    if op.loss_like and impl in _FULL_LOGITS:
        held += LOGIT_BYTES * dims["tokens"] * dims["vocab"]
    return held


def _block_bytes_per_token(cfg: ModelConfig, options: StepOptions) -> float:
    """Activation bytes one eager block saves for backward, per token (see the module docstring)."""
    autocast = options.precision in ("bf16", "fp16")
    a, d, f = (2 if autocast else 4), cfg.d_model, cfg.ffn_dim
    kv = cfg.n_kv_heads * cfg.head_dim
    norms = 2 * 2 * 4 * d  # two RMSNorms: fp32 input and normalized x
    if options.qk_norm:  # and the same of q's and k's heads
        norms += 2 * 4 * (d + kv)
    projection_inputs = 5 * a * d if autocast else 2 * 4 * d
    # k and v expanded to every head unless SDPA's GQA path runs (models.model.Attention)
    gqa = options.attn_mask == "is_causal" and autocast
    sdpa = a * (2 * d + 2 * kv if gqa else 4 * d)
    return norms + projection_inputs + sdpa + a * d + 4 * a * f


def _layers_bytes_per_token(cfg: ModelConfig, options: StepOptions) -> float:
    block = _block_bytes_per_token(cfg, options)
    checkpointed = cfg.n_layers // options.checkpoint_every if options.checkpoint_every else 0
    recompute = block if checkpointed else 0
    return (cfg.n_layers - checkpointed) * block + checkpointed * 4 * cfg.d_model + recompute


def _autocast_copied_params(cfg: ModelConfig, options: StepOptions) -> int:
    """Parameters whose half-precision copy the backward holds: the LM head and the weights of every
    block that is not checkpointed, plus the one block being recomputed (the embedding lookup is not
    cast)."""
    if options.precision not in ("bf16", "fp16"):
        return 0
    head = cfg.vocab_size * cfg.d_model
    block = (param_count(cfg, include_embedding=False) - head - cfg.d_model) // cfg.n_layers
    checkpointed = cfg.n_layers // options.checkpoint_every if options.checkpoint_every else 0
    return head + (cfg.n_layers - checkpointed + (1 if checkpointed else 0)) * block


def step_memory_bytes(cfg: ModelConfig, options: StepOptions) -> float:
    """Peak device bytes of one training step, estimated (formula in the module docstring)."""
    state_bytes = STATE_BYTES_8BIT if options.optimizer == "adamw8bit" else STATE_BYTES
    loss = LOGIT_BYTES * (cfg.vocab_size if options.loss == "eager" else cfg.d_model)
    activations = (
        options.batch_size * options.seq_len * (_layers_bytes_per_token(cfg, options) + loss)
    )
    fp32_bytes = param_count(cfg) * state_bytes + 2 * _autocast_copied_params(cfg, options)
    return (fp32_bytes + activations) * (2 if options.precision == "fp64" else 1)


def memory_remedy(cfg: ModelConfig, options: StepOptions, usable: float) -> str:
    """The first of checkpointing, an 8-bit optimizer, or both, that the estimate says would fit."""
    checkpointed = options.replace(checkpoint_every=1)
    remedies = [
        ("activation checkpointing", checkpointed),
        ("an 8-bit optimizer", options.replace(optimizer="adamw8bit")),
        ("checkpointing and an 8-bit optimizer", checkpointed.replace(optimizer="adamw8bit")),
    ]
    for name, opts in remedies:
        need = step_memory_bytes(cfg, opts)
        if need <= usable:
            return f"would fit with {name} (~{gb(need)})"
    return "would not fit even with checkpointing and an 8-bit optimizer"
