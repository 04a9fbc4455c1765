"""Fused linear CE and chunked CE vs full logits + F.cross_entropy in float64: loss, d hidden, d
weight."""

from __future__ import annotations

import pytest
import torch
from autograd_numerics import seed_and_poison
from kernel_numerics import DEVICE, assert_rel_close, requires_cuda

from kernels import cross_entropy as ce
from kernels import fused_linear_ce as flce

# Relative-error tolerance per input dtype; fp32 is looser than for CE alone (matmuls over H and N).
TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 3e-3}
DTYPES = list(TOL)
IGNORE = -100


@pytest.fixture(autouse=True)
def _seeded_and_poisoned(request, monkeypatch):
    seed_and_poison(request, monkeypatch, ce, flce)


def make_inputs(n: int, h: int, v: int, dtype: torch.dtype, device: str = DEVICE):
    """hidden (n, h) ~ N(0, 1), weight (v, h) ~ N(0, 2/h) (logits of std ~1.4), targets with ignored
    rows."""
    hidden = torch.randn(n, h, device=device).to(dtype)
    weight = (torch.randn(v, h, device=device) * (2 / h) ** 0.5).to(dtype)
    target = torch.randint(0, v, (n,), device=device)
    target[torch.rand(n, device=device) < 0.2] = IGNORE
    target[0] = IGNORE
    target[1] = v - 1
    return hidden, weight, target


def check(
    fn, n, h, v, dtype, reduction, smoothing, device=DEVICE, grad_out: float | None = None, **kwargs
):
    """Compare fn(hidden, weight, target, ...) with the float64 reference (random grad_out unless
    given)."""
    hidden, weight, target = make_inputs(n, h, v, dtype, device)
    ref_h, ref_w = hidden.double().requires_grad_(), weight.double().requires_grad_()
    ref = flce.fused_linear_cross_entropy_eager(ref_h, ref_w, target, IGNORE, smoothing, reduction)
    go = torch.rand_like(ref) + 0.5 if grad_out is None else torch.full_like(ref, grad_out)
    ref.backward(go)

    x, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    out = fn(
        x, w, target, ignore_index=IGNORE, label_smoothing=smoothing, reduction=reduction, **kwargs
    )
    assert out.dtype == torch.float32
    out.backward(go.float())
    name = getattr(fn, "__name__", fn)
    tag = f"{name} {dtype} n={n} h={h} v={v} {reduction} eps={smoothing} {kwargs}"
    assert_rel_close(out, ref, TOL[dtype], f"loss {tag}")
    assert_rel_close(x.grad, ref_h.grad, TOL[dtype], f"d hidden {tag}")
    assert_rel_close(w.grad, ref_w.grad, TOL[dtype], f"d weight {tag}")
    assert x.grad.dtype == dtype and w.grad.dtype == dtype


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("n", "h", "v", "chunk_size", "inplace"),
    [(130, 96, 1037, None, False), (37, 130, 2111, 16, True)],
)
def test_fused_linear_cross_entropy(n, h, v, chunk_size, inplace, dtype, reduction, smoothing):
    """Default chunk at (130, 96, 1037) is 16 tokens: 9 chunks, the last of 2 rows."""
    check(
        flce.fused_linear_cross_entropy,
        n,
        h,
        v,
        dtype,
        reduction,
        smoothing,
        chunk_size=chunk_size,
        inplace_grad_hidden=inplace,
    )


@pytest.mark.parametrize(
    ("n", "h", "v", "chunk"),
    [
        (8192, 2048, 32000, 1024),
        (8192, 2048, 128256, 384),
        (8192, 768, 32000, 384),
        (130, 96, 1037, 16),
    ],
)
def test_inplace_chunk_size(n, h, v, chunk):
    """In place, the chunk grows into the freed N * H elements and never needs more memory than the
    default."""
    base = ce.default_chunk_size(n, h, v)
    assert flce.inplace_chunk_size(n, h, v) == chunk
    assert base <= chunk and chunk * v <= base * v + n * h


