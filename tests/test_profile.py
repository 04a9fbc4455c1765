"""``optbench profile`` on the CPU with the tiny model: the report's structure and files, planted
smells found (one ``loss.item()`` sync, a Python loop over parameters), and ``--diff`` listing the
sync."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from pathlib import Path

import pytest
import torch

from optbench.profiling import breakdown, diff, profile, report, timeline
from optbench.profiling.kernel_classes import (
    KERNEL_CLASSES,
    KERNEL_RULES,
    class_notes,
    class_split,
    kernel_class,
    kernel_class_figures,
    kernel_rule,
    linear_gemm_flops,
    matmul_figures,
)

PNG = b"\x89PNG\r\n\x1a\n"
RUN = ["--size", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "1"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Report folders of the tiny CPU baseline (item sync, loop grad stats) and of one switch
    each."""
    root = tmp_path_factory.mktemp("profiles")
    cases = {
        "base": [],
        "no_sync": ["--options", "item_sync=false"],
        "foreach": ["--options", "grad_stats=foreach"],
    }
    for name, extra in cases.items():
        assert profile.main([*RUN, *extra, "--out", str(root / name)]) == 0
    return {name: root / name for name in cases}


def load(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def numbers(obj: object) -> list[float]:
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in numbers(v)]
    return [obj] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def test_report_structure_and_files(reports: dict[str, Path]) -> None:
    folder = reports["base"]
    r = load(folder)
    assert {"meta", "notes", "time", "launches", "smells", "memory", "ops", "files"} <= r.keys()
    assert set(r["time"]["host_ms"]) == set(timeline.PHASES)
    assert {"wall_ms", "gpu_busy_fraction", "tokens_per_s", "mfu"} <= r["time"].keys()
    # CPU: null, with a note that says why
    assert r["time"]["gpu_busy_fraction"] is None and r["notes"]
    assert {"copy_calls", "host_syncs", "small_kernels", "loops"} <= r["smells"].keys()
    assert {
        "weights_bytes",
        "gradients_bytes",
        "optimizer_state_bytes",
        "activations_bytes",
        "logits_bytes_estimate",
        "peak_backward_bytes",
        "after_step_bytes",
    } <= r["memory"].keys()
    assert all(math.isfinite(x) for x in numbers(r))
    # the phases split each profiled step's host time, exactly; the wall time adds the gaps between
    # steps (how long those are is up to the CPU's other work)
    trace = json.loads(gzip.decompress((folder / "trace.json.gz").read_bytes()))["traceEvents"]
    steps = [e["dur"] / 1e3 for e in trace if str(e.get("name", "")).startswith("ProfilerStep")]
    host = sum(r["time"]["host_ms"].values())
    assert math.isclose(host, sum(steps) / len(steps), rel_tol=1e-6)
    assert host <= r["time"]["wall_ms"]
    assert r["memory"]["activations_bytes"] > 0 and r["memory"]["peak_backward_bytes"] > 0
    assert 0 < len(r["ops"]["top_host"]) <= breakdown.TOP and r["launches"]["per_step"] > 0

    for name in (
        "report.json",
        "report.md",
        "report.html",
        "trace.json.gz",
        "time_split.png",
        "memory_timeline.png",
    ):
        assert (folder / name).stat().st_size > 0, name
        assert name in r["files"]
    for name in ("time_split.png", "memory_timeline.png"):
        assert (folder / name).read_bytes().startswith(PNG)
    assert json.loads(gzip.decompress((folder / "trace.json.gz").read_bytes()))["traceEvents"]
    assert "time_split.png" in (folder / "report.md").read_text()
    assert '<img src="memory_timeline.png"' in (folder / "report.html").read_text()
    # no staging left
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []


