"""QK-norm Triton kernels vs the float64 eager reference: q/k outputs and dq, dk, dwq, dwk."""

import types

import pytest
import torch
import triton
from autograd_numerics import assert_all_close, run_and_reference, seed_and_poison
from kernel_numerics import DEVICE, randn_rows_at_eps_scales, rel_err, requires_cuda

import kernels.qknorm as qknorm_mod
import kernels.rmsnorm as rmsnorm_mod
from kernels.qknorm import QKNorm, qk_norm, qk_norm_eager

# Relative-error bound (vs float64) for both outputs and every gradient, per input dtype. Triton's
# CPU interpreter rounds fp32 -> bf16 toward zero, so bf16 errors there are about twice the GPU's.
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
DTYPES = list(TOL)
NAMES = ["q_out", "k_out", "dq", "dk", "dwq", "dwk"]


@pytest.fixture(autouse=True)
def _seeded_and_poisoned(request, monkeypatch):
    seed_and_poison(request, monkeypatch, qknorm_mod, rmsnorm_mod)


def _randn(*shape, dtype):
    return torch.randn(shape, device=DEVICE).to(dtype)


def _inputs(b, s, hq, hkv, d, dtype):
    return [
        _randn(b, s, hq, d, dtype=dtype),
        _randn(b, s, hkv, d, dtype=dtype),
        _randn(d, dtype=dtype),
        _randn(d, dtype=dtype),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "bshkd", [(1, 3, 4, 2, 100), (2, 5, 3, 1, 64), (1, 7, 6, 2, 128), (2, 33, 4, 2, 100)], ids=str
)
def test_matches_fp64(bshkd, dtype):
    results, refs = run_and_reference(qk_norm, qk_norm_eager, _inputs(*bshkd, dtype))
    assert results[0].dtype == results[1].dtype == dtype
    assert_all_close(results, refs, NAMES, TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_strided_views(dtype):
    """q and k sliced out of a fused qkv projection; grads in (B, H, S, D) storage, transposed."""
    b, s, hq, hkv, d = 2, 9, 4, 2, 96
    qkv = _randn(b, s, hq + 2 * hkv, d, dtype=dtype)
    q, k = qkv[:, :, :hq], qkv[:, :, hq : hq + hkv]
    wq, wk = _randn(d, dtype=dtype), _randn(d, dtype=dtype)
    grads = [_randn(b, h, s, d, dtype=dtype).transpose(1, 2) for h in (hq, hkv)]
    results, refs = run_and_reference(qk_norm, qk_norm_eager, [q, k, wq, wk], grads)
    assert_all_close(results, refs, NAMES, TOL[dtype])


def test_module_impls_agree():
    eager, triton_ = (
        QKNorm(64, impl="eager", device=DEVICE),
        QKNorm(64, impl="triton", device=DEVICE),
    )
    with torch.no_grad():
        for p_e, p_t in zip(eager.parameters(), triton_.parameters(), strict=True):
            p_t.copy_(p_e.normal_())
    q, k = _randn(2, 5, 4, 64, dtype=torch.float32), _randn(2, 5, 2, 64, dtype=torch.float32)
    for t, e in zip(triton_(q, k), eager(q, k), strict=True):
        assert rel_err(t, e) <= TOL[torch.float32]
    with pytest.raises(ValueError):
        QKNorm(8, impl="cuda")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_heads_where_eps_matters_match_fp64(dtype):
    """Heads of q and of k with tiny and zero mean square, where eps sets the norm (a kernel
    without it gives NaN or 1/rms)."""
    q = randn_rows_at_eps_scales((1, 7, 6, 100), dtype)
    k = randn_rows_at_eps_scales((1, 7, 3, 100), dtype)
    wq, wk = _randn(100, dtype=dtype), _randn(100, dtype=dtype)
    results, refs = run_and_reference(qk_norm, qk_norm_eager, [q, k, wq, wk])
    assert_all_close(results, refs, NAMES, TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_large_eps_matches_fp64(dtype):
    eps = 0.1  # 10% of N(0, 1)'s mean square: its rstd differs by 5% from one without eps
    results, refs = run_and_reference(
        lambda q, k, wq, wk: qk_norm(q, k, wq, wk, eps),
        lambda q, k, wq, wk: qk_norm_eager(q, k, wq, wk, eps),
        _inputs(1, 7, 6, 3, 100, dtype),
    )
    assert_all_close(results, refs, NAMES, TOL[dtype])


@pytest.mark.parametrize(
    "mutate", ["flip_sign_dk", "scale_dwq", "nan_in_k_out", "eps", "short_grid"]
)
def test_wrong_kernel_is_caught(mutate, monkeypatch):
    tol = TOL[torch.float32]
    fn = qk_norm
    if mutate == "eps":
        fn = lambda q, k, wq, wk: qk_norm(q, k, wq, wk, eps=1e-2)
    # floor instead of ceil for the k part of the grid: last k rows unwritten
    if mutate == "short_grid":
        floor_cdiv = types.SimpleNamespace(
            cdiv=lambda a, b: a // b, next_power_of_2=triton.next_power_of_2
        )
        monkeypatch.setattr(qknorm_mod, "triton", floor_cdiv)
    results, refs = run_and_reference(fn, qk_norm_eager, _inputs(1, 7, 6, 3, 100, torch.float32))
    if mutate == "flip_sign_dk":
        results[3] = -results[3]
    if mutate == "scale_dwq":
        results[4] = results[4] * (1 + 3 * tol)
    if mutate == "nan_in_k_out":
        results[1][0, 3, 1, 7] = float("nan")
    if mutate == "short_grid":
        assert results[1][0, -1].isnan().any()  # the poisoned buffer shows the unwritten rows
    with pytest.raises(AssertionError):
        assert_all_close(results, refs, NAMES, tol)


@pytest.mark.gpu
@requires_cuda
def test_real_shape_gpu():
    results, refs = run_and_reference(
        qk_norm, qk_norm_eager, _inputs(2, 2048, 32, 8, 128, torch.bfloat16)
    )
    assert_all_close(results, refs, NAMES, TOL[torch.bfloat16])
