"""How each kernel op of the catalog is run: its implementations, inputs and FLOP/byte counts.

One :class:`Op` per catalog entry (``optbench.suite.catalog.KERNELS``, which lists its shapes and
implementations): each implementation built by name (``eager`` is the baseline; ``compile`` is
``torch.compile`` of eager, compiled for each shape alone (:func:`compile_for_shape`); ``liger`` is
Liger-Kernel; ``triton`` is ours), a builder of fresh random inputs, and the fewest FLOPs and bytes
each call needs (kernels/README.md derives them). The asv suite and the pytest-benchmark twin both
build their work from here, through ``optbench.suite.workloads``.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from optbench.suite.catalog import KERNELS

Tensor = torch.Tensor
Inputs = tuple[Tensor, ...]
BF16 = torch.bfloat16


@dataclass(frozen=True)
class Op:
    """A kernel measured by the suite.

    ``make_inputs(dims, dtype, device, gen)`` returns the inputs (leaves that need gradients have
    ``requires_grad``); ``impl(name, dims)`` returns ``fn(*inputs) -> Tensor`` (or a tuple of them);
    ``flops``/``bytes`` give the fewest FLOPs / bytes for ``fwd`` and ``fwdbwd`` at dims and element
    size.
    """

    # its entry in optbench.suite.catalog.KERNELS: shapes, implementations, whether it has a
    # backward
    name: str
    make_inputs: Callable[[dict[str, int], torch.dtype, str, torch.Generator], Inputs]
    impl: Callable[[str, dict[str, int]], Callable[..., Tensor]]
    flops: Callable[[dict[str, int]], dict[str, float]]
    bytes: Callable[[dict[str, int], int], dict[str, float]]
    dtype: torch.dtype = BF16
    loss_like: bool = False  # output is a scalar loss: backward with grad 1
    # its check's relative-error tolerance, where tighter than workloads.KERNEL_RTOL[dtype]
    rtol: float | None = None

    @property
    def shapes(self) -> dict[str, dict[str, int]]:
        return KERNELS[self.name].shapes

    @property
    def impls(self) -> tuple[str, ...]:
        return KERNELS[self.name].impls

    @property
    def backward(self) -> bool:
        return KERNELS[self.name].backward


def _randn(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: str,
    gen: torch.Generator,
    scale: float = 1.0,
    grad: bool = True,
) -> Tensor:
    t = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale
    return t.to(dtype).requires_grad_(grad)


COMPILE_BACKEND: str | Callable = "inductor"
"""The backend of every ``compile`` implementation (tests set a recording one)."""


def compile_for_shape(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``torch.compile(fn)`` as a user compiles a model for its one input shape: sizes static
    (``dynamic=False``) and a code object of its own, so no other shape's graph is reused or
    recompiled with symbolic sizes, and other shapes' compilations never count against dynamo's
    per-code-object recompile limit (past which it runs the function eagerly). Call the result with
    one shape only."""

    def call(*args: Tensor) -> Tensor:
        return fn(*args)

    own = types.FunctionType(
        call.__code__.replace(), call.__globals__, call.__name__, None, call.__closure__
    )
    return torch.compile(own, dynamic=False, backend=COMPILE_BACKEND)


def _pick(
    table: dict[str, Callable[[], Callable[..., Tensor]]],
) -> Callable[[str, dict[str, int]], Callable[..., Tensor]]:
    """impl(name, dims) from builders of each implementation; every call builds a fresh one (so a
    ``compile`` implementation is compiled for the shape it is called with)."""

    def impl(name: str, dims: dict[str, int]) -> Callable[..., Tensor]:
        if name not in table:
            raise NotImplementedError(f"no {name!r} implementation")
        return table[name]()

    return impl


# --- RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w over rows of width H -------------------------


def _rmsnorm_impls() -> Callable[[str], Callable[..., Tensor]]:
    def eager():
        from kernels.rmsnorm import rms_norm_eager

        return rms_norm_eager

    def liger():
        from kernels.liger import liger

        return lambda x, w: liger("ops.rms_norm").LigerRMSNormFunction.apply(x, w, 1e-6)

    def triton():
        from kernels.rmsnorm import rms_norm

        return rms_norm

    return _pick(
        {
            "eager": eager,
            "compile": lambda: compile_for_shape(eager()),
            "liger": liger,
            "triton": triton,
        }
    )