def test_master_adamw_is_profiled_as_the_optimizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our MasterAdamW: its time in the optimizer phase, its masters and moments in the optimizer's
    memory."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    options = ["--options", "precision=bf16", "optimizer=master", "grad_stats=foreach"]
    assert profile.main([*RUN, *options, "--out", str(tmp_path / "master")]) == 0
    r = load(tmp_path / "master")
    assert r["time"]["host_ms"]["optimizer"] > r["time"]["host_ms"]["other"]
    memory = r["memory"]
    # fp32 masters of bf16 weights + moments
    assert memory["optimizer_state_bytes"] > 2 * memory["weights_bytes"]


def test_item_sync_is_one_more_host_sync(reports: dict[str, Path]) -> None:
    base, no_sync = load(reports["base"])["smells"], load(reports["no_sync"])["smells"]
    assert base["host_syncs"] == no_sync["host_syncs"] + 1
    assert base["host_syncs_by_phase"]["other"] == no_sync["host_syncs_by_phase"]["other"] + 1


def test_loop_grad_stats_launch_more_ops(reports: dict[str, Path]) -> None:
    base, foreach = load(reports["base"]), load(reports["foreach"])
    assert base["launches"]["per_step"] > foreach["launches"]["per_step"]
    loops, fused = base["smells"]["loops"], foreach["smells"]["loops"]
    assert loops["norm_ops"]["aten::sum"] > fused["norm_ops"]["aten::sum"] + loops["param_tensors"]
    assert fused["norm_ops"]["aten::_foreach_norm"] > loops["norm_ops"]["aten::_foreach_norm"] == 0


def test_diff_lists_the_sync(reports: dict[str, Path]) -> None:
    assert (
        profile.main(["--diff", str(reports["base"]), str(reports["no_sync"] / "report.json")]) == 0
    )
    rows = {
        row[0]: row for row in diff.figure_rows(load(reports["base"]), load(reports["no_sync"]))
    }
    assert rows["smells.host_syncs"][3] == -1
    text = (reports["no_sync"] / "diff.md").read_text()
    assert any(
        line.startswith("| smells.host_syncs |") and "| -1 |" in line for line in text.splitlines()
    )


def test_staging_leaves_nothing_on_failure(tmp_path: Path) -> None:
    final = tmp_path / "report"
    with pytest.raises(RuntimeError), report.staging(final) as tmp:
        (tmp / "report.json").write_text("{}")
        raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []
    for text in ("old", "new"):
        with report.staging(final) as tmp:
            (tmp / "report.json").write_text(text)
    assert [p.name for p in tmp_path.iterdir()] == ["report"] and (
        final / "report.json"
    ).read_text() == "new"


def test_parse_options_types_values() -> None:
    assert profile.parse_options(
        ["item_sync=false", "batch_size=4", "compile=none", "loss=chunked"]
    ) == {"item_sync": False, "batch_size": 4, "compile": None, "loss": "chunked"}
    with pytest.raises(SystemExit):
        profile.parse_options(["no_such_switch=1"])


def test_cuda_call_names_are_classified() -> None:
    """Kineto's names of CUDA runtime and driver calls (the CUDA path cannot run here)."""
    launches = [
        "cudaLaunchKernel",
        "cudaLaunchKernelExC_v11060",
        "cuLaunchKernelEx",
        "cudaGraphLaunch_ptsz",
    ]
    syncs = ["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"]
    assert all(breakdown.LAUNCH_CALL.match(n) for n in launches)
    assert all(breakdown.SYNC_CALL.match(n) for n in syncs)
    assert not any(
        breakdown.SYNC_CALL.match(n) for n in ("cudaMemcpyAsync", "cudaStreamWaitEvent", *launches)
    )
    assert all(
        breakdown.DATA_CALL.match(n) for n in ("cudaMemcpyAsync", "cuMemcpyHtoDAsync_v2", *syncs)
    )
    assert not any(breakdown.DATA_CALL.match(n) for n in launches)


