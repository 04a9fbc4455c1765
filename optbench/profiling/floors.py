"""The floor of each kernel class of a training step: the fewest FLOPs and bytes its work needs, at
the device's measured ceilings, beside the device time the class took.

A class's floor is max(FLOPs / matmul ceiling, bytes / copy bandwidth) (the roofline,
:func:`optbench.measure.roofline.floor_ms`), summed over the calls of one step. The counts, per
step of T = batch x sequence tokens through L blocks of width d, q heads Hq of head_dim D, MLP
width F and vocabulary V (s: the bytes of a bf16 element, 2):

- **gemm**: 3 GEMMs of 2 x T x in x out FLOPs per Linear layer (forward, grad input, grad weight),
  the LM head's too (a fused or liger loss runs them as ``aten::mm`` in its chunks: gemm's
  kernels). **gemm_fp8**: the Float8Linear layers' likewise, at the FP8 ceiling when one is given.
- **attention**: Q K^T and P V forward, 2 x T x S x Hq x D FLOPs each for sequences of S, halved
  by the causal mask; the backward's dP, dS K, dS^T Q and P^T dO twice the forward (a recomputed
  Q K^T, as FlashAttention does, is the kernel's choice, not counted): 6 x T x S x Hq x D per
  layer.
- **norm**: per block two RMSNorms and the final one. Where the norm adds the residual in its pass
  (``norm`` triton: an fp32 residual stream), 2L of them are ``optbench.suite.ops.ADD_RMSNORM``'s
  fewest bytes and one is ``RMSNORM``'s, else all 2L + 1 are ``RMSNORM``'s at bf16 (the residual
  adds are then elementwise: read two, write one, forward only; a bound below what an fp32 stream
  moves). QK-norm adds ``QKNORM``'s per block.
- **elementwise**: ``SWIGLU``'s and ``QKV_ROPE``'s fewest bytes per block (forward and backward),
  and the residual adds above.
- **cross_entropy**: the logits read once and their gradient written once, 2 x T x V x s bytes;
  none where the loss fuses the LM head (fused, liger: no whole logits need reach memory).
- **optimizer**: AdamW reads the gradient, weight (fp32: the master where the model holds bf16),
  m and v and writes the weight, m and v (and the bf16 weight): 28 bytes per parameter of fp32 or
  bf16 weights, 16 with 8-bit moments (scales not counted); the gradient norm reads each gradient
  once more, the parameter norm each weight (MasterAdamW takes it in its own pass), and a clip
  outside the optimizer reads and writes each gradient.
- **fp8_cast**: each Float8Linear layer's input and weight (forward) and output gradient (backward),
  each element read in bf16 twice (its amax first: a dynamic scale is known only after a whole
  pass) and written once in float8 per layout it is multiplied in (row- and column-major): 6 bytes
  an element, FP8_CAST_BYTES.
- **communication**, **other**: no floor model (one GPU: no collective to count).

The ceilings are measured on the profiled device
(:func:`optbench.measure.roofline.measure_ceilings`: a bf16 8192^3 matmul and a 1 GiB copy), the
FP8 one likewise (:func:`optbench.measure.roofline.fp8_burst_tflops`) or given; each the fastest
call after an idle spell, as a step's GEMMs beat a power-capped sustained rate. A class under its
floor is a measurement (or counting) problem until explained.
"""

from __future__ import annotations

from typing import Any

from models.step import TrainStep, clips_in_optimizer
from optbench.measure.roofline import Ceilings, floor_ms
from optbench.profiling.kernel_classes import KERNEL_CLASSES, is_float8_linear, linear_gemm_flops
from optbench.suite.ops import ADD_RMSNORM, QKNORM, QKV_ROPE, RMSNORM, SWIGLU

BF16_BYTES = 2
ADAMW_BYTES = 28  # per parameter, fp32 or bf16 weights (module docstring)
ADAMW_8BIT_BYTES = 16
FP8_CAST_BYTES = 6  # per element cast: bf16 read for the amax and for the cast, two float8 layouts
FUSED_LOSSES = ("fused", "liger")  # losses that never hold the whole logits


