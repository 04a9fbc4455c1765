"""Gradient statistics and clipping: loop vs foreach vs torch.nn.utils.clip_grad_norm_ on float64
copies."""

from __future__ import annotations

import pytest
import torch
from kernel_numerics import DEVICE, assert_rel_close, requires_cuda

from kernels import grad_stats as gs
from models.config import CONFIGS
from models.model import Decoder
from optbench.suite.ops import GRAD_STATS
from optbench.suite.workloads import grad_stats_errors

pytestmark = pytest.mark.usefixtures("seeded")

# Relative-error tolerance: fp32 for the norms (fp32 accumulation of any dtype); clipped gradients
# are rounded to their own dtype.
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
SHAPES = [
    (3,),
    (7, 5),
    (1,),
    (13, 17, 3),
    (129,),
    (31, 33),
    (2, 3, 5, 7),
    (1000,),
    (11, 1),
    (257, 3),
] * 2


def make_params(device: str = DEVICE) -> list[torch.Tensor]:
    """20 tensors of odd shapes, every third bf16, with random gradients (one parameter without)."""
    params = []
    for i, shape in enumerate(SHAPES):
        dtype = torch.bfloat16 if i % 3 == 0 else torch.float32
        p = torch.randn(shape, device=device).to(dtype).requires_grad_()
        p.grad = (torch.rand(()) * torch.randn(shape, device=device)).to(dtype)
        params.append(p)
    params[4].grad = None
    return params


def float64_copies(params: list[torch.Tensor]) -> list[torch.Tensor]:
    copies = []
    for p in params:
        c = p.detach().double().requires_grad_()
        c.grad = None if p.grad is None else p.grad.double()
        copies.append(c)
    return copies


def test_grad_stats():
    params = make_params()
    ref = float64_copies(params)
    ref_grad_norm = torch.nn.utils.clip_grad_norm_(ref, float("inf"))
    ref_param_norm = torch.linalg.vector_norm(torch.cat([p.detach().flatten() for p in ref]))
    for fn in (gs.grad_stats_loop, gs.grad_stats_foreach):
        stats = fn(params)
        assert stats["grad_norm"].dtype == stats["param_norm"].dtype == torch.float32
        assert_rel_close(
            stats["grad_norm"], ref_grad_norm, TOL[torch.float32], f"{fn.__name__} grad_norm"
        )
        assert_rel_close(
            stats["param_norm"], ref_param_norm, TOL[torch.float32], f"{fn.__name__} param_norm"
        )


@pytest.mark.parametrize("clip_fn", [gs.clip_grad_norm_loop, gs.clip_grad_norm_foreach])
@pytest.mark.parametrize("max_norm_factor", [0.3, 3.0])
def test_clip_grad_norm(clip_fn, max_norm_factor):
    """max_norm below the norm (clipping) and above it (gradients unchanged)."""
    params = make_params()
    ref = float64_copies(params)
    max_norm = max_norm_factor * gs.grad_stats_loop(params)["grad_norm"].item()
    ref_total = torch.nn.utils.clip_grad_norm_(ref, max_norm)
    total = clip_fn(params, max_norm)
    assert total.dtype == torch.float32
    assert_rel_close(total, ref_total, TOL[torch.float32], f"{clip_fn.__name__} total norm")
    for i, (p, r) in enumerate(zip(params, ref, strict=True)):
        if p.grad is None:
            assert r.grad is None
            continue
        assert p.grad.dtype == p.dtype
        assert_rel_close(p.grad, r.grad, TOL[p.dtype], f"{clip_fn.__name__} grad {i} {p.dtype}")


def test_update_ratio():
    before = [p.detach() for p in make_params()]
    after = [b + 1e-2 * torch.randn_like(b) for b in before]
    diff = torch.cat(
        [(a.double() - b.double()).flatten() for a, b in zip(after, before, strict=True)]
    )
    ref = diff.norm() / torch.cat([b.double().flatten() for b in before]).norm()
    ratio = gs.update_ratio(before, after)
    assert ratio.dtype == torch.float32
    assert_rel_close(ratio, ref, TOL[torch.float32], "update_ratio")


def test_wrong_statistic_is_caught(monkeypatch):
    """Dropping one group (here bf16) from the foreach norm must fail the comparison."""
    real_groups = gs._groups
    without_bf16 = lambda ts: {k: v for k, v in real_groups(ts).items() if k[1] != torch.bfloat16}
    monkeypatch.setattr(gs, "_groups", without_bf16)
    with pytest.raises(AssertionError, match="relative error"):
        test_grad_stats()


@pytest.mark.parametrize("fn", [gs.grad_stats_loop, gs.grad_stats_foreach])
def test_float64_in_float64_out(fn):
    """Float64 parameters are reduced in float64: a true float64 reference, not an fp32 one
    relabelled."""
    ref = float64_copies(make_params())
    stats = fn(ref)
    assert stats["grad_norm"].dtype == stats["param_norm"].dtype == torch.float64
    ref_grad_norm = torch.linalg.vector_norm(
        torch.cat([p.grad.flatten() for p in ref if p.grad is not None])
    )
    ref_param_norm = torch.linalg.vector_norm(torch.cat([p.detach().flatten() for p in ref]))
    assert_rel_close(stats["grad_norm"], ref_grad_norm, 1e-12, f"{fn.__name__} float64 grad_norm")
    assert_rel_close(
        stats["param_norm"], ref_param_norm, 1e-12, f"{fn.__name__} float64 param_norm"
    )