def test_command_buffer_full_is_not_device_time():
    """CUPTI's 'Command Buffer Full' spans (a launch waiting on the host side) attached to an
    operator are left out of the device split; the kernel beside them counts."""
    from types import SimpleNamespace as NS

    def span(name, start, us, kernels=()):
        return NS(
            name=name,
            time_range=NS(start=start, end=start + us, elapsed_us=lambda: us),
            duration=us,
            kernels=list(kernels),
            is_user_annotation=False,
        )

    kernel, stall = span("gemm", 10, 2000), span("Command Buffer Full", 5, 90000)
    line = timeline.Timeline([(0, 100)], [(0, 100, "optimizer")])
    parsed = timeline.Parsed(
        host=[span("aten::mm", 1, 3, [kernel, stall])], device=[kernel], line=line, curve=None
    )
    split = breakdown.device_split(parsed)
    assert split["optimizer"] == pytest.approx(2.0) and split["unattributed"] == 0.0


def test_a_gpu_steps_mfu_divides_by_the_profiles_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """time_figures on a CUDA step (CPU-tested with a recorded timeline): MFU = step FLOPs / wall s
    / the precision's peak of the detected profile (bf16 on an H100: 989.4 TFLOP/s by its
    datasheet)."""
    from types import SimpleNamespace as NS

    from optbench.measure import hardware
    from optbench.measure.roofline import Ceilings

    h100 = hardware.PROFILES["h100-sxm"]
    monkeypatch.setattr(hardware, "detect", lambda device=None: h100)
    monkeypatch.setattr(breakdown, "host_split", lambda p: {})
    monkeypatch.setattr(breakdown, "device_split", lambda p: {})
    kernel = NS(time_range=NS(start=0.0, end=10_000.0))
    # one 10 ms step, busy throughout
    parsed = NS(line=NS(ranges=[(0.0, 10_000.0)], n=1), device=[kernel])
    step = NS(
        device=NS(type="cuda"),
        options=NS(precision="bf16"),
        tokens_per_step=8192,
        flops_per_step=1e15,
    )
    figures = breakdown.time_figures(step, parsed)
    assert figures["wall_ms"] == pytest.approx(10.0) and figures[
        "gpu_busy_fraction"
    ] == pytest.approx(1.0)
    assert figures["mfu"] == pytest.approx(
        1e15 / 0.01 / (Ceilings.from_profile(h100).peak("bf16") * 1e12)
    )


# --- kernel classes
# -----------------------------------------------------------------------------------------

