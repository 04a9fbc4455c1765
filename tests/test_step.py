"""The training step: each switch passes the check against its reference (on a CPU through the
Triton interpreter; the GPU-only switches too when CUDA is there) and the check refuses planted
bugs; what a CPU cannot run, and combinations that cannot work, are refused at build time."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import weakref
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from models import step as step_mod
from models.config import CONFIGS, ModelConfig, flops_per_token
from models.step import (
    BASELINE,
    CHECK,
    VARIANTS,
    Baseline,
    CheckResult,
    StepOptions,
    TrainStep,
    UnsupportedOptions,
    baseline_of,
    build_step,
    check_against,
    validate,
    variant_options,
)
from models.variants import ABLATION, reference, switches

TINY = CONFIGS["tiny"]
SMALL = dict(batch_size=2, seq_len=32)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# Modules a switch needs beyond the baseline's; its test skips when one does not import.
NEEDS = {
    "triton-norm": "kernels.rmsnorm",
    "triton-swiglu": "kernels.swiglu",
    "triton-qknorm": "kernels.qknorm",
    "triton-rope": "kernels.rope",
    "fused-ce": "kernels.fused_linear_ce",
    "liger-norm": "liger_kernel",
    "liger-swiglu": "liger_kernel",
    "liger-flce": "liger_kernel",
    "best": "kernels.fused_linear_ce",
    "adamw-8bit": "bitsandbytes",
    **{name: "torchao" for name in VARIANTS if switches(name).get("fp8", "off") != "off"},
}
CPU_FP32 = [
    "qknorm",
    "chunked-ce",
    "checkpoint",
    "foreach-stats",
    "foreach-adamw",
    "no-item-sync",
    "cached-mask",
    "sdpa-causal",
    "fused-proj",
    "triton-norm",
    "triton-swiglu",
    "triton-qknorm",
    "triton-rope",
    "fused-ce",
    "compile-default",
    "compile-max-autotune-no-cudagraphs",
    "compile-regional",
]
CPU_BF16 = [
    "fp16-scaler",
    "chunked-ce",
    "fused-ce",
    "triton-norm",
    "triton-swiglu",
    "triton-qknorm",
    "triton-rope",
    "master-adamw",
]
GPU_ONLY = [
    "tf32",
    "liger-norm",
    "liger-swiglu",
    "liger-flce",
    "fused-adamw",
    "graph-prereqs",
    "cuda-graph",
    "compile-reduce-overhead",
    "compile-max-autotune",
    "best",
    "best-inductor",
    "best-graph",
    "best-compile-graph",
    "best-master",
    "best-fused",
    "best-kernels",
    "best-regional",
    "adamw-8bit",
    *(name for name in VARIANTS if switches(name).get("fp8", "off") != "off"),
]
H100 = SimpleNamespace(key="h100", supports_bf16=True, supports_tf32=True)


@functools.cache
def _baseline(
    reference: StepOptions, precision: str, device: str = DEVICE, config: ModelConfig = TINY
) -> Baseline:
    """The check's baseline, measured once per test session (before any test plants a bug)."""
    return baseline_of(lambda options: build_step(config, options, device), reference, precision)


def _check_options(
    reference: StepOptions, candidate: StepOptions, device: str = DEVICE, config: ModelConfig = TINY
) -> CheckResult:
    baseline = _baseline(reference, candidate.precision, device, config)
    return check_against(baseline, build_step(config, candidate, device))


def _check(name: str, base: StepOptions, device: str = DEVICE) -> CheckResult:
    if name in NEEDS:
        pytest.importorskip(NEEDS[name], reason=f"{NEEDS[name]} does not import")
    return _check_options(*variant_options(name, base), device)


