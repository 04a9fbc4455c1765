"""Each kernel class's floor (``optbench.profiling.floors``): the counts against ones written out by
hand for the tiny model, where the LM head's GEMMs go, and the report's table of them."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

from models.config import CONFIGS
from models.model import Decoder
from models.step import BASELINE
from optbench.measure.roofline import Ceilings
from optbench.profiling.floors import class_floors
from optbench.profiling.kernel_classes import KERNEL_CLASSES
from optbench.profiling.report import floor_rows

CFG = CONFIGS["tiny"]  # d 64, 2 layers, 4 q heads and 2 kv heads of 16, MLP 176, vocabulary 1000
CEILINGS = Ceilings({"bf16": 100.0}, 1000.0, "test")  # 100 TFLOP/s, 1000 GB/s


def tiny_step(**options: object) -> NS:
    """What the floors read of a step: its config, options, tokens and model (on meta: no data)."""
    o = BASELINE.replace(batch_size=2, seq_len=32, **options)
    with torch.device("meta"):
        model = Decoder(CFG)
    return NS(
        config=CFG,
        options=o,
        tokens_per_step=64,
        model=model,
        params=list(model.parameters()),
    )


def floors(**options: object) -> dict:
    return class_floors(tiny_step(**options), dict.fromkeys(KERNEL_CLASSES, 1.0), CEILINGS, None)


def by_class(**options: object) -> dict:
    return {c["class"]: c for c in floors(**options)["classes"]}


def test_counts_written_out_by_hand() -> None:
    t, d, layers, v, f = 64, 64, 2, 1000, 176
    n = sum(p.numel() for p in tiny_step().params)
    c = by_class(norm="triton", grad_stats="foreach", optimizer="master")
    # q, o: d x d; k, v: d x (2 x 16); gate, up, down: d x f; the LM head d x v; 3 GEMMs of
    # 2 t in out FLOPs each
    linear = layers * (2 * d * d + 2 * d * 32 + 3 * d * f) + d * v
    assert c["gemm"]["flops"] == 6 * t * linear
    assert c["attention"]["flops"] == 6 * t * 32 * 4 * 16 * layers
    # 2 per block add the residual (fp32 x, h, dh, dx; bf16 y, out, dout, dy), the first does not
    assert c["norm"]["bytes"] == 2 * layers * (20 + 4 * 2) * t * d + 5 * t * d * 2
    # SwiGLU: a, b read, y written; da, db written, dy, a, b read. RoPE: q, k each way, v moved
    rope = 2 * (t * (4 + 2) * 16 + t * (4 + 2 * 2) * 16) * 2
    assert c["elementwise"]["bytes"] == layers * (8 * t * f * 2 + rope)
    assert c["cross_entropy"]["bytes"] == 2 * t * v * 2
    # AdamW's 28 bytes a parameter and one read of the (fp32 here) gradients for their norm
    assert c["optimizer"]["bytes"] == 28 * n + 4 * n
    assert c["fp8_cast"]["bytes"] == 0.0 and c["other"]["floor_ms"] is None
    # floor: compute at 100 TFLOP/s, bytes at 1000 GB/s
    assert c["gemm"]["floor_ms"] == pytest.approx(6 * t * linear / 100e12 * 1e3)
    assert c["optimizer"]["floor_ms"] == pytest.approx(32 * n / 1000e9 * 1e3)


def test_a_fused_loss_keeps_its_lm_head_in_gemm_and_moves_no_logits() -> None:
    """A fused (or liger) loss runs the LM head's GEMMs as aten::mm in its chunks, which the kernel
    classes count as gemm: its FLOPs stay there; the whole logits never reach memory, so the
    cross-entropy class's floor is 0."""
    plain, fused = by_class(), by_class(loss="fused")
    assert fused["gemm"]["flops"] == plain["gemm"]["flops"]
    assert plain["cross_entropy"]["bytes"] == 2 * 64 * 1000 * 2
    assert fused["cross_entropy"]["bytes"] == 0.0 and fused["cross_entropy"]["floor_ms"] == 0.0


def test_norms_without_the_fused_residual_and_clipping_apart() -> None:
    t, d = 64, 64
    c = by_class(norm="eager", grad_stats="loop", optimizer="fused")
    assert c["norm"]["bytes"] == 5 * 5 * t * d * 2  # 2 x 2 layers + 1, RMSNORM's 5 t d s each
    n = sum(p.numel() for p in tiny_step().params)
    # the gradient norm's read, the clip's read and write, the parameter norm's read
    assert c["optimizer"]["bytes"] == 28 * n + 3 * 4 * n + 4 * n


def test_the_report_table_reads_each_class_against_its_floor() -> None:
    f = floors()
    rows = {r[0]: r for r in floor_rows(f)}
    assert set(rows) == {*KERNEL_CLASSES, "with a floor"}
    assert rows["other"][2:] == ["—", "—", "—"]
    assert rows["fp8_cast"][2] == "0"  # no FP8 layers: nothing to cast
    assert [r[0] for r in floor_rows(f)][:-1] == list(KERNEL_CLASSES)
    gemm = by_class()["gemm"]
    assert rows["gemm"][4] == f"{1.0 / gemm['floor_ms']:,.4g}"
    # every class at 1 ms; communication and other have no floor
    assert f["floored_ms"] == 8.0


def test_fp8_casts_count_each_layers_input_output_gradient_and_weight() -> None:
    """6 bytes an element (two bf16 reads, two float8 layouts) of each Float8Linear layer's input,
    output gradient and weight; the layers' GEMMs go to gemm_fp8, the LM head's stay bf16."""
    from optbench.profiling.kernel_classes import is_float8_linear

    step = tiny_step()
    for name, module in list(step.model.named_modules()):
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            module.__class__ = type("Float8Linear", (torch.nn.Linear,), {})
    layers = [m for m in step.model.modules() if is_float8_linear(m)]
    assert len(layers) == 2 * 7  # q, k, v, o, gate, up, down in each of 2 blocks
    c = {
        row["class"]: row
        for row in class_floors(step, dict.fromkeys(KERNEL_CLASSES, 1.0), CEILINGS, 200.0)[
            "classes"
        ]
    }
    t = 64
    elements = sum(t * m.in_features + t * m.out_features + m.weight.numel() for m in layers)
    assert c["fp8_cast"]["bytes"] == 6 * elements
    assert c["gemm"]["flops"] == 6 * t * 64 * 1000  # the LM head alone
    assert c["gemm_fp8"]["floor_ms"] == pytest.approx(c["gemm_fp8"]["flops"] / 200e12 * 1e3)