BF16_GEMMS = [
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off",
    "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>(...)",
    "triton_tem_fused_mm_0",
]
# The names of FP8 GEMMs, casts and amaxes below from nvjet_sm90_... on are real: an H100 profile of
# the 1B best-kernels-fp8-tensorwise step without its graph
# (results/h100-sxm/profiles/287e6c52c801-1B-...-nograph).
FP8_GEMMS = [
    "nvjet_sm90_qqtst_128x256_128x6_2x1_v_bz_coopB_TNT",
    "nvjet_sm90_qrtst_128x160_128x5_2x1_v_bz_coopA_algo2_TNT",
    "sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_segment_k_off",
    "void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x<"
    "cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int>, "
    "cutlass::gemm::collective::CollectiveMma<cutlass::float_e4m3_t>>>>",
    "void f8f8bf16_rowwise_kernel<cutlass::gemm::GemmShape<128, 128, 128>>(...)",
    "triton_tem_fused__scaled_mm_0",
]
ATTENTION = [
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x128x128_4x1x1_kernel0_0",
    "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(int, int, int, int, float const*, "
    "float*)",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, "
    "4>>(Flash_fwd_params)",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t>)",
]
FP8_CASTS = [
    "triton_red_fused_abs_amax_0",
    "triton_red_fused_abs_max_1",
    # inductor names a cast that feeds _scaled_mm after it: first read as 'other' (3.8 of 99 ms at
    # 1B)
    "triton_poi_fused__scaled_mm__to_copy_clamp_clone_mul_reciprocal_t_view_7",
    "triton_red_fused_abs_max_transpose_view_14",
    "triton_per_fused__to_copy_abs_clamp_max_mul_reciprocal_t_1",
    "triton_poi_fused__to_copy_clamp_div_expand_mul_reciprocal_t_1",
    "triton_red_fused__to_copy_abs_amax_clamp_div_exp2_floor_log2_mul_reciprocal_t_0",
    "void at::native::vectorized_elementwise_kernel<4, at::native::float8_copy_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda(float)#1}, at::detail::Array<char*, 2>>(int, ...)",
]
# our Triton kernels by their jit functions' names (kernels/), inductor's by their aten ops, torch's
NORMS = [
    "rms_fwd_rows",
    "rms_bwd_stripe",
    "_sum_partials_kernel",
    "_qk_norm_fwd_kernel",
    "_rms_norm_bwd_kernel",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_2",
    "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda(...)",
]
ELEMENTWISE = [
    "_swiglu_fwd_kernel",
    "_swiglu_bwd_kernel",
    "_qkv_rope_kernel",
    "triton_poi_fused_add_1",
    "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(...)",
]
CROSS_ENTROPY = [
    "_ce_fwd_kernel",
    "_scale_kernel",
    "triton_red_fused__log_softmax__to_copy_prepare_softmax_online_2",
    "liger_cross_entropy_kernel",
]
OPTIMIZER = [
    "_adamw_kernel",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
    "namespace)::TensorListMetadata<1>, at::native::(anonymous "
    "namespace)::LpNormFunctor<float, 2>>",
    "void at::native::lpnorm_cleanup<float, 2, float, float>(...)",
    "void at::native::(anonymous namespace)::multi_tensor_apply_for_fused_optimizer<4, "
    "FusedAdamMathFunctor<float, 4>>",
]
COMMUNICATION = ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"]
OTHER = [
    "Memset (Device)",
    "Memcpy DtoD (Device -> Device)",
    "some_kernel_nobody_knows_5f8a",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
    "at::native::MaxNanFunctor<float>>>",
]


@pytest.mark.parametrize(
    ("names", "kind"),
    [
        (BF16_GEMMS, "gemm"),
        (FP8_GEMMS, "gemm_fp8"),
        (ATTENTION, "attention"),
        (FP8_CASTS, "fp8_cast"),
        (NORMS, "norm"),
        (ELEMENTWISE, "elementwise"),
        (CROSS_ENTROPY, "cross_entropy"),
        (OPTIMIZER, "optimizer"),
        (COMMUNICATION, "communication"),
        (OTHER, "other"),
    ],
)
def test_kernel_names_are_classified(names: list[str], kind: str) -> None:
    """Kernels of no operator (a CUDA graph replay) by name; an FP8 GEMM is not a bf16 GEMM, nor the
    reverse."""
    assert [kernel_class(n) for n in names] == [kind] * len(names)


def test_every_class_has_a_rule_and_the_last_rule_takes_any_name() -> None:
    assert {kind for *_, kind in KERNEL_RULES} == set(KERNEL_CLASSES)
    assert KERNEL_RULES[-1] == ("kernel", "", "other")
    assert kernel_rule("") == len(KERNEL_RULES) - 1


def test_the_launching_operator_wins_over_the_name() -> None:
    bf16_name, fp8_name = BF16_GEMMS[0], FP8_GEMMS[0]
    assert (
        kernel_class(bf16_name, ("aten::_scaled_mm", "aten::mm", "matmul_with_hp_or_float8_args"))
        == "gemm_fp8"
    )
    assert kernel_class("some_kernel_nobody_knows", ("aten::addmm", "aten::linear")) == "gemm"
    # the op's evidence first, even against the name
    assert kernel_class(fp8_name, ("aten::mm",)) == "gemm"
    # SDPA's math fallback: its bmm kernels are attention (an enclosing attention op beats the
    # launching bmm)
    assert (
        kernel_class(bf16_name, ("aten::bmm", "aten::_scaled_dot_product_attention_math"))
        == "attention"
    )
    assert (
        kernel_class(
            "Memset (Device)", ("aten::zeros", "aten::_scaled_dot_product_cudnn_attention_backward")
        )
        == "attention"
    )