def test_the_check_frees_each_step_it_builds_where_a_cycle_holds_it():
    """Mutation: each step baseline_of builds (the high-precision one, then the eager one) is held
    by a reference cycle, as the first optimizer of a process is (the frames of a lazy import hold
    it); with the collector off, none outlives the record baseline_of keeps of it."""
    built = []

    def build(options: StepOptions) -> TrainStep:
        step = build_step(TINY, options, "cpu")
        step.held_by = step  # a cycle: freed by the collector only
        built.append(weakref.ref(step))
        return step

    collecting = gc.isenabled()
    gc.disable()
    try:
        baseline_of(build, BASELINE.replace(**SMALL), "bf16")
        alive = [ref() is not None for ref in built]
    finally:
        if collecting:
            gc.enable()
    assert alive == [False, False]


@pytest.mark.parametrize("name", CPU_FP32)
def test_switch_matches_fp32_baseline(name):
    result = _check(name, BASELINE.replace(precision="fp32", **SMALL))
    assert result.ok, result


@pytest.mark.parametrize("name", CPU_BF16)
def test_switch_matches_bf16_baseline(name):
    result = _check(name, BASELINE.replace(**SMALL))
    assert result.ok, result


@pytest.mark.parametrize("name", GPU_ONLY)
def test_gpu_only_switch_is_refused_on_cpu(name):
    with pytest.raises(UnsupportedOptions):
        build_step(TINY, variant_options(name, BASELINE.replace(**SMALL))[1], "cpu")


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_ONLY)
def test_gpu_switch_matches_bf16_baseline(name):
    result = _check(name, BASELINE.replace(**SMALL), "cuda")
    assert result.ok, result


def test_every_variant_is_one_known_switch():
    assert sorted(
        CPU_FP32 + GPU_ONLY + ["fp16-scaler", "fp32", "master-adamw", *ABLATION]
    ) == sorted(VARIANTS)
    fields = {f.name for f in dataclasses.fields(StepOptions)}
    for name, overrides in VARIANTS.items():
        assert set(overrides) - {"reference", "numerics"} <= fields and reference(name) in {
            "eager",
            *VARIANTS,
        }
        reference_options, candidate = variant_options(name)
        # a reference model is both
        assert (reference_options == candidate) == (reference(name) == name), name
    reference_options, candidate = variant_options("cuda-graph")
    assert (
        reference_options.optimizer,
        reference_options.item_sync,
        reference_options.attn_mask,
    ) == ("fused", False, "is_causal")
    assert dataclasses.replace(candidate, cuda_graph=False) == reference_options
    validate(candidate, "cuda", H100)  # the bundled prerequisites make it valid


@pytest.mark.parametrize(
    "changes, reason",
    [
        (dict(cuda_graph=True, item_sync=False, precision="fp16"), "GradScaler"),
        (dict(cuda_graph=True), "item_sync"),
        (
            dict(cuda_graph=True, item_sync=False, compile="reduce-overhead"),
            "compile='reduce-overhead'",
        ),
        (
            dict(cuda_graph=True, item_sync=False, optimizer="adamw8bit"),
            "AdamW8bit is not capturable",
        ),
        (dict(norm="layernorm"), "norm='layernorm'"),
        (dict(checkpoint_every=-1), "checkpoint_every"),
        (dict(optimizer="master", precision="fp16"), "needs precision='bf16'"),
        (dict(rope="triton"), "needs fused_proj=True"),
        (dict(rope="triton", fused_proj=True, qk_norm="eager"), "no QK-norm"),
    ],
)
def test_validate_rejects_bad_combinations(changes, reason):
    with pytest.raises(UnsupportedOptions, match=reason):
        validate(BASELINE.replace(**changes), "cuda", H100)