RMSNORM = Op(
    name="rmsnorm",
    make_inputs=lambda d, dt, dev, g: (
        _randn((d["rows"], d["hidden"]), dt, dev, g),
        _randn((d["hidden"],), dt, dev, g),
    ),
    impl=_rmsnorm_impls(),
    flops=lambda d: {
        "fwd": 4.0 * d["rows"] * d["hidden"],
        "fwdbwd": 13.0 * d["rows"] * d["hidden"],
    },
    # fwd: read x, write y (+ w, rstd); fwd+bwd adds: read dy, x, write dx (+ dw partials).
    bytes=lambda d, s: {
        "fwd": 2.0 * d["rows"] * d["hidden"] * s,
        "fwdbwd": 5.0 * d["rows"] * d["hidden"] * s,
    },
)


# --- Residual add + RMSNorm: h = x + y, out = RMSNorm(h), as between a pre-norm model's blocks
# -----------


def _add_rmsnorm_impls() -> Callable[[str], Callable[..., Tensor]]:
    def eager():  # out in y's dtype, as autocast would cast it for the next matmul
        from kernels.rmsnorm import add_rms_norm_eager

        return lambda x, y, w: add_rms_norm_eager(x, y, w, out_dtype=y.dtype)

    def triton():
        from kernels.rmsnorm import add_rms_norm

        return lambda x, y, w: add_rms_norm(x, y, w, out_dtype=y.dtype)

    return _pick({"eager": eager, "compile": lambda: compile_for_shape(eager()), "triton": triton})


ADD_RMSNORM = Op(
    name="add_rmsnorm",
    make_inputs=lambda d, dt, dev, g: (
        _randn((d["rows"], d["hidden"]), torch.float32, dev, g),
        _randn((d["rows"], d["hidden"]), dt, dev, g),
        _randn((d["hidden"],), torch.float32, dev, g),
    ),
    impl=_add_rmsnorm_impls(),
    flops=lambda d: {
        "fwd": 5.0 * d["rows"] * d["hidden"],
        "fwdbwd": 15.0 * d["rows"] * d["hidden"],
    },
    # x, h, dh, dx fp32 (4 bytes), y, out, dout, dy in the op's dtype (s): fwd reads x, y, writes h,
    # out; bwd reads dout, h, dh, writes dx, dy (+ w, dw, rstd).
    bytes=lambda d, s: {
        "fwd": (8.0 + 2 * s) * d["rows"] * d["hidden"],
        "fwdbwd": (20.0 + 4 * s) * d["rows"] * d["hidden"],
    },
)


# --- SwiGLU: silu(a) * b, elementwise over (rows, I) ------------------------------------------


def _swiglu_impls() -> Callable[[str], Callable[..., Tensor]]:
    def eager():
        from kernels.swiglu import swiglu_eager

        return swiglu_eager

    def liger():
        from kernels.liger import liger

        return liger("ops.swiglu").LigerSiLUMulFunction.apply

    def triton():
        from kernels.swiglu import swiglu

        return swiglu

    return _pick(
        {
            "eager": eager,
            "compile": lambda: compile_for_shape(eager()),
            "liger": liger,
            "triton": triton,
        }
    )


SWIGLU = Op(
    name="swiglu",
    make_inputs=lambda d, dt, dev, g: (
        _randn((d["rows"], d["inter"]), dt, dev, g),
        _randn((d["rows"], d["inter"]), dt, dev, g),
    ),
    impl=_swiglu_impls(),
    flops=lambda d: {"fwd": 5.0 * d["rows"] * d["inter"], "fwdbwd": 15.0 * d["rows"] * d["inter"]},
    # fwd: read a, b, write y; bwd: read dy, a, b, write da, db.
    bytes=lambda d, s: {
        "fwd": 3.0 * d["rows"] * d["inter"] * s,
        "fwdbwd": 8.0 * d["rows"] * d["inter"] * s,
    },
)


# --- QK-norm: RMSNorm over head_dim of every head of q (B,S,Hq,D) and k (B,S,Hkv,D) -------------


def _qknorm_impls() -> Callable[[str], Callable[..., Tensor]]:
    def eager():
        from kernels.qknorm import qk_norm_eager

        return qk_norm_eager

    def triton():
        from kernels.qknorm import qk_norm

        return qk_norm

    return _pick({"eager": eager, "compile": lambda: compile_for_shape(eager()), "triton": triton})


def _qk_rows(d: dict[str, int]) -> int:
    return d["tokens"] * (d["q_heads"] + d["kv_heads"])