def test_eager_fp8_casts_are_classified_by_the_enclosing_torchao_function() -> None:
    """Eager torchao: generic ATen kernels inside its float8 autograd functions are casts; its
    Float8 tensor's aten::mm encloses the reciprocals of the scales (cast work) and the _scaled_mm
    (the FP8 GEMM)."""
    reduce, pointwise = (
        OTHER[-1],
        "void at::native::vectorized_elementwise_kernel<4, reciprocal_kernel_cuda>",
    )
    backward = (
        "matmul_with_hp_or_float8_argsBackward",
        "autograd::engine::evaluate_function: matmul_with_hp_or_float8_argsBackward",
    )
    assert kernel_class(reduce, ("aten::amax", "matmul_with_hp_or_float8_args")) == "fp8_cast"
    assert kernel_class(pointwise, ("aten::reciprocal", "aten::mm", *backward)) == "fp8_cast"
    assert (
        kernel_class(
            pointwise, ("aten::copy_", "aten::_to_copy", "aten::to", "_ToFloat8ConstrFunc")
        )
        == "fp8_cast"
    )
    assert kernel_class(BF16_GEMMS[0], ("aten::_scaled_mm", "aten::mm", *backward)) == "gemm_fp8"
    # no torchao around it
    assert kernel_class(reduce, ("aten::amax", "aten::logsumexp")) == "other"


def test_our_fp8_casts_are_fp8_cast_by_their_op_and_by_their_names() -> None:
    """kernels.fp8_linear: the kernels (and the amax's zero fill) inside its op, and its kernels by
    name where no op is recorded (a CUDA graph's replay); its layers' GEMMs are FP8 FLOPs."""
    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
    for name in ("_fp8_amax_kernel", "_fp8_cast_both_kernel", fill):
        assert kernel_class(name, ("aten::fill_", "optbench::fp8_cast_both")) == "fp8_cast"
    assert kernel_class("_fp8_cast_both_kernel") == kernel_class("_fp8_amax_kernel") == "fp8_cast"
    assert kernel_class(fill) != "fp8_cast"  # outside the op, a fill is no cast

    from kernels.fp8_linear import FP8Linear

    model = tiny_model()
    model[0].__class__ = FP8Linear
    flops = linear_gemm_flops(model, tokens=100)
    assert flops["fp8_layers"] == 1 and flops["fp8"] == 600 * 32 * 64


def fake_parsed(host: list, device: list, steps: int = 1) -> timeline.Parsed:
    line = timeline.Timeline(
        [(i * 1000.0, (i + 1) * 1000.0) for i in range(steps)],
        [(i * 1000.0, (i + 1) * 1000.0, "forward") for i in range(steps)],
    )
    return timeline.Parsed(host=host, device=device, line=line, curve=None)


def span(
    name: str,
    start: float,
    us: float,
    kernels: tuple = (),
    parent: object = None,
    annotation: bool = False,
):
    from types import SimpleNamespace as NS

    return NS(
        name=name,
        time_range=NS(start=start, end=start + us, elapsed_us=lambda: us),
        duration=us,
        kernels=[NS(name=k.name, duration=k.duration) for k in kernels],
        is_user_annotation=annotation,
        cpu_parent=parent,
    )


