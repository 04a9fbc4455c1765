"""The convergence check (optbench.suite.convergence) on the tiny model (fp32 on a CPU): the
synthetic language is deterministic and learnable, eager from another seed and real variants (FP8
through torchao's emulation) pass, and planted bugs fail: an optimizer that loses its state every
step (an 8-bit AdamW whose state is not stored), a wrong learning rate, frozen weights, FP8 scales
that are never updated. The figures quoted in the module's docstring come from these runs (200
steps, batch 4 x 128 tokens, lr 3e-3, 4 eager seeds)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from models.config import CONFIGS
from models.step import BASELINE, Hyper, TrainStep
from models.variants import VARIANTS, numerics
from optbench.measure.hardware import PROFILES
from optbench.run.runner import Case, measure_case
from optbench.suite import catalog
from optbench.suite import convergence as C
from optbench.suite import plan as P
from optbench.suite.corpus import MarkovLanguage, uniform_loss, unigram_entropy

TINY = CONFIGS["tiny"]
PROTOCOL = C.Protocol(
    steps=200,
    log_every=10,
    seeds=4,
    hyper=Hyper(lr=3e-3, weight_decay=0.1, max_grad_norm=1.0),
    batch_size=4,
)
# the tiny baseline on a CPU, batch 4
OPTIONS = BASELINE.replace(precision="fp32", batch_size=4, seq_len=128)
# A case's budget guards against a hang and checks no speed: 1 s for each step it may train (the
# eager seeds' and one variant's), 40 times a step's 0.025 s on 2 idle cores and 30 times its
# 0.035 s beside two busy processes (the eager seeds' 800 steps: 19 s and 27 s).
BUDGET_S = 1.0 * PROTOCOL.steps * (PROTOCOL.seeds + 1)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """torch on one intra-op thread while this module trains: the tiny model's ops gain nothing from
    two, and on a loaded CPU the threads of each op wait on each other (two threads trained 15 times
    slower than one beside two busy processes on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- the corpus
# ---------------------------------------------------------------------------------------------


def test_the_language_is_deterministic_and_learnable():
    language = MarkovLanguage(TINY.vocab_size, branching=8, seed=7)
    a, b = language.corpus(16, 65), language.corpus(16, 65)
    assert torch.equal(a.tokens, b.tokens) and a.floor == b.floor
    assert not torch.equal(a.tokens, language.corpus(16, 65, seed=1).tokens)
    assert not torch.equal(
        a.tokens, MarkovLanguage(TINY.vocab_size, branching=8, seed=8).corpus(16, 65).tokens
    )
    _, successors, probs = language.chain()
    assert torch.allclose(probs.sum(1), torch.ones(TINY.vocab_size, dtype=torch.float64))
    follows = (successors[a.tokens[:, :-1]] == a.tokens[:, 1:, None]).any(-1)
    assert follows.all()  # every transition is one the chain lists
    assert (
        0
        < a.floor
        < math.log(8)
        < unigram_entropy(language)
        < uniform_loss(language)
        == math.log(1000)
    )
    assert a.batches(4).shape == (4, 4, 65)


def test_protocol_and_curve():
    with pytest.raises(ValueError):
        C.Protocol(steps=25, log_every=10)
    with pytest.raises(ValueError):
        C.Protocol(seeds=1)
    # after the first quarter
    assert C.Protocol().first_compared == 8 and PROTOCOL.first_compared == 5
    curve = C.Curve(tuple(range(10, 210, 10)), tuple(float(i) for i in range(20)))
    assert curve.final == 18.5  # the last tenth of the points
    assert C.Protocol().record()["factor"] == C.FACTOR


# --- the check
# ----------------------------------------------------------------------------------------------


def _batches() -> torch.Tensor:
    return PROTOCOL.batches(TINY.vocab_size, OPTIONS.batch_size, OPTIONS.seq_len)[0]


def _step(seed: int = 0, **changes) -> TrainStep:
    return TrainStep(TINY, OPTIONS.replace(**changes), "cpu", seed)


@pytest.fixture(scope="module")
def eager() -> C.EagerSeeds:
    """The eager seeds, through the convergence case of 'eager' (which leaves them for the later
    cases)."""
    C._EAGER.clear()
    rec = measure_case(
        Case({"variant": "eager"}, lambda: C.convergence_work("tiny", "eager", "cpu", PROTOCOL)),
        device="cpu",
        budget_s=BUDGET_S,
    )
    assert rec["status"] == "ok", rec.get("reason")
    (seeds,) = C._EAGER.values()
    assert len(seeds.curves) == 4 and rec["info"]["curve"] == seeds.curves[0].record()
    return seeds


def test_eager_seeds_learn_and_agree(eager):
    for curve in eager.curves:
        assert curve.loss[-1] < curve.loss[0] - 3  # from near ln V = 6.9 to about 2
    assert 1e-3 < eager.spread < 0.05
    assert max(eager.leave_one_out()) < C.FACTOR  # each seed is within the others' tolerance


@pytest.mark.parametrize("seed", [4, 5])
def test_eager_from_another_seed_passes(eager, seed):
    verdict = C.judge(C.train(_step(seed), _batches(), PROTOCOL), eager)
    assert verdict.ok and verdict.same_seed_rms > 0, verdict.summary()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_passes(eager, recipe):
    """torchao's FP8 training (emulated on a CPU: its rounding, with matmuls in fp32) trains like
    eager."""
    pytest.importorskip("torchao.float8", reason="torchao is not installed")
    verdict = C.judge(C.train(_step(fp8=recipe), _batches(), PROTOCOL), eager)
    assert verdict.ok and verdict.ratio < 0.5, verdict.summary()


class ForgetfulAdamW(torch.optim.AdamW):
    """AdamW that loses its moments before every step (an 8-bit optimizer whose state is not
    stored): Adam's bias-corrected first step every time, lr * sign(gradient)."""

    def step(self, closure=None):
        self.state.clear()
        return super().step(closure)


def _forgetful(step: TrainStep) -> TrainStep:
    step.optimizer = ForgetfulAdamW(
        step.params, lr=step.hyper.lr, weight_decay=step.hyper.weight_decay, foreach=False
    )
    return step


def _frozen(step: TrainStep, part: str = ".attn.") -> TrainStep:
    for name, p in step.model.named_parameters():
        if part in name:
            p.requires_grad_(False)
    return step


MUTATIONS = {
    "optimizer-state-lost": lambda: C.train(_forgetful(_step()), _batches(), PROTOCOL),
    "lr-x1.25": lambda: C.train(
        _step(),
        _batches(),
        dataclasses.replace(
            PROTOCOL, hyper=dataclasses.replace(PROTOCOL.hyper, lr=1.25 * PROTOCOL.hyper.lr)
        ),
    ),
    "attention-frozen": lambda: C.train(_frozen(_step()), _batches(), PROTOCOL),
}


@pytest.mark.parametrize("bug", list(MUTATIONS))
def test_a_planted_bug_fails(eager, bug):
    verdict = C.judge(MUTATIONS[bug](), eager)
    assert not verdict.ok and verdict.ratio > 1.25, verdict.summary()


@pytest.mark.slow
def test_fp8_scales_that_are_never_updated_fail(eager, monkeypatch):
    """torchao's dynamic scales frozen at the first value computed for each shape: activations and
    gradients outgrow or undershoot them as training moves them, and saturate or underflow in
    FP8."""
    pytest.importorskip("torchao.float8", reason="torchao is not installed")
    from torchao.float8 import float8_scaling_utils

    computed = float8_scaling_utils.tensor_to_scale
    first: dict[tuple, torch.Tensor] = {}

    def stale(hp_tensor, float8_dtype, *args, **kwargs):
        key = (tuple(hp_tensor.shape), float8_dtype, *args, *sorted(kwargs.items()))
        if key not in first:
            first[key] = computed(hp_tensor, float8_dtype, *args, **kwargs).detach().clone()
        return first[key]

    monkeypatch.setattr(float8_scaling_utils, "tensor_to_scale", stale)
    verdict = C.judge(C.train(_step(fp8="tensorwise"), _batches(), PROTOCOL), eager)
    assert first and not verdict.ok and verdict.ratio > 2, verdict.summary()


def test_a_wrong_variant_is_recorded_as_wrong_with_its_curves(eager, monkeypatch):
    """Through the runner: the case of a variant whose optimizer loses its state is 'wrong', its
    record holding its curve and the eager seeds'; it reuses this process's eager seeds."""
    from models import step as step_mod

    adamw = step_mod._adamw
    monkeypatch.setattr(
        step_mod,
        "_adamw",
        lambda model, kind, capturable, hyper: (
            ForgetfulAdamW(
                model.parameters(), lr=hyper.lr, weight_decay=hyper.weight_decay, foreach=True
            )
            if kind == "foreach"
            else adamw(model, kind, capturable, hyper)
        ),
    )
    rec = measure_case(
        Case(
            {"variant": "foreach-adamw"},
            lambda: C.convergence_work("tiny", "foreach-adamw", "cpu", PROTOCOL),
        ),
        device="cpu",
        budget_s=BUDGET_S,
    )
    assert rec["status"] == "wrong" and "deviates from the eager seeds' mean" in rec["reason"], (
        rec.get("reason")
    )
    info = rec["info"]
    assert len(info["curve"]["loss"]) == 20 and len(info["eager"]["curves"]) == 4
    assert (
        info["eager"]["curves"][1] == eager.curves[1].record()
        and info["rms_deviation"] > info["tolerance"]
    )
    assert C.summary("tiny", "foreach-adamw")["ratio"] > 1


def _stored_seeds_run(tmp_path, monkeypatch, eager, protocol=PROTOCOL, **software):
    """Results under tmp_path holding one run (id 'r1') of the commit being measured whose eager
    convergence record keeps ``eager``'s seeds, on this machine's software (``software`` overrides
    part of it)."""
    from optbench.measure.machine import machine_info
    from optbench.store.store import MACHINE_KEY, ResultStore

    for var, value in {
        "OPTBENCH_RESULTS": str(tmp_path),
        "OPTBENCH_MACHINE": "cpu-test",
        "ASV_COMMIT": "c0",
    }.items():
        monkeypatch.setenv(var, value)
    info = {
        "protocol": protocol.record(),
        "precision": OPTIONS.precision,
        "batch_size": OPTIONS.batch_size,
        "seq_len": OPTIONS.seq_len,
        "eager": eager.record(),
    }
    ResultStore(tmp_path).save(
        "cpu-test",
        "c0",
        [
            {
                "key": MACHINE_KEY,
                "info": {**machine_info(), **software},
                "date": "2026-11-25T00:00:00+00:00",
            },
            {
                "key": "bench_convergence.Convergencetiny|variant=eager",
                "status": "ok",
                "seconds": 100.0,
                "date": "2026-11-25T00:00:00+00:00",
                "info": info,
            },
        ],
        run_id="r1",
    )


def _variant_case(monkeypatch, trained: list) -> dict:
    """The convergence case of foreach-adamw in a process without eager seeds; ``trained`` collects
    a marker each time the eager seeds are trained."""
    monkeypatch.setattr(C, "_EAGER", {})
    train_seeds = C.eager_seeds
    monkeypatch.setattr(C, "eager_seeds", lambda *a: trained.append(1) or train_seeds(*a))
    return measure_case(
        Case(
            {"variant": "foreach-adamw"},
            lambda: C.convergence_work("tiny", "foreach-adamw", "cpu", PROTOCOL),
        ),
        device="cpu",
        budget_s=BUDGET_S,
    )


def test_a_variant_reads_the_eager_seeds_a_run_of_this_code_stored(eager, tmp_path, monkeypatch):
    _stored_seeds_run(tmp_path, monkeypatch, eager)
    trained: list = []
    rec = _variant_case(monkeypatch, trained)
    assert rec["status"] == "ok", rec.get("reason")
    assert not trained and rec["info"]["eager"]["from_run"] == "r1"
    assert rec["info"]["eager"]["curves"] == [c.record() for c in eager.curves]
    # The eager case itself always trains: its record is a measurement of this run.
    monkeypatch.setattr(C, "eager_seeds", lambda *a: trained.append(1) or eager)
    measure_case(
        Case({"variant": "eager"}, lambda: C.convergence_work("tiny", "eager", "cpu", PROTOCOL)),
        device="cpu",
        budget_s=BUDGET_S,
    )
    assert trained == [1]


@pytest.mark.parametrize("mismatch", ["protocol", "software", "unlearned"])
def test_eager_seeds_of_another_protocol_or_software_or_that_did_not_learn_are_not_read(
    eager, tmp_path, monkeypatch, mismatch
):
    if mismatch == "protocol":
        _stored_seeds_run(
            tmp_path, monkeypatch, eager, dataclasses.replace(PROTOCOL, corpus_seed=99)
        )
    elif mismatch == "software":
        _stored_seeds_run(tmp_path, monkeypatch, eager, torch="0.0.0")
    else:  # seeds whose loss rose (their curves reversed)
        reversed_curves = tuple(C.Curve(c.steps, c.loss[::-1]) for c in eager.curves)
        _stored_seeds_run(tmp_path, monkeypatch, C.EagerSeeds(reversed_curves, eager.first))
    trained: list = []
    rec = _variant_case(monkeypatch, trained)
    assert rec["status"] == "ok" and trained == [1] and "from_run" not in rec["info"]["eager"]


# --- the suite
# ----------------------------------------------------------------------------------------------


def test_the_convergence_suite_trains_every_variant_that_changes_the_numerics():
    assert catalog.SUITES["convergence"] == ["bench_convergence.Convergence100M"]
    assert "bench_convergence.Convergence100M" not in catalog.SUITES["full"]
    grid = catalog.benchmark("bench_convergence.Convergence100M").params["convergence"][0]
    assert grid == catalog.CONVERGENCE and grid[0] == "eager"
    assert {name for name in VARIANTS if numerics(name) == "convergence"} <= set(grid)


def test_a_convergence_case_has_the_budget_of_its_eager_seeds(monkeypatch):
    """Its case trains the eager seeds before its variant: a single-GPU case's budget cut 8 seeds
    short on an H200 (NOTES.md, session 28)."""
    from optbench.run import runner
    from optbench.store import settings
    from optbench.suite import grids

    monkeypatch.delenv("OPTBENCH_CASE_BUDGET_S", raising=False)
    budgets = []
    monkeypatch.setattr(
        runner, "run_grid", lambda *a, budget_s, **k: budgets.append(budget_s) or {}
    )
    name = "bench_convergence.Convergence100M"
    grids._measure_grid(name, [["eager"]], [f"{name}|variant=eager"], "cpu")
    assert budgets == [C.CASE_BUDGET_S] > [2 * settings.current().case_budget_s]


def test_the_plan_of_the_convergence_suite():
    assert all(row.action == "run" for row in P.plan(PROFILES["h100-sxm"], "convergence"))
    cpu = P.plan(PROFILES["cpu"], "convergence")
    assert all(row.action == "skip" and row.reason.startswith("no CUDA:") for row in cpu)
    t4 = {row.params["variant"]: row for row in P.plan(PROFILES["t4"], "convergence")}
    assert t4["fp8-rowwise"].reason.startswith("no FP8:") and t4["eager"].action == "run"
    # what a CPU can train
    assert P.convergence_skip_reason(PROFILES["cpu"], "tiny", "eager") is None


def test_the_asv_class_reads_the_figures(monkeypatch):
    import importlib
    import sys

    from optbench.store.store import REPO_ROOT, record_key

    monkeypatch.syspath_prepend(str(REPO_ROOT))
    monkeypatch.setenv("OPTBENCH_SUITE", "convergence")
    monkeypatch.delitem(sys.modules, "benchmarks.bench_convergence", raising=False)
    bench = importlib.import_module("benchmarks.bench_convergence").Convergence100M()
    assert bench.params == [catalog.CONVERGENCE]
    key = record_key(bench.benchmark_name(), {"variant": "fp8-rowwise"})
    records = {
        key: {
            "status": "ok",
            "summary": {
                "final_loss": 2.5,
                "rms_deviation": 0.01,
                "max_deviation": 0.02,
                "ratio": 0.3,
            },
        }
    }
    assert bench.track_final_loss(records, "fp8-rowwise") == 2.5
    assert bench.track_deviation_over_tolerance(records, "fp8-rowwise") == 0.3
    assert math.isnan(bench.track_rms_deviation({key: {"status": "ok"}}, "fp8-rowwise"))
