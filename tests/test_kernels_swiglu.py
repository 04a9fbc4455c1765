"""SwiGLU Triton kernels vs the float64 eager reference: output, da and db; the packed form (one
gate/up tensor in, its gradient out in one piece) likewise."""

import types

import pytest
import torch
import triton
from autograd_numerics import assert_all_close, run_and_reference, seed_and_poison
from kernel_numerics import DEVICE, requires_cuda

import kernels.swiglu as swiglu_mod
from kernels.swiglu import swiglu, swiglu_eager, swiglu_packed, swiglu_packed_eager

# Relative-error bound (vs float64) for the output and every gradient, per input dtype. Triton's CPU
# interpreter rounds fp32 -> bf16 toward zero, so bf16 errors there are about twice the GPU's.
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
DTYPES = list(TOL)
NAMES = ["c", "da", "db"]


@pytest.fixture(autouse=True)
def _seeded_and_poisoned(request, monkeypatch):
    seed_and_poison(request, monkeypatch, swiglu_mod)


def _inputs(shape, dtype):
    return [torch.randn(shape, device=DEVICE).to(dtype) for _ in range(2)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 100), (37, 257), (2, 5, 300), (13, 768)], ids=str)
def test_matches_fp64(shape, dtype):
    results, refs = run_and_reference(swiglu, swiglu_eager, _inputs(shape, dtype))
    assert results[0].dtype == dtype
    assert_all_close(results, refs, NAMES, TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_halves_of_fused_projection(dtype):
    """a, b as the two (non-contiguous) halves of one gate_up projection, with a transposed grad."""
    a, b = torch.randn(29, 2 * 150, device=DEVICE).to(dtype).chunk(2, dim=-1)
    dc = torch.randn(150, 29, device=DEVICE).to(dtype).t()
    results, refs = run_and_reference(swiglu, swiglu_eager, [a, b], [dc])
    assert_all_close(results, refs, NAMES, TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 200), (37, 514), (2, 5, 1200)], ids=str)
def test_packed_matches_fp64(shape, dtype):
    """gu = [a, b] in one tensor: c and d gu (one contiguous tensor, gu's shape), with a transposed
    grad."""
    gu = torch.randn(shape, device=DEVICE).to(dtype)
    dc = torch.randn(shape[-1] // 2, *shape[:-1], device=DEVICE).to(dtype).movedim(0, -1)
    results, refs = run_and_reference(swiglu_packed, swiglu_packed_eager, [gu], [dc])
    assert results[0].shape == (*shape[:-1], shape[-1] // 2) and results[1].is_contiguous()
    assert_all_close(results, refs, ["c", "dgu"], TOL[dtype])


def test_mismatched_inputs_raise():
    a = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError):
        swiglu(a, a[:, :4])
    with pytest.raises(ValueError):
        swiglu(a, a.half())
    with pytest.raises(ValueError):
        swiglu_packed(torch.randn(4, 7, device=DEVICE))


@pytest.mark.parametrize("mutate", ["flip_sign_da", "scale_db", "nan_in_c", "short_grid"])
def test_wrong_kernel_is_caught(mutate, monkeypatch):
    tol = TOL[torch.float32]
    if mutate == "short_grid":  # floor instead of ceil for the grid: the tail is never written
        monkeypatch.setattr(
            swiglu_mod,
            "triton",
            types.SimpleNamespace(cdiv=lambda a, b: a // b, next_power_of_2=triton.next_power_of_2),
        )
    results, refs = run_and_reference(swiglu, swiglu_eager, _inputs((37, 257), torch.float32))
    if mutate == "flip_sign_da":
        results[1] = -results[1]
    if mutate == "scale_db":
        results[2] = results[2] * (1 + 3 * tol)
    if mutate == "nan_in_c":
        results[0][5, 7] = float("nan")
    if mutate == "short_grid":
        assert results[0][-1].isnan().all()  # the poisoned buffer shows the unwritten tail
    with pytest.raises(AssertionError):
        assert_all_close(results, refs, NAMES, tol)


@pytest.mark.gpu
@requires_cuda
def test_real_shape_gpu():
    results, refs = run_and_reference(swiglu, swiglu_eager, _inputs((8192, 5632), torch.bfloat16))
    assert_all_close(results, refs, NAMES, TOL[torch.bfloat16])


@pytest.mark.gpu
@requires_cuda
def test_packed_real_shape_gpu():
    results, refs = run_and_reference(
        swiglu_packed,
        swiglu_packed_eager,
        [torch.randn(8192, 2 * 5632, device=DEVICE).to(torch.bfloat16)],
    )
    assert_all_close(results, refs, ["c", "dgu"], TOL[torch.bfloat16])
