"""optbench.suite.plan: what each machine runs and skips, the step baseline per machine, the memory
estimate (checked against the H100 peaks stored in results/), datasheet floors, and rows that are
exactly the asv suite's cases."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import re
import sys

import pytest
import torch

from models.config import CONFIGS, flops_per_token, param_count
from models.step import BASELINE, validate
from models.variants import (
    ABLATED,
    ABLATION,
    ADDED,
    VARIANTS,
    ablation_note,
    reference,
    switch_name,
    switches,
)
from optbench.measure.hardware import PROFILES
from optbench.measure.roofline import Ceilings
from optbench.store.store import REPO_ROOT as ROOT
from optbench.store.store import ResultStore
from optbench.suite import baseline as B
from optbench.suite import memory_estimate as M
from optbench.suite import plan as P
from optbench.suite.catalog import KERNELS, STEP_GRIDS, asv_pattern
from optbench.suite.ops import OPS

T4, H100, A100_40 = PROFILES["t4"], PROFILES["h100-sxm"], PROFILES["a100-40gb"]
CATEGORIES = {
    "no CUDA",
    "no bf16",
    "no TF32",
    "no Triton",
    "no FP8",
    "same as eager",
    "unsupported",
    "memory",
}
GPUS = [key for key, p in PROFILES.items() if p.compute_capability]


def _rows(profile, suite="full") -> dict[tuple[str, tuple], P.PlanRow]:
    return {(r.benchmark, tuple(r.params.items())): r for r in P.plan(profile, suite)}


@pytest.mark.parametrize("suite", ["quick", "full", "ablation"])
@pytest.mark.parametrize("key", list(PROFILES))
def test_every_profile_plans(key, suite):
    rows = P.plan(PROFILES[key], suite)
    assert rows
    for row in rows:
        assert row.action in ("run", "skip")
        if row.action == "skip":
            assert row.reason.split(":", 1)[0] in CATEGORIES, row
            assert row.floor_ms is None
        elif PROFILES[key].compute_capability:
            assert row.floor_ms is not None and row.floor_ms > 0, row


def _asv_cases(suite: str, monkeypatch) -> set[tuple[str, tuple]]:
    """(benchmark, params) of every case the asv classes define under OPTBENCH_SUITE=suite that
    asv runs for ``optbench run --suite suite``: the combinations of their grids (every suite's)
    whose names, as asv writes them, its ``--bench`` regex matches."""
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setenv("OPTBENCH_SUITE", suite)
    pattern = re.compile(asv_pattern(suite))
    cases = set()
    # fresh imports, undone after
    for name in ("bench_kernels", "bench_step", "bench_precision", "bench_anchors"):
        monkeypatch.setitem(sys.modules, f"benchmarks.{name}", None)
        del sys.modules[f"benchmarks.{name}"]
        module = importlib.import_module(f"benchmarks.{name}")
        for cls in vars(module).values():
            concrete = isinstance(cls, type) and isinstance(getattr(cls, "params", None), list)
            if not (concrete and cls.__module__ == module.__name__ and cls.params):
                continue
            bench = cls.benchmark_name()
            for combo in itertools.product(*cls.params):
                if pattern.search(f"{bench}.track_x({', '.join(map(repr, combo))})"):
                    cases.add((bench, tuple(zip(cls.param_names, combo))))
    return cases


@pytest.mark.parametrize("suite", ["quick", "full", "sweep", "ablation"])
def test_rows_are_the_suites_cases(suite, monkeypatch):
    rows = P.plan(H100, suite)
    keys = [(r.benchmark, tuple(r.params.items())) for r in rows]
    assert len(keys) == len(set(keys))
    assert set(keys) == _asv_cases(suite, monkeypatch)


def test_rows_follow_the_catalog():
    rows = P.plan(H100, "sweep") + P.plan(H100, "ablation")
    for op in KERNELS.values():
        got = {(r.params["shape"], r.params["impl"]) for r in rows if r.benchmark == op.benchmark}
        assert got == set(itertools.product(op.shapes, op.impls))
    assert [r.params["variant"] for r in rows if r.benchmark == "bench_step.Step1B"] == STEP_GRIDS[
        "1B"
    ]
    assert [
        r.params["variant"] for r in rows if r.benchmark == "bench_step.Ablation500M"
    ] == STEP_GRIDS["ablation"]
    full = P.plan(H100, "full")
    for op in KERNELS.values():
        assert {r.params["shape"] for r in full if r.benchmark == op.benchmark} == {op.shape_1b}
    quick = P.plan(H100, "quick")
    norm_shapes = {r.params["shape"] for r in quick if r.benchmark == "bench_kernels.AddRMSNorm"}
    assert norm_shapes == {KERNELS["add_rmsnorm"].shape_1b}
    step_variants = [r.params["variant"] for r in quick if r.benchmark == "bench_step.Step100M"]
    assert step_variants == STEP_GRIDS["quick"]


def test_t4_skips_bf16_and_tf32():
    for shape, impl in itertools.product(KERNELS["rmsnorm"].shapes, KERNELS["rmsnorm"].impls):
        assert P.kernel_skip_reason(T4, "rmsnorm", shape, impl) is None  # measured in fp16 there
    assert (
        P.kernel_dtype(T4, "swiglu") == torch.float16
        and P.kernel_dtype(H100, "swiglu") == torch.bfloat16
    )
    assert P.kernel_dtype(T4, "grad_stats") == torch.float32
    assert P.kernel_skip_reason(T4, "grad_stats", "100M", "foreach") is None  # fp32
    assert P.matmul_skip_reason(T4, "bf16").startswith("no bf16:")
    assert P.matmul_skip_reason(T4, "tf32").startswith("no TF32:")
    assert P.matmul_skip_reason(T4, "fp16") is None and P.matmul_skip_reason(T4, "fp32") is None
    assert P.step_skip_reason(T4, "100M", "tf32").startswith("no TF32:")
    # 'best' asks for bf16 explicitly
    assert P.step_skip_reason(T4, "100M", "best").startswith("no bf16:")
    assert P.step_skip_reason(T4, "100M", "fp16-scaler").startswith("same as eager:")
    # GradScaler in a graph
    assert P.step_skip_reason(T4, "100M", "cuda-graph").startswith("unsupported:")
    for variant in (
        "eager",
        "fp32",
        "triton-norm",
        "liger-flce",
        "compile-default",
        "best-inductor",
    ):
        assert P.step_skip_reason(T4, "100M", variant) is None, variant


def test_t4_step_baseline_is_fp16_with_grad_scaler():
    for size in ("tiny", "100M", "500M", "1B"):
        # models.step: fp16 autocast + GradScaler
        assert B.base_options(T4, size).precision == "fp16"
        assert any("GradScaler" in note for note in B.baseline_notes(T4, size))
    assert B.base_options(H100, "100M") == BASELINE
    assert B.base_options(PROFILES["cpu"], "tiny").precision == "fp32"
    reference, candidate = B.step_pair(T4, "100M", "fp32")
    assert (reference.precision, candidate.precision) == ("fp16", "fp32")


def test_1b_does_not_fit_16_gb():
    for variant in STEP_GRIDS["1B"]:
        reason = P.step_skip_reason(T4, "1B", variant)
        assert reason and reason.split(":")[0] in ("memory", "no bf16", "no FP8", "unsupported"), (
            variant,
            reason,
        )
    reason = P.step_skip_reason(T4, "1B", "eager")
    assert (
        reason.startswith("memory:")
        and "would fit with checkpointing and an 8-bit optimizer" in reason
    )
    # ... as the estimate says: the fp32 states alone exceed the card, checkpointing alone is not
    # enough.
    cfg, base, usable = CONFIGS["1B"], B.base_options(T4, "1B"), M.usable_bytes(T4)
    assert base.batch_size == 1 and M.STATE_BYTES * param_count(cfg) > usable
    checkpointed = base.replace(checkpoint_every=1)
    assert M.step_memory_bytes(cfg, checkpointed) > usable
    assert M.step_memory_bytes(cfg, checkpointed.replace(optimizer="adamw8bit")) <= usable


def test_batch_halves_until_the_estimate_fits():
    for key, size in itertools.product(GPUS, ("100M", "500M", "1B")):
        profile, base = PROFILES[key], B.base_options(PROFILES[key], size)
        fits = M.step_memory_bytes(CONFIGS[size], base) <= M.usable_bytes(profile)
        notes = B.baseline_notes(profile, size)
        if not fits:
            assert base.batch_size == 1 and any(
                n.startswith("does not fit even at batch 1") for n in notes
            )
        elif base.batch_size < 8:
            larger = base.replace(batch_size=base.batch_size * 2)
            assert M.step_memory_bytes(CONFIGS[size], larger) > M.usable_bytes(profile)
            assert any(note.startswith(f"batch {base.batch_size}:") for note in notes)
    assert (
        B.base_options(A100_40, "1B").batch_size < 8 <= B.base_options(A100_40, "500M").batch_size
    )


@pytest.mark.parametrize("suite", ["full", "sweep", "ablation"])
def test_h100_runs_the_suite(suite):
    skipped = [r for r in P.plan(H100, suite) if r.action == "skip"]
    assert not skipped, skipped


def test_each_grid_times_each_variants_reference():
    """A speedup divides by the variant's own reference measured in the same grid (the quick grid
    too)."""
    for grid, variants in STEP_GRIDS.items():
        for variant in variants:
            assert reference(variant) in variants, (grid, variant)
    assert [
        reference(v) for v in ("triton-qknorm", "cuda-graph", "triton-rope", "tf32", ABLATED)
    ] == ["qknorm", "graph-prereqs", "fused-proj", "fp32", "eager"]
    # triton-qknorm's reference has QK-norm
    assert B.step_pair(H100, "100M", "qknorm")[0].qk_norm == "eager"
    # a reference model: checked against itself
    assert P.step_skip_reason(H100, "100M", "qknorm") is None


def test_ablation_leaves_out_one_switch_and_what_needs_it():
    best = B.step_pair(H100, "1B", ABLATED)[1]
    assert list(ABLATION) == [
        f"{ABLATED}-without-{switch_name(k, v)}" for k, v in switches(ABLATED).items()
    ]
    assert STEP_GRIDS["ablation"] == ["eager", ABLATED, *ABLATION, *ADDED]
    for name, removed in ABLATION.items():
        reference_options, options = B.step_pair(H100, "1B", name)
        assert reference_options == BASELINE  # checked against eager, as best-kernels is
        changed = {
            f.name
            for f in dataclasses.fields(best)
            if getattr(options, f.name) != getattr(best, f.name)
        }
        assert changed == set(removed), name
        assert all(getattr(options, k) == getattr(BASELINE, k) for k in removed), name
        validate(options, "cuda", H100)
        # keeping a switch that needs the removed one is refused, as NEEDS says
        for kept in removed[1:]:
            with pytest.raises(P.UnsupportedOptions):
                validate(options.replace(**{kept: getattr(best, kept)}), "cuda", H100)
        assert ablation_note(name).startswith(
            f"{ABLATED} without {switch_name(removed[0], getattr(best, removed[0]))}"
        )
    assert ABLATION[f"{ABLATED}-without-fused-proj"] == ("fused_proj", "rope")
    assert "also without triton-rope, which needs it" in ablation_note(
        f"{ABLATED}-without-fused-proj"
    )
    assert ABLATION[f"{ABLATED}-without-no-item-sync"] == ("item_sync", "cuda_graph")
    # a CPU runs them through Triton's interpreter or says why not
    for name in STEP_GRIDS["ablation"]:
        reason = P.step_skip_reason(PROFILES["cpu"], "100M", name)
        assert reason is None or reason.split(":", 1)[0] in CATEGORIES, (name, reason)


def test_old_architecture_skips_triton():
    old = dataclasses.replace(T4, key="old", triton=False)
    assert P.kernel_skip_reason(old, "grad_stats", "100M", "loop") is None
    assert P.step_skip_reason(old, "100M", "eager") is None
    for variant in ("triton-norm", "liger-swiglu", "fused-ce", "compile-default"):
        assert P.step_skip_reason(old, "100M", variant).startswith("no Triton:"), variant


def test_no_flash_attention_is_a_note_not_a_skip():
    row = _rows(T4)[("bench_step.Step100M", (("variant", "sdpa-causal"),))]
    assert row.action == "run" and "memory-efficient" in row.reason
    assert _rows(H100)[("bench_step.Step100M", (("variant", "sdpa-causal"),))].reason == ""


def test_kernel_bytes():
    n_params = param_count(CONFIGS["1B"])
    assert M.kernel_bytes("grad_stats", "1B", "loop") == 8 * n_params  # fp32 params and their grads
    shape, logits = "8192x2048x32000", M.LOGIT_BYTES * 8192 * 32000
    held = {
        impl: M.kernel_bytes("linear_ce", shape, impl) for impl in ("eager", "liger-ce", "triton")
    }
    assert held["eager"] == held["liger-ce"] == held["triton"] + logits


def _stored_h100_steps():
    """(size, variant, measured peak bytes) of the stored H100 step records without a CUDA graph or
    torch.compile (whose savings the estimate ignores): bytes resident before the step plus its peak
    above; the least over a variant's records, as an older record may count earlier cases'
    leftovers in its base (323aecf's fp8-tensorwise: 1.4 GB over ea41b36's, the same peak above it).
    A record whose process held memory before it (``mem_before_bytes``, from 2026-11-25 on) is left
    out: subtracting that undercounts where the build frees some of it (58f70e6's sharded 500M
    triton-norm: 4.81 GB held before, a base 2.96 GB under 2302182's with the same peak above it).
    Variants since retired are left out."""
    store = ResultStore(ROOT / "results")
    if "h100-sxm" not in store.machines():
        return []
    least: dict[tuple[str, str], int] = {}
    for commit in store.commits("h100-sxm"):
        for key, rec in store.load("h100-sxm", commit).items():
            if not key.startswith("bench_step.Step") or rec.get("status") != "ok":
                continue
            size, variant = (
                key.split("|")[0].removeprefix("bench_step.Step"),
                rec["params"]["variant"],
            )
            if variant not in VARIANTS and variant != "eager":
                continue
            options = B.step_pair(H100, size, variant)[1]
            if not options.cuda_graph and not options.compile and not rec.get("mem_before_bytes"):
                own = rec["mem_base_bytes"]["step"] + rec["peak_mem_bytes"]["step"]
                least[(size, variant)] = min(own, least.get((size, variant), own))
    return [(size, variant, peak) for (size, variant), peak in least.items()]


def test_memory_estimate_bounds_stored_h100_peaks():
    measured = _stored_h100_steps()
    if not measured:
        pytest.skip("no stored H100 step results")
    for size, variant, peak in measured:
        estimate = M.step_memory_bytes(CONFIGS[size], B.step_pair(H100, size, variant)[1])
        assert peak <= estimate <= 1.25 * peak, (size, variant, estimate / peak)


def test_datasheet_floors():
    peaks = Ceilings.from_profile(H100)
    mm = P.expected_floor_ms(H100, "bench_precision.Matmul", {"n": "8192", "mode": "bf16"})
    assert mm == pytest.approx(2 * 8192**3 / (peaks.peak("bf16") * 1e12) * 1e3)
    step = P.expected_floor_ms(H100, "bench_step.Step1B", {"variant": "eager"})
    assert step == pytest.approx(
        flops_per_token(CONFIGS["1B"], 1024) * 8 * 1024 / (peaks.peak("bf16") * 1e9)
    )
    op = OPS["rmsnorm"]
    dims = op.shapes["16384x4096"]
    rms = P.expected_floor_ms(
        H100, "bench_kernels.RMSNorm", {"shape": "16384x4096", "impl": "triton"}
    )
    # memory-bound
    assert rms == pytest.approx(op.bytes(dims, 2)["fwdbwd"] / (peaks.bandwidth_gbps * 1e6))
    assert P.expected_floor_ms(T4, "bench_precision.Matmul", {"n": "8192", "mode": "bf16"}) is None


def test_main_prints_a_plan(capsys):
    assert P.main(["--gpu", "h100", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100 SXM (h100-sxm" in out and "0 skip" in out
    assert P.main(["--gpu", "t4", "--suite", "quick"]) == 0
    out = capsys.readouterr().out
    assert "datasheet floor" in out and "skip (no bf16)" in out


def test_runners_doc_shows_the_current_plans(capsys):
    doc = (ROOT / "docs" / "runners.md").read_text()
    for gpu in ("h100", "h200", "a100-80gb", "a100-40gb", "rtx5090", "t4"):
        P.main(["--gpu", gpu, "--suite", "sweep", "--markdown"])
        assert capsys.readouterr().out in doc, (
            f"docs/runners.md is out of date for {gpu}: regenerate it"
        )