def test_graph_captures_a_compiled_step(monkeypatch):
    """cuda_graph with compile='default' is valid, and its step compiles forward + loss, captures
    one whole optimizer step (the compiled forward + loss inside) after its warm-up steps, restores
    the initial weights and replays the graph at each call. On a CPU, torch.cuda's streams and graph
    are stood in for (the capture runs the step eagerly; a replay is recorded) and the capturable
    optimizer asked for is built without capturable, which a CPU refuses; a GPU runs the real
    capture in test_gpu_switch_matches_bf16_baseline (best-compile-graph)."""
    options = BASELINE.replace(cuda_graph=True, item_sync=False, compile="default")
    validate(options, "cuda", H100)
    events: list = []

    def compile_(fn, mode=None):
        events.append(("compile", fn, mode))
        return lambda *args: events.append("compiled forward") or fn(*args)

    def adamw(model, kind, capturable, hyper):
        events.append(("optimizer", kind, capturable))
        optimizer = build_adamw(model, kind, False, hyper)
        optimizer.register_step_post_hook(lambda *_: events.append("optimizer step"))
        return optimizer

    @contextlib.contextmanager
    def graph(cuda_graph):
        events.append("capture")
        yield
        events.append("captured")

    stream = SimpleNamespace(wait_stream=lambda other: None)
    build_adamw = step_mod._adamw
    monkeypatch.setattr(step_mod, "_adamw", adamw)
    monkeypatch.setattr(torch, "compile", compile_)
    stand_ins = {
        "Stream": lambda device: stream,
        "current_stream": lambda device: stream,
        "stream": lambda s: contextlib.nullcontext(),
        "graph": graph,
        "CUDAGraph": lambda: SimpleNamespace(replay=lambda: events.append("replay")),
    }
    for name, stand_in in stand_ins.items():
        monkeypatch.setattr(torch.cuda, name, stand_in)
    options = options.replace(precision="fp32", **SMALL)
    step = TrainStep(TINY, options, "cpu", 0)
    warm_up = ["compiled forward", "optimizer step"] * 3
    assert events == [
        ("optimizer", "loop", True),
        ("compile", step_mod._model_loss, "default"),
        *warm_up,
        "capture",
        "compiled forward",
        "optimizer step",
        "captured",
    ]
    unstepped = TrainStep(TINY, options.replace(cuda_graph=False, compile=None), "cpu", 0)
    assert all(torch.equal(w, unstepped.weights()[n]) for n, w in step.weights().items())
    del events[:]
    step()
    step()
    assert events == ["replay", "replay"]

    # built uncaptured (to be wrapped first, as DDP is): eager until captured, then after the
    # warm-up steps asked for (DDP's reducer needs 11)
    del events[:]
    deferred = TrainStep(TINY, options, "cpu", 0, capture=False)
    assert "capture" not in events
    deferred.capture_warmup = 11
    del events[:]
    deferred.capture()
    assert events == ["compiled forward", "optimizer step"] * 11 + [
        "capture",
        "compiled forward",
        "optimizer step",
        "captured",
    ]

    # a tuned step captures again, its warm-up on the stream of its first capture: cuBLAS keeps a
    # workspace per stream it ran on (mutation: a new side stream for each capture)
    made: list = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: made.append(device) or stream)
    step.tune(step.hyper)
    assert made == [] and events.count("captured") == 2


def test_8bit_adamw_is_skipped_with_its_reason_without_bitsandbytes(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "bitsandbytes" else find_spec(name, *a),
    )
    with pytest.raises(UnsupportedOptions, match="bitsandbytes, which is not installed"):
        build_step(TINY, BASELINE.replace(optimizer="adamw8bit", **SMALL), "cuda", profile=H100)


def test_validate_follows_the_hardware_profile():
    old_gpu = SimpleNamespace(key="t4", supports_bf16=False, supports_tf32=False)
    with pytest.raises(UnsupportedOptions, match="bf16.*t4"):
        validate(BASELINE, "cuda", old_gpu)
    with pytest.raises(UnsupportedOptions, match="tf32.*t4"):
        validate(BASELINE.replace(precision="tf32"), "cuda", old_gpu)
    validate(BASELINE.replace(precision="fp16"), "cuda", old_gpu)


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    validate(BASELINE.replace(norm="triton"), "cuda", H100)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UnsupportedOptions, match="TRITON_INTERPRET"):
        validate(BASELINE.replace(norm="triton"), "cpu")


