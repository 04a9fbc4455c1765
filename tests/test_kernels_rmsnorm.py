"""RMSNorm Triton kernels vs the float64 eager reference: output, dx and dweight."""

import types

import pytest
import torch
import triton
from autograd_numerics import assert_all_close, run_and_reference, seed_and_poison
from kernel_numerics import (
    DEVICE,
    assert_rel_close,
    randn_rows_at_eps_scales,
    rel_err,
    requires_cuda,
)

import kernels.rmsnorm as rmsnorm_mod
from kernels._common import row_tile
from kernels.rmsnorm import RMSNorm, add_rms_norm, add_rms_norm_eager, rms_norm, rms_norm_eager

# Relative-error bound (vs float64) for the output and every gradient, per input dtype. Triton's CPU
# interpreter rounds fp32 -> bf16 toward zero, so bf16 errors there are about twice the GPU's.
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
DTYPES = list(TOL)
NAMES = ["y", "dx", "dweight"]


@pytest.fixture(autouse=True)
def _seeded_and_poisoned(request, monkeypatch):
    seed_and_poison(request, monkeypatch, rmsnorm_mod)


def _inputs(shape, dtype, w_dtype=None):
    x = torch.randn(shape, device=DEVICE).to(dtype)
    w = torch.randn(shape[-1], device=DEVICE).to(w_dtype or dtype)
    return x, w


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape", [(3, 100), (37, 257), (2, 5, 300), (13, 768), (130, 1000)], ids=str
)
def test_matches_fp64(shape, dtype):
    results, refs = run_and_reference(rms_norm, rms_norm_eager, _inputs(shape, dtype))
    assert results[0].dtype == dtype
    assert_all_close(results, refs, NAMES, TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_strided_input_and_grad(dtype):
    """A row-strided slice of a wider buffer and a transposed (non-unit last stride) grad."""
    x = torch.randn(40, 160, device=DEVICE).to(dtype)[3:, :130]
    w = torch.randn(130, device=DEVICE).to(dtype)
    dy = torch.randn(130, 37, device=DEVICE).to(dtype).t()
    results, refs = run_and_reference(rms_norm, rms_norm_eager, [x, w], [dy])
    assert_all_close(results, refs, NAMES, TOL[dtype])


def test_fp32_weight_promotes_output():
    x, w = _inputs((21, 96), torch.bfloat16, torch.float32)
    results, refs = run_and_reference(rms_norm, rms_norm_eager, [x, w])
    assert results[0].dtype == torch.float32 and results[2].dtype == torch.float32
    assert_all_close(results, refs, NAMES, TOL[torch.bfloat16])


def test_module_impls_agree():
    eager, triton_ = (
        RMSNorm(200, impl="eager", device=DEVICE),
        RMSNorm(200, impl="triton", device=DEVICE),
    )
    with torch.no_grad():
        eager.weight.normal_()
        triton_.weight.copy_(eager.weight)
    x = torch.randn(6, 7, 200, device=DEVICE)
    assert rel_err(triton_(x), eager(x)) <= TOL[torch.float32]
    with pytest.raises(ValueError):
        RMSNorm(8, impl="cuda")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_where_eps_matters_match_fp64(dtype):
    """Rows of tiny and zero mean square, where eps sets the norm (a kernel without it gives NaN
    or 1/rms)."""
    x, w = randn_rows_at_eps_scales((37, 257), dtype), torch.randn(257, device=DEVICE).to(dtype)
    results, refs = run_and_reference(rms_norm, rms_norm_eager, [x, w])
    assert_all_close(results, refs, NAMES, TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_large_eps_matches_fp64(dtype):
    eps = 0.1  # 10% of N(0, 1)'s mean square: its rstd differs by 5% from one without eps
    results, refs = run_and_reference(
        lambda x, w: rms_norm(x, w, eps),
        lambda x, w: rms_norm_eager(x, w, eps),
        _inputs((37, 257), dtype),
    )
    assert_all_close(results, refs, NAMES, TOL[dtype])


@pytest.mark.parametrize(
    "mutate", ["flip_sign_dx", "scale_dweight", "nan_in_y", "eps", "short_grid"]
)
def test_wrong_kernel_is_caught(mutate, monkeypatch):
    dtype, tol = torch.float32, TOL[torch.float32]
    fn = rms_norm
    if mutate == "eps":
        fn = lambda x, w: rms_norm(x, w, eps=1e-2)
    # floor instead of ceil for the forward grid: trailing rows never written
    if mutate == "short_grid":
        floor_cdiv = types.SimpleNamespace(
            cdiv=lambda a, b: a // b, next_power_of_2=triton.next_power_of_2
        )
        monkeypatch.setattr(rmsnorm_mod, "triton", floor_cdiv)
    results, refs = run_and_reference(fn, rms_norm_eager, _inputs((37, 257), dtype))
    if mutate == "flip_sign_dx":
        results[1] = -results[1]
    if mutate == "scale_dweight":
        results[2] = results[2] * (1 + 3 * tol)
    if mutate == "nan_in_y":
        results[0][5, 7] = float("nan")
    if mutate == "short_grid":
        assert results[0][32:].isnan().all()  # the poisoned buffer shows the unwritten rows
    with pytest.raises(AssertionError):
        assert_all_close(results, refs, NAMES, tol)


@pytest.mark.gpu
@requires_cuda
def test_real_shape_gpu():
    results, refs = run_and_reference(
        rms_norm, rms_norm_eager, _inputs((16384, 4096), torch.bfloat16)
    )
    assert_all_close(results, refs, NAMES, TOL[torch.bfloat16])


def test_the_residual_backward_takes_its_own_tile(monkeypatch):
    """The residual add's backward asks for its tile (ADD_BWD_*), the plain one for the plain
    tile (BWD_*). Mutation: the add path launched without ``residual=True`` steps at the plain
    tile, as before b88c0ba."""
    seen = []
    tile = rmsnorm_mod.bwd_tile

    def spy(*args, residual=False):
        seen.append(residual)
        return tile(*args, residual=residual)

    monkeypatch.setattr(rmsnorm_mod, "bwd_tile", spy)
    x, y = torch.randn(2, 37, 257, device=DEVICE).unbind()
    w = torch.randn(257, device=DEVICE)
    run_and_reference(rms_norm, rms_norm_eager, [x, w])
    run_and_reference(add_rms_norm, add_rms_norm_eager, [x, y, w])
    assert seen == [False, True]
    h = torch.empty(8192, 2048)  # the 1B step's residual stream, fp32
    add_tile = rmsnorm_mod.ADD_BWD_TILE, rmsnorm_mod.ADD_BWD_THREAD_BYTES // 4
    assert tile(8192, 2048, h, residual=True) == row_tile(8192, 2048, *add_tile)
    assert tile(8192, 2048, h, residual=True) != tile(8192, 2048, h)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("hidden", [768, 1536, 2048], ids=str)
def test_add_real_shape_gpu(hidden):
    """The residual add and norm as the best steps run it (fp32 stream, bf16 branch and output),
    at each model size's width, 8192 rows: the residual backward's own tile."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x, y = (torch.randn(8192, hidden, generator=gen, device="cuda") for _ in range(2))
    w = torch.randn(hidden, generator=gen, device="cuda")
    results, refs = run_and_reference(
        lambda x, y, w: add_rms_norm(x, y, w, out_dtype=torch.bfloat16),
        add_rms_norm_eager,
        [x, y.bfloat16(), w],
    )
    assert_all_close(results, refs, ADD_NAMES, TOL[torch.bfloat16])


# --- add_rms_norm: (h = x + y, RMSNorm(h)) with the residual gradient added in the backward
# ---------------
ADD_NAMES = ["h", "out", "dx", "dy", "dweight"]


@pytest.mark.parametrize(
    "x_dtype, y_dtype, out_dtype",
    [
        # the model's: fp32 stream, bf16 branch, under autocast
        (torch.float32, torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32, None),
        (torch.bfloat16, torch.bfloat16, None),
        (torch.float16, torch.float16, torch.float16),
    ],
    ids=str,
)
@pytest.mark.parametrize("shape", [(3, 100), (37, 257), (2, 5, 300), (130, 1000)], ids=str)
def test_add_matches_fp64(shape, x_dtype, y_dtype, out_dtype):
    x = torch.randn(shape, device=DEVICE).to(x_dtype)
    y = torch.randn(shape, device=DEVICE).to(y_dtype)
    w = torch.randn(shape[-1], device=DEVICE)  # fp32, as the model's norm weights
    results, refs = run_and_reference(
        lambda x, y, w: add_rms_norm(x, y, w, out_dtype=out_dtype), add_rms_norm_eager, [x, y, w]
    )
    h, out, dx, dy, dw = results
    assert (h.dtype, dx.dtype, dy.dtype, dw.dtype) == (x_dtype, x_dtype, y_dtype, torch.float32)
    assert out.dtype == (out_dtype or torch.float32)
    low = max(TOL[d] for d in (x_dtype, y_dtype, out_dtype or torch.float32))
    assert_all_close(results, refs, ADD_NAMES, low)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_add_rows_where_eps_matters_match_fp64(dtype):
    """h = x + y with rows of tiny and zero mean square (x and y share each row's scale)."""
    x = randn_rows_at_eps_scales((37, 257), torch.float32)
    y = randn_rows_at_eps_scales((37, 257), dtype)
    results, refs = run_and_reference(
        lambda x, y, w: add_rms_norm(x, y, w, out_dtype=dtype),
        add_rms_norm_eager,
        [x, y, torch.randn(257, device=DEVICE)],
    )
    assert_all_close(results, refs, ADD_NAMES, TOL[dtype])


def test_add_residual_gradient_counts():
    """dx and dy are the residual gradient plus the norm's: a kernel that drops either term
    fails."""
    x, y, w = (
        torch.randn(37, 257, device=DEVICE),
        torch.randn(37, 257, device=DEVICE),
        torch.randn(257, device=DEVICE),
    )
    dh, dout = torch.randn(37, 257, device=DEVICE), torch.randn(37, 257, device=DEVICE)
    results, refs = run_and_reference(add_rms_norm, add_rms_norm_eager, [x, y, w], [dh, dout])
    assert_all_close(results, refs, ADD_NAMES, TOL[torch.float32])
    # the residual term alone, the norm's alone
    for wrong in (results[2] - dh, refs[2].float() - dh):
        with pytest.raises(AssertionError):
            assert_rel_close(wrong, refs[2], TOL[torch.float32], "dx")


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_residual_switch_adds_only_the_residual_terms(x_dtype, monkeypatch):
    """RMSNorm and AddRMSNorm run one body per direction, switched by HAS_RES: with a zero addend
    and a zero residual gradient, the residual path computes what the plain one does, bit for bit,
    at the plain path's backward tile (fp32 weights, as the model's; dweight to rounding, as the two
    may sum partials over different grids)."""
    monkeypatch.setattr(rmsnorm_mod, "ADD_BWD_TILE", rmsnorm_mod.BWD_TILE)
    monkeypatch.setattr(rmsnorm_mod, "ADD_BWD_THREAD_BYTES", rmsnorm_mod.BWD_THREAD_BYTES)
    x, dy = torch.randn(2, 37, 257, device=DEVICE).to(x_dtype).unbind()
    w = torch.randn(257, device=DEVICE)
    zero = torch.zeros(37, 257, device=DEVICE, dtype=x_dtype)
    (y, dx, dw), _ = run_and_reference(rms_norm, rms_norm_eager, [x, w], [dy.float()])
    results, _ = run_and_reference(
        add_rms_norm, add_rms_norm_eager, [x, zero, w], [zero, dy.float()]
    )
    h, out, dx_add, dy_add, dw_add = results
    assert torch.equal(h, x) and torch.equal(out, y)
    assert torch.equal(dx_add, dx) and torch.equal(dy_add, dx)
    assert rel_err(dw_add, dw) <= 1e-6


def test_module_add_and_norm_impls_agree():
    eager, triton_ = (
        RMSNorm(200, impl="eager", device=DEVICE),
        RMSNorm(200, impl="triton", device=DEVICE),
    )
    with torch.no_grad():
        eager.weight.normal_()
        triton_.weight.copy_(eager.weight)
    x, y = torch.randn(6, 7, 200, device=DEVICE), torch.randn(6, 7, 200, device=DEVICE).bfloat16()
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        (h, out), (h_ref, out_ref) = triton_.add_and_norm(x, y), eager.add_and_norm(x, y)
    assert out.dtype == torch.bfloat16 and h.dtype == torch.float32
    assert rel_err(h, h_ref) <= TOL[torch.float32] and rel_err(out, out_ref) <= TOL[torch.bfloat16]
