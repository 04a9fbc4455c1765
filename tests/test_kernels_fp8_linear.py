"""kernels.fp8_linear: the Triton cast bit for bit against torch's (in Triton's interpreter, on
values FP8 holds exactly), the layer bit for bit against torchao's Float8Linear (the same GEMMs, run
on a CPU), each comparison shown to catch a planted bug, and the step's wiring; on a GPU, the same
on random values."""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch
from kernel_numerics import DEVICE

import kernels.fp8_linear as fp8_mod
from kernels.fp8_linear import FP8Linear, cast_both_eager, cast_both_triton, fp8_linear
from kernels.numerics import bit_mismatches
from models.config import CONFIGS
from models.step import (
    BASELINE,
    FP8_CHECK_TOLERANCE,
    FP8_MIN_CC,
    TrainStep,
    UnsupportedOptions,
    baseline_of,
    build_step,
    check_against,
    validate,
    variant_options,
)

FORMATS = ["e4m3", "e5m2"]


def exact_input(m: int, n: int, fmt: str) -> torch.Tensor:
    """bf16 values the format holds exactly, within a quarter of its largest, but for the last
    element, at half its largest: amax max / 2, scale exactly 2, every product exact. (The
    interpreter rounds to FP8 without the carry into the exponent; exact products need no
    rounding.) A cast that skips the scale, divides by it, or takes an amax that misses the last
    element (scale 4) writes other bits."""
    dtype = fp8_mod.FORMATS[fmt]
    top = torch.finfo(dtype).max / 2
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (m, n), generator=gen, dtype=torch.uint8)
    x = codes.view(dtype).float().nan_to_num(0.0, 0.0, 0.0).clamp(-top / 2, top / 2)
    x[-1, -1] = top
    return x.to(torch.bfloat16)


# --- the cast
# -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(200, 136), (64, 128), (16, 16)], ids=str)
def test_the_triton_cast_writes_torchs_bits_in_both_layouts(shape, fmt, dtype):
    """(200, 136) is no multiple of the tile: the masks. 16-bit inputs: an fp32 one takes torch's
    cast (fp8_cast_both)."""
    x = exact_input(*shape, fmt).to(DEVICE, dtype)
    got, ref = cast_both_triton(x, fmt), cast_both_eager(x, fmt)
    assert [t.dtype for t in got] == [fp8_mod.FORMATS[fmt]] * 2 + [torch.float32]
    assert got[1].shape == shape[::-1] and got[1].is_contiguous()
    assert float(ref[2]) == 0.5  # the inverse of scale 2
    assert bit_mismatches(got, ref) == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_all_zero_tensor_takes_the_amax_floor(fmt):
    """amax 0: the scale is max / AMAX_FLOOR, finite, as torchao's (its inverse the same bits)."""
    x = torch.zeros(64, 128, device=DEVICE, dtype=torch.bfloat16)
    got, ref = cast_both_triton(x, fmt), cast_both_eager(x, fmt)
    assert float(ref[2]) > 0 and bit_mismatches(got, ref) == 0


def test_the_triton_cast_refuses_what_it_would_read_wrong():
    x = torch.zeros(64, 128, device=DEVICE, dtype=torch.bfloat16)
    for bad in (x.t(), x[:0], x.view(2, 32, 128)):
        with pytest.raises(ValueError, match="contiguous, non-empty 2-D"):
            cast_both_triton(bad, "e4m3")


def _planted_casts(x: torch.Tensor, fmt: str) -> dict[str, tuple[torch.Tensor, ...]]:
    """Wrong casts of x, each a bug a cast kernel could have."""
    dtype, (y, yt, inv) = fp8_mod.FORMATS[fmt], cast_both_eager(x, fmt)
    m, n, top = *x.shape, torch.finfo(dtype).max
    short = cast_both_eager(x.flatten()[:-1].view(1, -1), fmt)[2]  # amax without the last element
    return {
        "no scale": (x.float().to(dtype), x.float().to(dtype).t().contiguous(), inv),
        "divides by the scale": (
            (x.float() * inv).to(dtype),
            (x.float() * inv).to(dtype).t().contiguous(),
            inv,
        ),
        "amax misses the tail": (
            (x.float() / short).clamp(-top, top).to(dtype),
            (x.float() / short).clamp(-top, top).to(dtype).t().contiguous(),
            short,
        ),
        "second layout not transposed": (y, y.reshape(n, m), inv),
        "scale, not its inverse": (y, yt, 1 / inv),
    }


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_casts_check_catches_planted_bugs(fmt):
    x = exact_input(200, 136, fmt)
    ref = cast_both_eager(x, fmt)
    for bug, got in _planted_casts(x, fmt).items():
        assert bit_mismatches(got, ref) > 0, bug