def test_seq_len_over_the_model_is_refused():
    with pytest.raises(UnsupportedOptions, match="max_seq_len"):
        build_step(TINY, BASELINE.replace(seq_len=TINY.max_seq_len + 1), DEVICE)


def test_step_bookkeeping():
    step = build_step(TINY, BASELINE.replace(precision="fp32", **SMALL), DEVICE)
    assert step.tokens_per_step == 64
    assert step.flops_per_step == flops_per_token(TINY, 32) * 64
    assert step.idx.shape == step.targets.shape == (2, 32) and step.idx.any()
    assert torch.equal(step.idx, build_step(TINY, step.options, DEVICE).idx)
    assert not torch.equal(step.idx, build_step(TINY, step.options, DEVICE, seed=1).idx)
    first = step.forward_loss()
    losses = [step() for _ in range(5)]
    assert losses[0] == first  # a step returns the loss of the weights before its update
    assert step.loss_history == [loss.item() for loss in losses]
    assert step.loss_history[-1] < step.loss_history[0]
    assert set(step.grads()) == {name for name, _ in step.model.named_parameters()}
    assert step.stats["grad_norm"] > 0 and step.stats["param_norm"] > 0


def test_no_item_sync_keeps_losses_on_device():
    options = BASELINE.replace(precision="fp32", item_sync=False, grad_stats="none", **SMALL)
    step = build_step(TINY, options, DEVICE)
    losses = [step() for _ in range(3)]
    assert all(isinstance(loss, torch.Tensor) for loss in losses) and step.stats is None
    assert step.loss_history == [loss.item() for loss in losses]


def _skip_clipping(monkeypatch) -> None:
    """Steps built from now on compute the gradient statistics but never clip."""
    grad_stats_fns = step_mod._grad_stats_fns
    monkeypatch.setattr(
        step_mod, "_grad_stats_fns", lambda kind: (grad_stats_fns(kind)[0], lambda *args: None)
    )


def _drop_loss_scale(monkeypatch) -> None:
    """Steps built from now on backpropagate N times the mean loss (its value unchanged): a backward
    that forgets the 1/N of the mean over N tokens."""
    loss_fn = step_mod._loss_fn

    def unscaled(kind: str):
        loss = loss_fn(kind)

        def summed_backward(hidden, weight, target):
            mean = loss(hidden, weight, target)
            return mean + (target.numel() - 1) * (mean - mean.detach())

        return summed_backward

    monkeypatch.setattr(step_mod, "_loss_fn", unscaled)


def _override_optimizer(step: TrainStep, **group) -> TrainStep:
    """``step`` with ``group`` written into its AdamW's param groups at every step (after the
    check's tuning; nothing changes for an empty ``group``)."""
    optimizer_step = step.optimizer.step

    def overridden(*args, **kwargs):
        for param_group in step.optimizer.param_groups:
            param_group.update(group)
        return optimizer_step(*args, **kwargs)

    step.optimizer.step = overridden
    return step


# Planted bug -> (what plants it in the steps built after it, AdamW settings the candidate's
# optimizer forces, the quantity that catches it). Clipped gradients are blind to a lost 1/N; Adam's
# update to their scale.
MUTATIONS = {
    "skipped-clip": (_skip_clipping, {}, "grads"),
    "no-weight-decay": (None, {"weight_decay": 0.0}, "weights"),
    "no-1/N-loss-scale": (_drop_loss_scale, {}, "grad_norm"),
    "no-momentum": (None, {"betas": (0.0, 0.999)}, "weights"),
    "lr-x10": (None, {"lr": 10 * CHECK.lr}, "weights"),
}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("bug", list(MUTATIONS))
def test_check_refuses_a_planted_bug(bug, precision, monkeypatch):
    base = BASELINE.replace(precision=precision, **SMALL)
    baseline = _baseline(base, precision)
    plant, optimizer_group, caught_by = MUTATIONS[bug]
    if plant is not None:
        plant(monkeypatch)
    result = check_against(
        baseline, _override_optimizer(build_step(TINY, base, DEVICE), **optimizer_group)
    )
    assert not result.ok, result
    assert result.errors[caught_by] > result.tolerance[caught_by], result