def _work(step: TrainStep) -> dict[str, tuple[float, float]]:
    """(FLOPs, bytes) per kernel class for one step (module docstring); classes without a floor
    model are absent."""
    cfg, o, t = step.config, step.options, step.tokens_per_step
    L, d, s = cfg.n_layers, cfg.d_model, BF16_BYTES
    rows = {"rows": t, "hidden": d}
    gemm = linear_gemm_flops(step.model, t)

    attention = 6.0 * t * o.seq_len * cfg.n_heads * cfg.head_dim * L
    if o.norm == "triton":
        norm = 2 * L * ADD_RMSNORM.bytes(rows, s)["fwdbwd"] + RMSNORM.bytes(rows, s)["fwdbwd"]
        adds = 0.0
    else:
        norm = (2 * L + 1) * RMSNORM.bytes(rows, s)["fwdbwd"]
        adds = 2 * L * 3.0 * t * d * s
    heads = {
        "tokens": t,
        "q_heads": cfg.n_heads,
        "kv_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
    }
    if cfg.qk_norm:
        norm += L * QKNORM.bytes(heads, s)["fwdbwd"]
    elementwise = adds + L * (
        SWIGLU.bytes({"rows": t, "inter": cfg.ffn_dim}, s)["fwdbwd"]
        + QKV_ROPE.bytes(heads, s)["fwdbwd"]
    )
    return {
        "gemm_fp8": (gemm["fp8"], 0.0),
        "fp8_cast": (0.0, _fp8_cast_bytes(step)),
        "gemm": (gemm["other"], 0.0),
        "attention": (attention, 0.0),
        "norm": (0.0, norm),
        "elementwise": (0.0, elementwise),
        "cross_entropy": (0.0, 0.0 if o.loss in FUSED_LOSSES else 2.0 * t * cfg.vocab_size * s),
        "optimizer": (0.0, _optimizer_bytes(step)),
    }


def _fp8_cast_bytes(step: TrainStep) -> float:
    """The FP8 casts' fewest bytes per step (module docstring): every Float8Linear layer's input
    (T x in), output gradient (T x out) and weight (in x out)."""
    t = step.tokens_per_step
    elements = sum(
        t * m.in_features + t * m.out_features + m.in_features * m.out_features
        for m in step.model.modules()
        if is_float8_linear(m)
    )
    return float(FP8_CAST_BYTES * elements)


def _optimizer_bytes(step: TrainStep) -> float:
    """AdamW's and the gradient statistics' fewest bytes per step (module docstring)."""
    o = step.options
    per_param = ADAMW_8BIT_BYTES if o.optimizer == "adamw8bit" else ADAMW_BYTES
    # a gradient has its weight's dtype: this is each gradient's bytes and each weight's
    weight_bytes = sum(p.numel() * p.element_size() for p in step.params)
    total = per_param * sum(p.numel() for p in step.params)
    if o.grad_stats != "none":
        grad_passes = 1 if clips_in_optimizer(o) else 3  # the norm's read (+ the clip's two)
        param_norm = o.optimizer != "master"  # MasterAdamW takes it in its own pass
        total += weight_bytes * (grad_passes + param_norm)
    return float(total)


def class_floors(
    step: TrainStep, ms: dict[str, float], ceilings: Ceilings, fp8_ceiling: float | None
) -> dict[str, Any]:
    """Per kernel class of ``ms`` (device ms per step), in KERNEL_CLASSES' order: its FLOPs, bytes,
    floor ms (None: no floor model, or an unknown ceiling) and ms over it; the totals over the
    classes with a floor; the ceilings used."""
    work, rows = _work(step), {}
    for kind in KERNEL_CLASSES:
        flops, nbytes = work.get(kind, (None, None))
        peak = fp8_ceiling if kind == "gemm_fp8" else ceilings.peak("bf16")
        at = Ceilings({"bf16": peak}, ceilings.bandwidth_gbps, ceilings.source)
        floor = None if flops is None else floor_ms(flops, nbytes, at, "bf16")
        rows[kind] = {
            "class": kind,
            "ms": ms[kind],
            "flops": flops,
            "bytes": nbytes,
            "floor_ms": floor,
            "over_ms": None if floor is None else ms[kind] - floor,
        }
    floored = [r for r in rows.values() if r["floor_ms"] is not None]
    return {
        "classes": list(rows.values()),
        "floored_ms": sum(r["ms"] for r in floored),
        "floor_ms": sum(r["floor_ms"] for r in floored),
        "ceilings": {
            "bf16_tflops": ceilings.peak("bf16"),
            "fp8_tflops": fp8_ceiling,
            "bandwidth_gbps": ceilings.bandwidth_gbps,
            "source": ceilings.source,
        },
    }