QKNORM = Op(
    name="qknorm",
    make_inputs=lambda d, dt, dev, g: (
        _randn((8, d["tokens"] // 8, d["q_heads"], d["head_dim"]), dt, dev, g),
        _randn((8, d["tokens"] // 8, d["kv_heads"], d["head_dim"]), dt, dev, g),
        _randn((d["head_dim"],), dt, dev, g),
        _randn((d["head_dim"],), dt, dev, g),
    ),
    impl=_qknorm_impls(),
    flops=lambda d: {
        "fwd": 4.0 * _qk_rows(d) * d["head_dim"],
        "fwdbwd": 13.0 * _qk_rows(d) * d["head_dim"],
    },
    bytes=lambda d, s: {
        "fwd": 2.0 * _qk_rows(d) * d["head_dim"] * s,
        "fwdbwd": 5.0 * _qk_rows(d) * d["head_dim"] * s,
    },
)


# --- RoPE of a packed q/k/v projection: q, k rotated by position, v split off, T tokens of D-wide
# heads -----


def _rope_impl(name: str, dims: dict[str, int]) -> Callable[..., Tensor]:
    """The shape's head split is part of the function: (qkv, cos, sin) -> (q, k, v)."""
    from kernels.rope import qkv_rope, qkv_rope_eager

    heads = dims["q_heads"], dims["kv_heads"]

    def eager(qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, ...]:
        # q, k in the projection's dtype, as autocast casts them for SDPA
        return tuple(t.to(qkv.dtype) for t in qkv_rope_eager(qkv, cos, sin, *heads))

    return _pick(
        {
            "eager": lambda: eager,
            "compile": lambda: compile_for_shape(eager),
            "triton": lambda: lambda qkv, cos, sin: qkv_rope(qkv, cos, sin, *heads),
        }
    )(name, dims)


def _rope_inputs(d: dict[str, int], dt: torch.dtype, dev: str, g: torch.Generator) -> Inputs:
    """qkv (8, T/8, Hq + 2 Hkv, D) and the model's cos, sin tables (T/8, 1, D), fp32 constants."""
    from kernels.rope import rope_tables

    seq, dim = d["tokens"] // 8, d["head_dim"]
    qkv = _randn((8, seq, d["q_heads"] + 2 * d["kv_heads"], dim), dt, dev, g)
    return qkv, *(t.to(dev) for t in rope_tables(seq, dim))


def _rope_elems(d: dict[str, int], kv_copies: int = 2) -> int:
    """Elements of the q and k heads plus kv_copies x those of the k (or v) heads."""
    return d["tokens"] * (d["q_heads"] + kv_copies * d["kv_heads"]) * d["head_dim"]


QKV_ROPE = Op(
    name="qkv_rope",
    make_inputs=_rope_inputs,
    impl=_rope_impl,
    # 3 FLOPs per rotated element (x1 c - x2 s) each way; v is only moved.
    flops=lambda d: {"fwd": 3.0 * _rope_elems(d, 1), "fwdbwd": 6.0 * _rope_elems(d, 1)},
    # fwd: read and write q, k (v may stay a view); bwd: read dq, dk, dv, write the packed gradient.
    bytes=lambda d, s: {
        "fwd": 2.0 * _rope_elems(d, 1) * s,
        "fwdbwd": 2.0 * (_rope_elems(d, 1) + _rope_elems(d)) * s,
    },
)


# --- LM head + cross-entropy: loss(h @ W^T, y) over N tokens, vocabulary V ----------------------


def _linear_ce_impls() -> Callable[[str], Callable[..., Tensor]]:
    def eager():
        return lambda h, w, y: F.cross_entropy((h @ w.t()).float(), y)

    def chunked():
        from kernels.cross_entropy import chunked_cross_entropy

        return lambda h, w, y: chunked_cross_entropy(h, w, y)

    def triton_ce():
        from kernels.cross_entropy import cross_entropy

        return lambda h, w, y: cross_entropy(h @ w.t(), y)

    def triton():
        from kernels.fused_linear_ce import fused_linear_cross_entropy

        return fused_linear_cross_entropy

    def liger_ce():
        from kernels.liger import liger

        loss = liger("transformers").LigerCrossEntropyLoss()
        return lambda h, w, y: loss(h @ w.t(), y)

    def liger():
        from kernels.liger import liger

        loss = liger("transformers").LigerFusedLinearCrossEntropyLoss()
        return lambda h, w, y: loss(w, h, y)

    return _pick(
        {
            "eager": eager,
            "compile": lambda: compile_for_shape(eager()),
            "chunked": chunked,
            "triton-ce": triton_ce,
            "triton": triton,
            "liger-ce": liger_ce,
            "liger": liger,
        }
    )


def _linear_ce_bytes(d: dict[str, int], s: int) -> dict[str, float]:
    n, h, v = d["tokens"], d["hidden"], d["vocab"]
    io = (n * h + v * h) * s  # read hidden and weight once
    # + write both gradients
    return {"fwd": float(io), "fwdbwd": float(2 * io + (n * h + v * h) * s)}


LINEAR_CE = Op(
    name="linear_ce",
    make_inputs=lambda d, dt, dev, g: (
        _randn((d["tokens"], d["hidden"]), dt, dev, g),
        _randn((d["vocab"], d["hidden"]), dt, dev, g, scale=0.02),
        torch.randint(0, d["vocab"], (d["tokens"],), generator=g, device=dev),
    ),
    impl=_linear_ce_impls(),
    # One GEMM forward, two more backward: 2*N*H*V FLOPs each (the softmax terms are negligible).
    flops=lambda d: {
        "fwd": 2.0 * d["tokens"] * d["hidden"] * d["vocab"],
        "fwdbwd": 6.0 * d["tokens"] * d["hidden"] * d["vocab"],
    },
    bytes=_linear_ce_bytes,
    loss_like=True,
)


# --- Gradient statistics + clipping over a model's parameters ------------------------------------


def _grad_stats_impls() -> Callable[[str], Callable[..., Tensor]]:
    def loop():
        from kernels.grad_stats import clip_grad_norm_loop, grad_stats_loop

        return _stats_then_clip(grad_stats_loop, lambda params, s: clip_grad_norm_loop(params, 1.0))

    def foreach():
        from kernels.grad_stats import clip_grad_norm_foreach, grad_stats_foreach

        return _stats_then_clip(
            grad_stats_foreach,
            lambda params, s: clip_grad_norm_foreach(params, 1.0, s["grad_norm"]),
        )

    return _pick({"loop": loop, "foreach": foreach})


def _stats_then_clip(stats: Callable, clip: Callable) -> Callable[..., Tensor]:
    """Gradient norm, parameter norm, then clipping at 1.0: what a logging training loop does (the
    loop implementation takes the gradient norm again to clip; the foreach one clips with the norm
    it has)."""

    def run(*params: Tensor) -> Tensor:
        s = stats(params)
        total = clip(params, s)
        return torch.stack([s["grad_norm"], s["param_norm"], total])

    return run


def _size(d: dict[str, int]) -> str:
    """The models.config.CONFIGS name of a grad_stats shape's model size (``size_m``, millions of
    parameters)."""
    return {100: "100M", 500: "500M", 1000: "1B"}[d["size_m"]]


def _model_param_shapes(size: str) -> list[tuple[int, ...]]:
    from models.config import CONFIGS
    from models.model import Decoder

    with torch.device("meta"):
        model = Decoder(CONFIGS[size])
    return [tuple(p.shape) for p in model.parameters()]


def _grad_stats_inputs(d: dict[str, int], dt: torch.dtype, dev: str, g: torch.Generator) -> Inputs:
    params = []
    for shape in _model_param_shapes(_size(d)):
        p = torch.randn(*shape, generator=g, device=dev, dtype=torch.float32).to(dt)
        p.grad = torch.randn(*shape, generator=g, device=dev, dtype=torch.float32).to(dt)
        params.append(p)
    return tuple(params)


def _n_params(d: dict[str, int]) -> int:
    from models.config import CONFIGS, param_count

    return param_count(CONFIGS[_size(d)])


GRAD_STATS = Op(
    name="grad_stats",
    make_inputs=_grad_stats_inputs,
    impl=_grad_stats_impls(),
    # Norms of grads and params (2 FLOPs/element each), clip scale (1 FLOP/element) ...
    flops=lambda d: {"fwd": 5.0 * _n_params(d)},
    # ... reading grads twice (norm, clip), params once, writing grads once.
    bytes=lambda d, s: {"fwd": 4.0 * _n_params(d) * s},
    dtype=torch.float32,
    # Sums of squares and one scale: the fp32 results' own rounding is their only error, while a
    # norm that leaves out the smallest tensor of the 100M-1B models (a norm weight) is off by
    # more than this (tests/test_kernels_grad_stats.py checks both on the CPU, and the 1B check
    # on a GPU); KERNEL_RTOL's 1e-4 passed a norm without any tensor holding less than 2e-4 of
    # the squared norm.
    rtol=5e-7,
)

OPS: dict[str, Op] = {
    op.name: op for op in (RMSNORM, ADD_RMSNORM, SWIGLU, QKNORM, QKV_ROPE, LINEAR_CE, GRAD_STATS)
}
