"""RoPE of a packed q/k/v projection in Triton vs the float64 eager reference: q, k, v and d qkv."""

import types

import pytest
import torch
import triton
from autograd_numerics import assert_all_close, run_and_reference, seed_and_poison
from kernel_numerics import DEVICE, requires_cuda

import kernels.rope as rope_mod
from kernels.rope import qkv_rope, qkv_rope_eager, rope_tables

# Relative-error bound (vs float64) for the outputs and the gradient, per dtype (rounding of the
# stored result only; the interpreter's bf16 rounds toward zero, about twice the GPU's error).
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
NAMES = ["q", "k", "v", "dqkv"]


@pytest.fixture(autouse=True)
def _seeded_and_poisoned(request, monkeypatch):
    seed_and_poison(request, monkeypatch, rope_mod)


def _tables(max_seq: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (max_seq, 1, dim) as the model builds them (theta 10000), on the test device."""
    return tuple(t.to(DEVICE) for t in rope_tables(max_seq, dim))


def _run(b, s, hq, hkv, d, dtype, transposed_grads=False):
    cos, sin = _tables(s + 5, d)  # longer tables than the sequence, as the model's
    qkv = torch.randn(b, s, hq + 2 * hkv, d, device=DEVICE).to(dtype)
    grads = None
    if transposed_grads:  # as SDPA's backward hands them over: (B, H, S, D) storage
        grads = [
            torch.randn(b, h, s, d, device=DEVICE).to(dtype).transpose(1, 2) for h in (hq, hkv, hkv)
        ]
    return run_and_reference(
        lambda x: qkv_rope(x, cos, sin, hq, hkv),
        lambda x: qkv_rope_eager(x, cos[:s].double(), sin[:s].double(), hq, hkv),
        [qkv],
        grads,
    )


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize(
    "bshkd", [(1, 3, 4, 2, 16), (2, 37, 3, 1, 64), (1, 7, 6, 2, 24), (2, 5, 2, 2, 100)], ids=str
)
def test_matches_fp64(bshkd, dtype):
    results, refs = _run(*bshkd, dtype)
    assert all(r.dtype == dtype and r.is_contiguous() for r in results)
    assert_all_close(results, refs, NAMES, TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_transposed_grads(dtype):
    results, refs = _run(2, 9, 4, 2, 64, dtype, transposed_grads=True)
    assert_all_close(results, refs, NAMES, TOL[dtype])


def test_bad_shapes_raise():
    cos, sin = _tables(8, 16)
    with pytest.raises(ValueError):
        qkv_rope(torch.randn(1, 8, 7, 16, device=DEVICE), cos, sin, 4, 2)  # 7 heads, not 4 + 2 x 2


@pytest.mark.parametrize(
    "mutate", ["shifted_positions", "swap_k_v", "flip_sign_dqkv", "short_grid"]
)
def test_wrong_kernel_is_caught(mutate, monkeypatch):
    # floor instead of ceil for the token blocks: the tail is never written
    if mutate == "short_grid":
        monkeypatch.setattr(
            rope_mod,
            "triton",
            types.SimpleNamespace(cdiv=lambda a, b: a // b, next_power_of_2=triton.next_power_of_2),
        )
    results, refs = _run(2, 37, 3, 1, 64, torch.float32)
    if mutate == "shifted_positions":  # q of each position handed to the next one
        results[0] = results[0].roll(1, dims=1)
    if mutate == "flip_sign_dqkv":
        results[3] = -results[3]
    if mutate == "swap_k_v":
        results[1], results[2] = results[2], results[1]
    if mutate == "short_grid":
        assert results[0][-1, -1].isnan().all()  # the poisoned buffer shows the unwritten tail
    with pytest.raises(AssertionError):
        assert_all_close(results, refs, NAMES, TOL[torch.float32])


@pytest.mark.gpu
@requires_cuda
def test_real_shape_gpu():
    """The 1B config's attention: 32 q heads, 4 kv heads of 64, B=8, S=1024."""
    results, refs = _run(8, 1024, 32, 4, 64, torch.bfloat16, transposed_grads=True)
    assert_all_close(results, refs, NAMES, TOL[torch.bfloat16])