def test_classes_sum_to_the_device_total() -> None:
    """Two steps: attributed kernels by their ops, a graph replay's kernels by name, a 'Command
    Buffer Full' span left out; the classes sum to the device split's total, per step."""
    k = {
        "fp8": span(BF16_GEMMS[0], 10, 300),
        "mm": span(BF16_GEMMS[0], 400, 100),
        "cast": span(OTHER[-1], 600, 40),
        "copy": span("Memcpy HtoD (Pageable -> Device)", 700, 10),
        "replay_fp8": span(FP8_GEMMS[1], 1100, 500),
        "replay_cast": span(FP8_CASTS[0], 1700, 60),
        "replay_bf16": span(BF16_GEMMS[0], 1800, 100),
        "sdpa": span(ATTENTION[0], 1950, 30),
    }
    stall = span("Command Buffer Full", 5, 9000)
    fn = span("matmul_with_hp_or_float8_args", 1, 50)
    fp8_mm = span("aten::mm", 2, 10, parent=fn)
    host = [
        fn,
        fp8_mm,
        span("aten::_scaled_mm", 3, 5, (k["fp8"], stall), parent=fp8_mm),
        span("aten::mm", 20, 5, (k["mm"],)),
        span("aten::amax", 30, 5, (k["cast"],), parent=fn),
        span("aten::copy_", 40, 5, (k["copy"],)),
        span("ProfilerStep#1", 1000, 1000, (span("ProfilerStep#1", 1000, 900),), annotation=True),
    ]
    parsed = fake_parsed(host, list(k.values()), steps=2)
    split = class_split(parsed)
    assert split["ms"] == pytest.approx(
        {
            **dict.fromkeys(KERNEL_CLASSES, 0.0),
            **{"gemm_fp8": 0.4, "gemm": 0.1, "fp8_cast": 0.05, "attention": 0.015, "other": 0.005},
        }
    )
    assert split["total_ms"] == pytest.approx(sum(split["ms"].values()))
    assert split["total_ms"] == pytest.approx(sum(breakdown.device_split(parsed).values()))
    assert split["kernels"]["gemm_fp8"] == pytest.approx(1.0) and split["kernels"][
        "gemm"
    ] == pytest.approx(1.0)
    # auditable: the one bf16-named kernel counted as FP8 by its op, and the rules that decided
    assert {(t["name"], t["rule"]) for t in split["top"]["gemm_fp8"]} == {
        (BF16_GEMMS[0], 0),
        (FP8_GEMMS[1], 10),
    }
    assert [t["name"] for t in split["top"]["gemm"]] == [BF16_GEMMS[0], BF16_GEMMS[0]]
    used = {r["rule"]: r["ms"] for r in split["rules"] if r["kernels"]}
    assert used == pytest.approx(
        {0: 0.15, 2: 0.05, 3: 0.02, 9: 0.015, 10: 0.25, 11: 0.05, 12: 0.03, 18: 0.005}
    )


def test_no_device_kernels_is_an_empty_split() -> None:
    split = class_split(fake_parsed([span("aten::mm", 1, 5)], []))
    assert split["total_ms"] == 0.0 and set(split["ms"].values()) == {0.0}
    assert all(rows == [] for rows in split["top"].values())


def test_cpu_report_has_no_kernel_classes(reports: dict[str, Path]) -> None:
    r = load(reports["base"])
    assert "kernel_classes" in r and r["kernel_classes"] is None
    assert "Device time by kernel class" not in (reports["base"] / "report.md").read_text()
    assert diff.figures(r)["kernel_classes"] is None
    # a report from before the section: no KeyError
    older = {k: v for k, v in r.items() if k != "kernel_classes"}
    assert diff.figures(older)["kernel_classes"] is None


class Float8Linear(torch.nn.Linear):
    """Stands for torchao's class, matched by name."""