def test_check_is_measured_against_a_higher_precision():
    """fp64 under fp32 (the eager fp32 step's own error is then not 0), fp32 under bf16; the
    tolerance comes from the eager step's error, with a floor; another batch fails; a used step is
    refused."""
    fp32 = BASELINE.replace(precision="fp32", **SMALL)
    assert (
        step_mod.high_precision(fp32, "fp32").precision
        == step_mod.high_precision(fp32.replace(precision="bf16"), "fp32").precision
        == "fp64"
    )
    assert step_mod.high_precision(fp32.replace(precision="bf16"), "bf16").precision == "fp32"
    baseline = _baseline(fp32, "fp32")
    assert (
        baseline.reference.precision == "fp64"
        and baseline.reference.grads["lm_head.weight"].dtype == torch.float64
    )
    assert all(0 < error < 1e-5 for error in baseline.eager.values()), baseline.eager
    result = check_against(baseline, build_step(TINY, fp32, DEVICE))
    assert result.ok and result.tolerance["weights"] == max(2.5 * baseline.eager["weights"], 1e-6)
    assert set(result.record()["errors"]) == {"loss", "grad_norm", "grads", "weights"}
    assert not check_against(baseline, build_step(TINY, fp32, DEVICE, seed=1)).ok
    used = build_step(TINY, fp32, DEVICE)
    used()
    with pytest.raises(ValueError, match="fresh"):
        check_against(baseline, used)


def test_check_settings_clip_and_leave_what_is_timed():
    """The check clips (the reference's norm at init is over CHECK's threshold, which baseline_of
    enforces) and a step checked trains with its own settings afterwards."""
    base = BASELINE.replace(precision="fp32", **SMALL)
    assert float(_baseline(base, "fp32").reference.grad_norm) > 10 * CHECK.max_grad_norm
    step = build_step(TINY, base, DEVICE)
    check_against(_baseline(base, "fp32"), step)
    assert step.hyper == step_mod.Hyper(step_mod.LR, step_mod.WEIGHT_DECAY, step_mod.MAX_GRAD_NORM)
    assert {(g["lr"], g["weight_decay"]) for g in step.optimizer.param_groups} == {
        (step_mod.LR, step_mod.WEIGHT_DECAY)
    }


def test_fused_adamw_clipping_in_its_pass_passes_the_check():
    """foreach statistics + torch's fused AdamW, clipping through its grad_scale (TrainStep built
    directly: validate() keeps fused AdamW off CPUs, but torch's runs on one)."""
    base = BASELINE.replace(precision="fp32", **SMALL)
    options = base.replace(grad_stats="foreach", optimizer="fused")
    assert step_mod.clips_in_optimizer(options)
    result = check_against(_baseline(base, "fp32"), TrainStep(TINY, options, DEVICE, 0))
    assert result.ok, result