def test_the_op_runs_torchs_cast_on_a_cpu():
    """The interpreter's FP8 rounding is wrong for values FP8 does not hold (module docstring):
    on a CPU the op is torch's cast, which the GPU test holds the kernels to."""
    x = torch.randn(48, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    got = torch.ops.optbench.fp8_cast_both(x, "e4m3")
    assert bit_mismatches(got, cast_both_eager(x, "e4m3")) == 0


# --- the layer against torchao's
# -----------------------------------------------------------------------------------------


def _torchao_and_ours(
    weight_dtype: torch.dtype, fast_accum: bool, device: str = "cpu", shape=(2, 24, 64, 48)
) -> dict[str, torch.Tensor]:
    """Output, input gradient and weight gradient of torchao's tensorwise Float8Linear and of ours,
    from one seeded Linear layer (in -> out features) and input (batch, tokens, in), side by
    side."""
    float8 = pytest.importorskip("torchao.float8", reason="torchao is not installed")
    torch.manual_seed(0)
    b, t, k, n = shape
    layer = torch.nn.Linear(k, n, bias=False, device=device).to(weight_dtype)
    config = float8.Float8LinearConfig()
    if fast_accum:
        fast = float8.config.Float8GemmConfig(use_fast_accum=True)
        config = dataclasses.replace(
            config, gemm_config_grad_input=fast, gemm_config_grad_weight=fast
        )
    theirs = torch.nn.Sequential(copy.deepcopy(layer))
    float8.convert_to_float8_training(theirs, config=config)
    x = torch.randn(b, t, k, device=device).to(torch.bfloat16)
    grad = torch.randn(b, t, n, device=device).to(torch.bfloat16)
    out = {}
    for who, fn, w in (
        ("theirs", theirs, theirs[0].weight),
        ("ours", lambda x: fp8_linear(x, layer.weight, fast_accum), layer.weight),
    ):
        xi = x.clone().requires_grad_()
        y = fn(xi)
        y.backward(grad)
        out |= {f"{who} y": y, f"{who} dx": xi.grad, f"{who} dw": w.grad}
    return out


def _assert_same_bits(out: dict[str, torch.Tensor]) -> None:
    for name in ("y", "dx", "dw"):
        ours, theirs = out[f"ours {name}"], out[f"theirs {name}"]
        assert ours.dtype == theirs.dtype and bit_mismatches((ours,), (theirs,)) == 0, name


@pytest.mark.parametrize("fast_accum", [False, True])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_the_layer_is_torchaos_tensorwise_recipe_bit_for_bit(weight_dtype, fast_accum):
    """On a CPU, whose _scaled_mm ignores fast accumulation: the layouts, scales and formats (the
    GPU test below holds fast_accum to torchao's)."""
    out = _torchao_and_ours(weight_dtype, fast_accum)
    _assert_same_bits(out)


@pytest.mark.parametrize(
    "bug",
    [
        ("FORMATS", {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e4m3fn}),  # e4m3 gradients
        # a floor over every amax here (the input's ~4): no tensor takes its own scale
        ("AMAX_FLOOR", 10.0),
    ],
    ids=["gradient-format", "amax-floor"],
)
def test_the_layer_comparison_catches_planted_bugs(bug, monkeypatch):
    monkeypatch.setattr(fp8_mod, *bug)
    out = _torchao_and_ours(torch.bfloat16, False)
    assert any(
        bit_mismatches((out[f"ours {n}"],), (out[f"theirs {n}"],)) for n in ("y", "dx", "dw")
    )


# --- in the step
# -----------------------------------------------------------------------------------------

SMALL = dict(batch_size=2, seq_len=32)


def test_our_fp8_layers_replace_the_blocks_linear_layers_fused_ones_too():
    _, options = variant_options("best-kernels-fp8-triton", BASELINE.replace(**SMALL))
    options = options.replace(cuda_graph=False, compile=None)
    step = TrainStep(CONFIGS["tiny"], options, "cpu", 0)
    layers = {n: m for n, m in step.model.named_modules() if isinstance(m, FP8Linear)}
    assert {n.split(".", 2)[2] for n in layers} == {
        "attn.qkv_proj",
        "attn.o_proj",
        "mlp.gate_up_proj",
        "mlp.down_proj",
    }
    assert all(m.fast_accum for m in layers.values())
    assert step.model.blocks[0].attn.qkv_proj.parts == {"q_proj": 64, "k_proj": 32, "v_proj": 32}
    assert type(step.model.lm_head) is torch.nn.Linear


@pytest.mark.skipif(DEVICE == "cuda", reason="a CPU's step (on a GPU: test_fp8's step checks)")
def test_the_step_with_our_fp8_layers_passes_the_loose_check():
    """best-kernels-fp8-triton's model on a CPU (our SwiGLU, RoPE and RMSNorm in the interpreter,
    the FP8 GEMMs on the CPU; no compile, no CUDA graph) against the fp32 reference: FP8's error,
    within FP8_CHECK_TOLERANCE."""
    base = BASELINE.replace(**SMALL)
    _, options = variant_options("best-kernels-fp8-triton", base)
    build = functools.partial(build_step, CONFIGS["tiny"], device="cpu")
    baseline = baseline_of(build, base, "bf16")
    result = check_against(
        baseline,
        TrainStep(CONFIGS["tiny"], options.replace(cuda_graph=False, compile=None), "cpu", 0),
    )
    assert result.ok and result.numerics == "fp8", result
    assert 0.03 < result.errors["grads"] < FP8_CHECK_TOLERANCE / 3, result.errors


def test_our_fp8_layers_need_the_tensorwise_recipe():
    with pytest.raises(UnsupportedOptions, match="fp8_linear='triton'"):
        validate(BASELINE.replace(fp8="rowwise", fp8_linear="triton"), "cpu")


# --- on a GPU
# -----------------------------------------------------------------------------------------


HAS_FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= FP8_MIN_CC
requires_fp8_gpu = pytest.mark.skipif(not HAS_FP8_GPU, reason="needs FP8 tensor cores (sm89+)")


@requires_fp8_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(8192, 2048), (1000, 2064)], ids=str)
def test_the_cast_op_writes_torchs_bits_on_a_gpu(shape, fmt, dtype):
    """The op: the Triton kernels for 16-bit inputs; for an fp32 one (a weight the optimizer keeps
    in fp32) torch's cast, so there this checks only that the op takes that path."""
    gen = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    got = torch.ops.optbench.fp8_cast_both(x, fmt)
    assert bit_mismatches(got, cast_both_eager(x, fmt)) == 0