def tiny_model() -> torch.nn.Module:
    """Three linear layers, their weights drawn from torch's generator seeded with 0."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 32, bias=False),
        torch.nn.Linear(32, 10, bias=False),
    )


def test_gemm_flops_count_three_gemms_per_linear_layer() -> None:
    model = tiny_model()
    model[0].__class__ = model[2].__class__ = Float8Linear
    flops = linear_gemm_flops(model, tokens=100)
    assert flops == {
        "fp8": 3 * 2 * 100 * (32 * 64 + 64 * 32),
        "other": 3 * 2 * 100 * 32 * 10,
        "fp8_layers": 2,
        "other_layers": 1,
    }


def test_gemm_flops_of_torchaos_float8_training() -> None:
    """torchao's emulated float8 (what a CPU runs): the eligible layers (dims multiples of 16) are
    Float8Linear, and models.step's Float8FusedLinear subclass counts as one."""
    pytest.importorskip("torchao.float8")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from models.config import CONFIGS
    from models.model import Decoder
    from models.step import to_float8

    model = tiny_model()
    config = Float8LinearConfig.from_recipe_name("tensorwise")
    convert_to_float8_training(
        model,
        config=dataclasses.replace(config, emulate=True),
        module_filter_fn=lambda m, fqn: m.out_features % 16 == 0,
    )
    assert linear_gemm_flops(model, tokens=100) == {
        "fp8": 600 * (32 * 64 + 64 * 32),
        "other": 600 * 32 * 10,
        "fp8_layers": 2,
        "other_layers": 1,
    }

    cfg = CONFIGS["tiny"]
    decoder = Decoder(cfg, fused_proj=True)
    swapped = to_float8(decoder, "rowwise", emulate=True)
    assert any(type(decoder.get_submodule(n)).__name__ == "Float8FusedLinear" for n in swapped)
    flops = linear_gemm_flops(decoder, tokens=8)
    assert flops["fp8_layers"] == len(swapped) and flops["other_layers"] == 1  # the LM head
    assert flops["other"] == 6 * 8 * cfg.d_model * cfg.vocab_size


def test_fp8_tflops_and_fraction_of_the_ceiling() -> None:
    from types import SimpleNamespace as NS

    model = tiny_model()
    model[0].__class__ = Float8Linear
    step = NS(model=model, tokens_per_step=1_000_000)
    ms = {"gemm_fp8": 0.5, "gemm": 1.0}
    fp8 = 6e6 * 32 * 64
    m = matmul_figures(step, ms, fp8_ceiling=1000.0)
    assert m["gemm_fp8_tflops_achieved"] == pytest.approx(fp8 / 0.5e-3 / 1e12)
    assert m["gemm_fp8_ceiling_fraction"] == pytest.approx(m["gemm_fp8_tflops_achieved"] / 1000.0)
    assert m["gemm_tflops_achieved"] == pytest.approx(6e6 * (64 * 32 + 32 * 10) / 1e-3 / 1e12)
    split = {"ms": ms}
    assert any("target" in note for note in class_notes(split, m))
    assert not any("Above the ceiling" in note for note in class_notes(split, m))  # 2.5% of it
    above = matmul_figures(step, ms, fp8_ceiling=20.0)  # 123%: flagged, as a floor beaten is
    assert any("Above the ceiling" in note for note in class_notes(split, above))
    none = matmul_figures(step, ms, fp8_ceiling=None)
    assert none["gemm_fp8_ceiling_fraction"] is None and none["fp8_ceiling_tflops"] is None
    assert any("No FP8 ceiling given" in note for note in class_notes(split, none))
    lost = matmul_figures(step, {"gemm_fp8": 0.0, "gemm": 1.0}, fp8_ceiling=1000.0)
    assert lost["gemm_fp8_tflops_achieved"] is None and lost["gemm_fp8_ceiling_fraction"] is None
    assert any(
        "no kernel classed as an FP8 GEMM" in n
        for n in class_notes({"ms": {"gemm_fp8": 0.0}}, lost)
    )