def test_clipping_inside_the_fused_adamw_matches_a_separate_clip(monkeypatch):
    """foreach statistics + fused AdamW clip through the optimizer's grad_scale; same grads and
    weights as the separate ``_foreach_mul_`` clip (TrainStep built directly: validate() keeps fused
    AdamW off CPUs, but torch's fused AdamW runs on one)."""
    from models import step as step_mod

    # far under the tiny model's norm: every step clips
    monkeypatch.setattr(step_mod, "MAX_GRAD_NORM", 1e-3)
    options = BASELINE.replace(precision="fp32", grad_stats="foreach", optimizer="fused", **SMALL)
    assert step_mod.clips_in_optimizer(options)
    folded = step_mod.TrainStep(TINY, options, DEVICE, 0)
    monkeypatch.setattr(step_mod, "clips_in_optimizer", lambda options: False)
    separate = step_mod.TrainStep(TINY, options, DEVICE, 0)
    for _ in range(3):
        assert torch.equal(folded(), separate())
    assert folded.stats["grad_norm"] > 1e-2  # clipping was active
    for name, grad in separate.grads().items():
        torch.testing.assert_close(folded.grads()[name], grad, rtol=1e-5, atol=1e-9)
    for a, b in zip(folded.params, separate.params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert not hasattr(folded.optimizer, "grad_scale")


def test_master_weights_clip_and_take_the_norm_in_their_pass(monkeypatch):
    """bf16 weights + fp32 masters, clipping through MasterAdamW's grad_scale and the parameter norm
    from its pass: over three clipped steps, the losses, gradients, statistics and weights of
    torch's AdamW on fp32 weights under autocast (the same bf16 values in every matmul) with a
    separate clip."""
    from models import step as step_mod

    monkeypatch.setattr(step_mod, "MAX_GRAD_NORM", 1e-3)  # every step clips
    base = BASELINE.replace(grad_stats="foreach", optimizer="foreach", **SMALL)
    master = build_step(TINY, base.replace(optimizer="master"), DEVICE)
    eager = build_step(TINY, base, DEVICE)
    assert (
        master.model.lm_head.weight.dtype == torch.bfloat16
        and master.model.embed.weight.dtype == torch.float32
    )
    # Step 1 runs on the same bf16 weights: tight. Later steps run on bf16 copies of the updated
    # masters, which the CPU interpreter rounds toward zero (autocast rounds to nearest): ~1e-4
    # apart in the weights and ~0.5% in the gradient norm there; on a GPU both round to nearest.
    later = (1e-5, 1e-5) if DEVICE == "cuda" else (1e-3, 1e-2)
    for step in range(3):
        loss_rtol, rtol = (1e-5, 1e-5) if step == 0 else later
        torch.testing.assert_close(master(), eager(), rtol=loss_rtol, atol=0)
        for key in ("grad_norm", "param_norm"):
            torch.testing.assert_close(master.stats[key], eager.stats[key], rtol=rtol, atol=0)
        for name, grad in eager.grads().items():
            torch.testing.assert_close(
                master.grads()[name], grad, rtol=rtol, atol=1e-9 if step == 0 else 1e-6
            )
    assert master.stats["grad_norm"] > 1e-2  # clipping was active
    # relative to each tensor's norm
    for ours, theirs in zip(master.optimizer.masters, eager.params):
        assert float((ours - theirs).norm() / theirs.norm()) <= later[0]
    assert master.optimizer.grad_scale is None


def test_our_kernels_under_torch_compile_match_the_eager_step(monkeypatch):
    """Our Triton kernels are opaque custom ops to torch.compile (the fused loss runs outside the
    graph): the compiled step with all of them matches the eager step, and the model body stays one
    graph."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    from models.step import _model_loss

    base = BASELINE.replace(precision="fp32", **SMALL)
    kernels = dict(
        norm="triton",
        mlp="triton",
        qk_norm="triton",
        loss="fused",
        grad_stats="foreach",
        item_sync=False,
        attn_mask="is_causal",
    )
    reference = base.replace(qk_norm="eager")
    result = _check_options(reference, reference.replace(**kernels, compile="default"))
    assert result.ok, result
    step = build_step(TINY, base.replace(**kernels), DEVICE)
    explained = torch._dynamo.explain(_model_loss)(step.model, step._loss, step.idx, step.targets)
    assert explained.graph_count == 1


def _best_kernels_graph(monkeypatch) -> torch.fx.GraphModule:
    """The graph dynamo hands the backend for best-kernels' forward + loss (our norm, SwiGLU and
    RoPE Functions)."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    from models.step import _model_loss

    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(gm)
        return gm.forward

    options = BASELINE.replace(
        precision="fp32",
        attn_mask="is_causal",
        fused_proj=True,
        norm="triton",
        mlp="triton",
        rope="triton",
        **SMALL,
    )
    step = build_step(TINY, options, DEVICE)
    torch._dynamo.reset()
    torch.compile(_model_loss, backend=record)(step.model, step._loss, step.idx, step.targets)
    torch._dynamo.reset()
    assert len(graphs) == 1
    return graphs[0]