@requires_fp8_gpu
@pytest.mark.parametrize("fast_accum", [False, True])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_the_layer_is_torchaos_tensorwise_recipe_bit_for_bit_on_a_gpu(weight_dtype, fast_accum):
    """cuBLAS's FP8 GEMMs, with the Triton casts: the same bits as torchao's eager layer."""
    out = _torchao_and_ours(weight_dtype, fast_accum, "cuda", (2, 512, 2048, 2560))
    _assert_same_bits(out)


@requires_fp8_gpu
def test_under_autocast_the_layer_is_torchaos_bit_for_bit_on_a_gpu():
    """fp32 input and weight under bf16 autocast (an eager FP8 step's): both layers take the input
    in autocast's dtype and cast the fp32 weight as it is."""
    float8 = pytest.importorskip("torchao.float8", reason="torchao is not installed")
    torch.manual_seed(0)
    layer = torch.nn.Linear(2048, 2560, bias=False, device="cuda")
    theirs = torch.nn.Sequential(copy.deepcopy(layer))
    float8.convert_to_float8_training(theirs, config=float8.Float8LinearConfig())
    x = torch.randn(2, 512, 2048, device="cuda")
    grad = torch.randn(2, 512, 2560, device="cuda").to(torch.bfloat16)
    out = {}
    for who, fn, w in (
        ("theirs", theirs, theirs[0].weight),
        ("ours", lambda x: fp8_linear(x, layer.weight), layer.weight),
    ):
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", torch.bfloat16):
            y = fn(xi)
        y.backward(grad)
        out |= {f"{who} y": y, f"{who} dx": xi.grad, f"{who} dw": w.grad}
    _assert_same_bits(out)