def test_kernel_classes_are_rendered(
    reports: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA report's section in Markdown and HTML (a CPU report with a synthetic split and the
    CLI's ceiling)."""
    from types import SimpleNamespace as NS

    args = profile.parser().parse_args([*RUN, "--fp8-ceiling-tflops", "1200"])
    assert (
        args.fp8_ceiling_tflops == 1200.0
        and profile.parser().parse_args(RUN).fp8_ceiling_tflops is None
    )
    r = load(reports["base"])
    r["ops"]["top_device"] = r["ops"]["top_kernels"] = []
    model = tiny_model()
    model[0].__class__ = Float8Linear
    kernel = span(FP8_GEMMS[0], 10, 300)
    parsed = fake_parsed([span("aten::_scaled_mm", 1, 5, (kernel,))], [kernel])
    step = NS(device=NS(type="cuda"), model=model, tokens_per_step=4096)
    r["kernel_classes"] = kernel_class_figures(step, parsed, args.fp8_ceiling_tflops)
    md, page = (f(report.report_blocks(r)) for f in (report.to_markdown, report.to_html))
    assert (
        "## Device time by kernel class (per step)" in md
        and "<h2>Device time by kernel class" in page
    )
    assert "| gemm_fp8 | 1 | 0.3 | 100.0% |" in md and "| gemm_fp8_ceiling_fraction |" in md
    assert FP8_GEMMS[0] in md and "matmul_with_hp_or_float8_args" in md  # top kernels and the rules
    assert diff.figures(r)["kernel_classes.ms.gemm_fp8"] == pytest.approx(0.3)


def test_the_profiled_window_opens_on_an_idle_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the device is synchronized before the first step and after the last warm-up step,
    before the prof.step() that opens the window, and at no other step: earlier queued kernels
    stay out of the window, and the profiled steps run as training runs them, unsynchronized."""
    from optbench.profiling import capture

    events: list[str] = []

    class FakeProfile:
        def __init__(self, **kwargs: object) -> None:
            pass

        def __enter__(self) -> FakeProfile:
            return self

        def __exit__(self, *exc: object) -> None:
            events.append("stop")

        def step(self) -> None:
            events.append("prof.step")

    class FakeStep:
        device = torch.device("cuda", 0)

        def __call__(self) -> None:
            events.append("step")

    monkeypatch.setattr(capture, "profile", FakeProfile)
    monkeypatch.setattr(capture, "schedule", lambda **kwargs: kwargs)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(capture, "allocated_bytes", lambda step: 0)
    capture.capture(FakeStep(), steps=2, warmup=3)
    warm_up = ["sync", *["step", "prof.step"] * 2, "step", "sync", "prof.step"]
    assert events == [*warm_up, *["step", "prof.step"] * 2, "stop"]
    events.clear()
    capture.capture(FakeStep(), steps=2, warmup=0)  # the window opens with the first step
    assert events == ["sync", *["step", "prof.step"] * 2, "stop"]


def test_the_memory_snapshot_is_the_allocators_pickled_and_gzipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The snapshot file holds what torch.cuda.memory._snapshot returned after one more step,
    recorded under the allocator's history and with the history switched off after; gzipped."""
    import pickle

    from optbench.profiling import capture

    events: list[object] = []
    snapshot = {"segments": [{"address": 1, "blocks": []}], "device_traces": [[]]}
    monkeypatch.setattr(
        torch.cuda.memory, "_record_memory_history", lambda **kw: events.append(kw["enabled"])
    )
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: snapshot)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))

    class FakeStep:
        device = torch.device("cuda", 0)

        def __call__(self) -> None:
            events.append("step")

    path = tmp_path / capture.SNAPSHOT
    assert capture.SNAPSHOT.endswith(".pickle.gz")  # the name says how to open it
    capture.dump_memory_snapshot(FakeStep(), path)
    assert events == ["all", "step", "sync", None]
    with gzip.open(path, "rb") as f:
        assert pickle.load(f) == snapshot
