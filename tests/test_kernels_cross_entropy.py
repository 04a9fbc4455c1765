"""Triton cross-entropy vs F.cross_entropy on float64 logits: loss and d logits, every reduction and
dtype."""

from __future__ import annotations

import pytest
import torch
from autograd_numerics import seed_and_poison
from kernel_numerics import DEVICE, assert_rel_close, requires_cuda

from kernels import cross_entropy as ce

# Relative-error tolerance ||out - ref|| / ||ref|| per input dtype (loss and gradient).
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 3e-3}
DTYPES = list(TOL)
IGNORE = -100


@pytest.fixture(autouse=True)
def _seeded_and_poisoned(request, monkeypatch):
    seed_and_poison(request, monkeypatch, ce)


def make_inputs(n: int, v: int, dtype: torch.dtype, device: str = DEVICE):
    """Random logits (scale 4: peaked softmax) and targets with about a fifth of the rows
    ignored."""
    logits = (4 * torch.randn(n, v, device=device)).to(dtype)
    target = torch.randint(0, v, (n,), device=device)
    target[torch.rand(n, device=device) < 0.2] = IGNORE
    target[0] = IGNORE  # at least one ignored row ...
    target[1] = v - 1  # ... and one valid, at the last column
    return logits, target


def check(
    n: int,
    v: int,
    dtype: torch.dtype,
    reduction: str,
    smoothing: float,
    inplace: bool,
    device: str = DEVICE,
) -> None:
    logits, target = make_inputs(n, v, dtype, device)
    ref_logits = logits.double().requires_grad_()
    ref = ce.cross_entropy_eager(ref_logits, target, IGNORE, smoothing, reduction)
    grad_out = torch.rand_like(ref) + 0.5
    ref.backward(grad_out)

    x = logits.clone().requires_grad_()
    out = ce.cross_entropy(x, target, IGNORE, smoothing, reduction, inplace_grad=inplace)
    assert out.dtype == torch.float32
    out.backward(grad_out.float())
    assert x.grad.dtype == dtype
    tag = f"{dtype} n={n} v={v} {reduction} eps={smoothing} inplace={inplace}"
    assert_rel_close(out, ref, TOL[dtype], f"loss {tag}")
    assert_rel_close(x.grad, ref_logits.grad, TOL[dtype], f"d logits {tag}")
    assert (x.grad[target == IGNORE] == 0).all(), "ignored rows must get a zero gradient"


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "v", "inplace"), [(37, 1037, True), (130, 2111, False)])
def test_cross_entropy(n, v, inplace, dtype, reduction, smoothing):
    check(n, v, dtype, reduction, smoothing, inplace)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_two_pass(monkeypatch, dtype, smoothing):
    """Rows wider than MAX_ONE_BLOCK_V take the online-softmax loop (1000 = 512 + 488: a partial
    block)."""
    monkeypatch.setattr(ce, "MAX_ONE_BLOCK_V", 256)
    monkeypatch.setattr(ce, "TWO_PASS_BLOCK", 512)
    check(37, 1000, dtype, "mean", smoothing, inplace=False)


def test_no_grad_leaves_logits_untouched():
    logits, target = make_inputs(37, 1037, torch.bfloat16)
    before = logits.clone()
    out = ce.cross_entropy(logits, target, IGNORE, 0.1, "sum")
    assert torch.equal(logits, before)
    assert_rel_close(
        out, ce.cross_entropy_eager(logits.double(), target, IGNORE, 0.1, "sum"), 1e-5, "loss"
    )


def test_wrong_kernel_is_caught(monkeypatch):
    """A mean over one token too many (loss and gradient off by ~1/n) must fail the comparison."""
    monkeypatch.setattr(
        ce, "num_valid", lambda target, ignore_index: (target != ignore_index).sum() + 1
    )
    with pytest.raises(AssertionError, match="relative error"):
        check(37, 1037, torch.float32, "mean", 0.0, inplace=True)


def test_poison_is_active():
    assert ce.torch.empty(3).isnan().all()
    with pytest.raises(AssertionError, match="relative error"):
        assert_rel_close(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]), 1.0, "nan")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("v", [32000, 128256])
def test_cross_entropy_gpu(v):
    """Real shapes: 32000 takes the one-block path, 128256 the two-pass loop."""
    check(4096, v, torch.bfloat16, "mean", 0.1, inplace=True, device="cuda")
    check(4096, v, torch.bfloat16, "none", 0.0, inplace=False, device="cuda")