def test_grad_output_one_skips_scaling():
    check(flce.fused_linear_cross_entropy, 37, 96, 1000, torch.float32, "mean", 0.1, grad_out=1.0)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_chunked_cross_entropy(dtype, reduction):
    check(ce.chunked_cross_entropy, 130, 96, 1037, dtype, reduction, 0.1, chunk_size=48)


def test_module_and_inference():
    """The module flattens (B, T, H); with no grad required only the loss is computed."""
    module = flce.FusedLinearCrossEntropy(
        96, 1037, ignore_index=IGNORE, label_smoothing=0.1, device=DEVICE
    )
    hidden, _, target = make_inputs(2 * 37, 96, 1037, torch.float32)
    ref = flce.fused_linear_cross_entropy_eager(
        hidden.double(), module.weight.double(), target, IGNORE, 0.1
    )
    loss = module(hidden.view(2, 37, 96), target.view(2, 37))
    assert_rel_close(loss, ref, TOL[torch.float32], "module loss")
    loss.backward()
    assert module.weight.grad is not None
    with torch.no_grad():
        assert_rel_close(module(hidden, target), ref, TOL[torch.float32], "no-grad loss")


def test_wrong_kernel_is_caught(monkeypatch):
    """A mean over one token too many must fail the comparison."""
    monkeypatch.setattr(
        flce, "num_valid", lambda target, ignore_index: (target != ignore_index).sum() + 1
    )
    with pytest.raises(AssertionError, match="relative error"):
        check(flce.fused_linear_cross_entropy, 37, 96, 1037, torch.float32, "mean", 0.0)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("inplace", [False, True])
def test_fused_linear_cross_entropy_gpu(inplace):
    """Goal shape (N=8192, H=2048, V=32000, bf16): accuracy, and extra memory no more than d hidden,
    d weight, one logits chunk and the loss rows (plus 16 MiB slack): 2 * (NH + VH + 512 V) + 4N
    bytes either way."""
    n, h, v = 8192, 2048, 32000
    check(
        flce.fused_linear_cross_entropy,
        n,
        h,
        v,
        torch.bfloat16,
        "mean",
        0.0,
        device="cuda",
        inplace_grad_hidden=inplace,
    )

    hidden, weight, target = make_inputs(n, h, v, torch.bfloat16, "cuda")
    weight.requires_grad_()
    run = lambda x: flce.fused_linear_cross_entropy(x, weight, target, inplace_grad_hidden=inplace)
    run(hidden.clone().requires_grad_()).backward()  # warm up (cuBLAS workspaces)
    weight.grad = None
    x = hidden.clone().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = run(x)
    peak = torch.cuda.max_memory_allocated() - base
    budget = 2 * (n * h + v * h + 512 * v) + 4 * n + 16 * 2**20
    assert peak <= budget, f"peak extra memory {peak / 2**20:.1f} MiB > {budget / 2**20:.1f} MiB"
    loss.backward()


def test_fp16_mean_gradients_survive_loss_scaling():
    """fp16 'mean' under a GradScaler's loss scale (65536): near-uniform softmax over V=8192 divided
    by N=1024 is ~1e-7, at fp16's subnormal floor, so the 1/N must reach the gradients with the
    scale, in backward."""
    n, h, v, scale = 1024, 64, 8192, 65536.0
    hidden = torch.randn(n, h, device=DEVICE).to(torch.float16)
    # logits near 0, as at init
    weight = (torch.randn(v, h, device=DEVICE) * 0.01).to(torch.float16)
    target = torch.randint(0, v, (n,), device=DEVICE)
    ref_h, ref_w = hidden.double().requires_grad_(), weight.double().requires_grad_()
    (flce.fused_linear_cross_entropy_eager(ref_h, ref_w, target) * scale).backward()
    x, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    (flce.fused_linear_cross_entropy(x, w, target) * scale).backward()
    assert_rel_close(x.grad, ref_h.grad, TOL[torch.float16], "fp16 d hidden under loss scaling")
    assert_rel_close(w.grad, ref_w.grad, TOL[torch.float16], "fp16 d weight under loss scaling")