def fp32_params() -> tuple[torch.Tensor, ...]:
    """The op's inputs in small: fp32 parameters, each with a gradient whose global norm is above
    1."""
    params = tuple(p.float() for p in make_params(device="cpu"))
    for p in params:
        p.grad = torch.randn(p.shape)
    return params


def kernel_check_errors(impl: str) -> list[float]:
    """The errors kernel_work's grad_stats check finds for ``impl`` (its reference: the loop in
    float64)."""
    params = fp32_params()
    ref_params = tuple(p.detach().double() for p in params)
    dims = GRAD_STATS.shapes["100M"]
    return grad_stats_errors(
        GRAD_STATS.impl(impl, dims), GRAD_STATS.impl(GRAD_STATS.impls[0], dims), params, ref_params
    )


@pytest.mark.parametrize("impl", GRAD_STATS.impls)
def test_kernel_check_passes_and_is_not_vacuous(impl):
    """Both implementations pass; the fp32 loop's error against the float64 loop is small but not
    0."""
    errs = kernel_check_errors(impl)
    assert 0.0 < errs[0] and max(errs) <= GRAD_STATS.rtol, errs


def _norm_without_first(real):
    return lambda tensors: real(tensors[1:])


def _clip_off_by_one_percent(real):
    return lambda params, max_norm, total=None: real(params, 1.01 * max_norm, total)


@pytest.mark.parametrize(
    ("target", "plant"),
    [("_norm_foreach", _norm_without_first), ("clip_grad_norm_foreach", _clip_off_by_one_percent)],
    ids=["one-tensor-left-out-of-the-norm", "clip-scale-off-by-1%"],
)
def test_kernel_check_catches_a_planted_error(monkeypatch, target, plant):
    """Mutations of the foreach path only: kernel_work's check must reject them."""
    monkeypatch.setattr(gs, target, plant(getattr(gs, target)))
    assert max(kernel_check_errors("foreach")) > GRAD_STATS.rtol


@pytest.mark.parametrize("size", list(GRAD_STATS.shapes))
def test_kernel_check_sees_any_one_tensor_left_out(size):
    """kernel_work's check runs on a model's parameter shapes with N(0, 1) gradients: a norm that
    leaves out its smallest tensor is off by about half that tensor's share of the elements, which
    the tolerance must lie below."""
    with torch.device("meta"):
        sizes = [p.numel() for p in Decoder(CONFIGS[size]).parameters()]
    assert GRAD_STATS.rtol < min(sizes) / sum(sizes) / 2


@pytest.mark.gpu
@requires_cuda
def test_grad_stats_gpu():
    """A ~100M-parameter list (GPT-like, 12 layers, H=768, vocab 32000), fp32 weights and bf16
    norms."""
    layer = [(768, 768)] * 4 + [(2048, 768), (768, 2048), (2048, 768)] + [(768,)] * 2
    shapes = [(32000, 768)] + layer * 12 + [(768,)]
    params = []
    for i, shape in enumerate(shapes):
        dtype = torch.bfloat16 if len(shape) == 1 else torch.float32
        p = torch.randn(shape, device="cuda").to(dtype).requires_grad_()
        p.grad = (1e-3 * (i + 1) * torch.randn(shape, device="cuda")).to(dtype)
        params.append(p)
    ref = float64_copies(params)
    ref_param_norm = torch.linalg.vector_norm(torch.cat([p.detach().flatten() for p in ref]))
    ref_total = torch.nn.utils.clip_grad_norm_(ref, 1.0)
    stats = gs.grad_stats_foreach(params)
    assert_rel_close(stats["param_norm"], ref_param_norm, TOL[torch.float32], "cuda param_norm")
    assert_rel_close(
        gs.clip_grad_norm_foreach(params, 1.0), ref_total, TOL[torch.float32], "cuda total norm"
    )
    for i, (p, r) in enumerate(zip(params, ref, strict=True)):
        assert_rel_close(p.grad, r.grad, TOL[p.dtype], f"cuda clipped grad {i}")


@pytest.mark.gpu
@requires_cuda
def test_kernel_work_check_sees_the_smallest_tensor_left_out(monkeypatch):
    """kernel_work's check at 1B passes the foreach path at GRAD_STATS.rtol and rejects it once its
    norms leave out the model's smallest tensor (a norm weight, 1.9e-6 of its squared norm)."""
    from optbench.run.runner import WrongResult
    from optbench.suite.workloads import kernel_work

    work = kernel_work("grad_stats", "1B", "foreach", "cuda")
    assert work.check()["tolerance"] == GRAD_STATS.rtol
    del work
    real = gs._norm_foreach
    without_smallest = lambda ts: real([t for t in ts if t is not min(ts, key=torch.numel)])
    monkeypatch.setattr(gs, "_norm_foreach", without_smallest)
    with pytest.raises(WrongResult, match="over tolerance"):
        kernel_work("grad_stats", "1B", "foreach", "cuda").check()