@pytest.mark.parametrize("allowed", [True, False], ids=["as-set", "planted-default"])
def test_a_compiled_step_with_our_kernels_can_reuse_aot_autograds_cache(allowed, monkeypatch):
    """The graph of a step with our kernels' autograd Functions passes AOTAutograd's cacheability
    check, so a warm compile reuses the cached forward/backward; mutation: with torch's default
    (custom Functions bypass the cache) the same graph is refused."""
    from torch._functorch._aot_autograd.autograd_cache import (
        BypassAOTAutogradCache,
        check_cacheable,
    )

    # set by models.step
    assert torch._functorch.config.autograd_cache_allow_custom_autograd_functions
    monkeypatch.setattr(
        torch._functorch.config, "autograd_cache_allow_custom_autograd_functions", allowed
    )
    graph = _best_kernels_graph(monkeypatch)
    if allowed:
        check_cacheable(graph)
    else:
        with pytest.raises(BypassAOTAutogradCache, match="autograd_function_apply|FunctionCtx"):
            check_cacheable(graph)


def test_regional_compilation_compiles_one_block_graph_whatever_the_depth():
    """compile_scope='blocks': the blocks share one compiled graph (plus the first block's, which
    has no branch output to add, the final norm's and the loss's), so a deeper model compiles no
    more graphs; the step matches its eager reference."""
    import dataclasses

    base = BASELINE.replace(precision="fp32", attn_mask="is_causal", **SMALL)
    graphs = []
    for n_layers in (2, 4):
        config = dataclasses.replace(TINY, n_layers=n_layers)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        result = _check_options(
            base, base.replace(compile="default", compile_scope="blocks"), config=config
        )
        assert result.ok, result
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[1] <= 4


@pytest.mark.parametrize(
    "kernels",
    [{}, {"norm": "triton", "mlp": "triton", "rope": "triton"}],
    ids=["best-fused", "best-kernels"],
)
def test_fused_projections_with_master_weights_under_compile_match_the_eager_step(
    kernels, monkeypatch
):
    """The model side of best-fused and best-kernels on a CPU: fused projections (with our kernels
    reading the packed outputs), bf16 weights with fp32 masters in our AdamW and torch.compile,
    against the eager bf16 step (gradients compared per unfused parameter)."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    base = BASELINE.replace(attn_mask="is_causal", grad_stats="foreach", **SMALL)
    candidate = base.replace(
        fused_proj=True, optimizer="master", item_sync=False, compile="default", **kernels
    )
    result = _check_options(base, candidate)
    assert result.ok, result
    assert (
        set(result.worst.values())
        <= dict(build_step(TINY, base, DEVICE).model.named_parameters()).keys()
    )


def test_a_tolerance_never_exceeds_its_precisions_ceiling():
    """fp16-scaler's reference in its own precision is the candidate itself: without a ceiling, a
    broken GradScaler path (errors of order 1) would pass against 2.5x its own error."""
    from models.step import CHECK_CEILING, _tolerance

    broken = {"loss": 0.5, "grads": 0.8, "grad_norm": 0.9, "weights": 0.7}
    assert _tolerance(broken, "fp16", 16384) == dict.fromkeys(broken, CHECK_CEILING["fp16"])
    quiet = {"loss": 1e-5, "grads": 2e-2, "grad_norm": 1e-4, "weights": 1e-3}
    # 2.5x, below the ceiling
    assert _tolerance(quiet, "bf16", 8192)["grads"] == pytest.approx(5e-2)
