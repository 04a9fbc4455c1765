"""The HF + torch.compile anchor (optbench.suite.anchors, bench_anchors.HFCompileStep) without
transformers: its shapes against the stored anchor script, its skips, the check that refuses a step
that does not train (on stub models), the work timed as our step is (transformers replaced by a
stub), and the report's x HF on synthetic stores (test data, not measurements)."""

from __future__ import annotations

import ast
import math
import sys
import types

import pytest
import torch
from synthetic_results import _steps, commit, record, samples, save

from models.config import CONFIGS, flops_per_token, param_count
from models.step import BASELINE
from optbench.measure.hardware import PROFILES
from optbench.reporting import data, headline
from optbench.run.runner import WrongResult
from optbench.store.store import REPO_ROOT, ResultStore, record_key
from optbench.suite import anchors, catalog
from optbench.suite import plan as P
from optbench.suite.workloads import step_timing

ROOT = REPO_ROOT
SCRIPT = ROOT / "scripts/probes/hf_compile_step_steady.py"
H100 = PROFILES["h100-sxm"]


# --- shapes and skips
# ---------------------------------------------------------------------------------------


def _script_shapes() -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """The anchor script's per-size LlamaConfig keywords, and its other LlamaConfig keywords and B,
    S."""
    tree = ast.parse(SCRIPT.read_text())
    sizes, common = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "cfgs":
            sizes = {
                ast.literal_eval(k): {kw.arg: ast.literal_eval(kw.value) for kw in v.keywords}
                for k, v in zip(node.value.keys, node.value.values)
            }
        if isinstance(node, ast.Assign) and [
            getattr(t, "id", None) for t in getattr(node.targets[0], "elts", [])
        ] == ["B", "S"]:
            common.update(zip("BS", ast.literal_eval(node.value)))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LlamaConfig":
            common.update(
                {
                    kw.arg: ast.literal_eval(kw.value)
                    for kw in node.keywords
                    if kw.arg in ("vocab_size", "tie_word_embeddings")
                }
            )
    return sizes, common


def test_the_anchor_shapes_are_the_anchor_scripts():
    sizes, common = _script_shapes()
    assert list(sizes) == catalog.ANCHOR_SIZES
    for size, shape in sizes.items():
        ours = anchors.hf_shape(CONFIGS[size])
        assert ours == {**shape, "vocab_size": common["vocab_size"]}, size
    assert common["tie_word_embeddings"] is False and not any(
        CONFIGS[s].tie_embeddings for s in sizes
    )
    assert (common["B"], common["S"]) == (BASELINE.batch_size, BASELINE.seq_len)


def test_anchor_skip_reasons():
    for size in catalog.ANCHOR_SIZES:
        assert P.anchor_skip_reason(H100, size) is None
        assert P.anchor_skip_reason(PROFILES["cpu"], size).startswith("no CUDA:")
        # the anchor is bf16
        assert P.anchor_skip_reason(PROFILES["t4"], size).startswith("no bf16:")
    no_triton = H100.__class__(**{**vars(H100), "triton": False})
    # torch.compile's kernels
    assert P.anchor_skip_reason(no_triton, "100M").startswith("no Triton:")
    small = H100.__class__(**{**vars(H100), "mem_gb": 8.0})
    assert P.anchor_skip_reason(small, "1B").startswith("memory:")


def test_the_plan_lists_the_anchor_in_the_sweep_only():
    """The HF step does not change with our commits: the per-commit suites leave it out, the sweep
    has each size."""
    sweep = [r for r in P.plan(H100, "sweep") if r.benchmark == catalog.ANCHOR_BENCHMARK]
    assert [r.params["size"] for r in sweep] == catalog.ANCHOR_SIZES
    assert all(r.action == "run" and r.floor_ms > 0 for r in sweep)
    for suite in ("quick", "full"):
        assert not [r for r in P.plan(H100, suite) if r.benchmark == catalog.ANCHOR_BENCHMARK]


def test_hf_step_work_skips_on_a_cpu():
    with pytest.raises(NotImplementedError, match="^no CUDA:"):
        anchors.hf_step_work("100M", "cpu")


def test_hf_step_work_skips_without_transformers(monkeypatch):
    monkeypatch.setattr("optbench.suite.workloads.machine_profile", lambda device: H100)
    monkeypatch.setattr(anchors, "find_spec", lambda name: None)
    with pytest.raises(NotImplementedError, match="transformers"):
        anchors.hf_step_work("100M", "cuda")


# --- the check on stub models
# -------------------------------------------------------------------------------

V, D = 64, 32


class TinyLM(torch.nn.Module):
    """Embedding and LM head: near-uniform logits at init (head std 0.02), as an HF model's."""

    def __init__(self, logit_scale: float = 1.0):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = torch.nn.Embedding(V, D), torch.nn.Linear(D, V, bias=False)
        torch.nn.init.normal_(self.head.weight, std=0.02)
        self.logit_scale = logit_scale

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.emb(idx[:, :-1])) * self.logit_scale
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())


def _check(
    model: TinyLM, optimizer_params=None, update: bool = True, poison: float = 1.0, **adamw
) -> dict:
    """check_training of one stub step: AdamW (lr 1e-2) over ``optimizer_params`` (default: all),
    the update skipped where not ``update``, the returned loss multiplied by ``poison``."""
    opt = torch.optim.AdamW(optimizer_params or model.parameters(), lr=1e-2, **adamw)
    batch = torch.randint(0, V, (4, 33), generator=torch.Generator().manual_seed(0))

    def step() -> torch.Tensor:
        loss = model(batch)
        loss.backward()
        if update:
            opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach() * poison

    params = dict(model.named_parameters())
    return anchors.check_training(step, params, V, sum(p.numel() for p in params.values()))


def test_the_check_passes_a_step_that_trains():
    out = _check(TinyLM())
    assert abs(out["losses"][0] - math.log(V)) < 0.05 and out["losses"][-1] < out["losses"][0]
    assert out["unchanged_params"] == 0 and len(out["losses"]) == anchors.CHECK_STEPS


@pytest.mark.parametrize(
    ("broken", "why"),
    [
        (lambda m: _check(m, update=False), "did not lower the loss.*2 parameters did not change"),
        (lambda m: _check(m, poison=float("nan")), "a loss is not finite"),
        (lambda m: _check(m, maximize=True), "did not lower the loss"),  # steps uphill
        (
            lambda m: _check(m, optimizer_params=[m.head.weight]),
            r"1 parameters did not change \(e.g. emb.weight\)",
        ),
    ],
)
def test_the_check_refuses_a_step_that_does_not_train(broken, why):
    with pytest.raises(WrongResult, match=why):
        broken(TinyLM())


def test_the_check_refuses_a_far_init_loss_and_another_shape():
    with pytest.raises(WrongResult, match=r"first loss is not within 10% of ln\(64\)"):
        _check(TinyLM(logit_scale=300.0))
    model = TinyLM()
    step = lambda: model(torch.zeros(2, 5, dtype=torch.long)).detach()  # noqa: E731
    with pytest.raises(WrongResult, match="parameters, not the size's 1"):
        anchors.check_training(step, dict(model.named_parameters()), V, 1)


# --- the work, with transformers replaced by a stub
# ---------------------------------------------------------


class StubLlama(torch.nn.Module):
    """Stands in for transformers' LlamaForCausalLM: lists the configs it was built with, returns
    .loss."""

    built: list = []

    def __init__(self, config):
        super().__init__()
        self.head = torch.nn.Linear(2, 2)
        self.built.append(config)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor):
        return types.SimpleNamespace(loss=self.head.weight.sum())


@pytest.fixture
def stub_transformers(monkeypatch):
    """A 'transformers' module with LlamaConfig and LlamaForCausalLM stubs, an H100 profile, no
    compile."""
    modeling = types.SimpleNamespace(LlamaForCausalLM=StubLlama)
    module = types.SimpleNamespace(
        LlamaConfig=lambda **kw: types.SimpleNamespace(**kw),
        __version__="stub",
        models=types.SimpleNamespace(llama=types.SimpleNamespace(modeling_llama=modeling)),
    )
    monkeypatch.setitem(sys.modules, "transformers", module)
    monkeypatch.setitem(sys.modules, "transformers.models", module.models)
    monkeypatch.setitem(sys.modules, "transformers.models.llama", module.models.llama)
    monkeypatch.setitem(sys.modules, "transformers.models.llama.modeling_llama", modeling)
    monkeypatch.setattr(anchors, "find_spec", lambda name: True)
    monkeypatch.setattr("optbench.suite.workloads.machine_profile", lambda device: H100)
    monkeypatch.setattr(torch, "compile", lambda model: model)
    monkeypatch.setattr(StubLlama, "built", [])


def test_the_work_is_timed_and_counted_as_our_step(stub_transformers):
    work = anchors.hf_step_work("100M", "cpu")
    cfg, tokens = CONFIGS["100M"], BASELINE.batch_size * BASELINE.seq_len
    assert (
        set(work.timed) == {"step", "forward"} and work.memory == ("step",) and work.graph is False
    )
    assert work.timing == step_timing("cpu", {})  # timed as our step is
    assert work.flops == {"step": flops_per_token(cfg, BASELINE.seq_len) * tokens}
    assert work.info["tokens"] == tokens and work.info["primary_clock"] == "wall"
    assert work.info["params"] == param_count(cfg) and work.info["setup"] == anchors.HF_SETUP
    with pytest.raises(WrongResult, match="not the size's"):  # the stub is not the size's model
        work.check()


def test_the_model_gets_the_sizes_shape(stub_transformers):
    anchors.hf_step_work("1B", "cpu")
    (config,) = StubLlama.built
    assert {k: getattr(config, k) for k in anchors.hf_shape(CONFIGS["1B"])} == anchors.hf_shape(
        CONFIGS["1B"]
    )
    assert config.tie_word_embeddings is False and config._attn_implementation == "sdpa"
    assert config.max_position_embeddings == BASELINE.seq_len


# --- x HF in the report
# -------------------------------------------------------------------------------------


def _anchor(size: str, ms: float, seed: int) -> dict:
    return record(
        catalog.ANCHOR_BENCHMARK,
        {"size": size},
        times={"step": (None, samples(ms, seed))},
        info={
            "tokens": 8192,
            "primary_clock": "wall",
            "setup": anchors.HF_SETUP,
            "transformers": "5.0",
        },
    )


STEPS_DATE = "2025-01-01T12:00:00+00:00"


def _hf_store(tmp_path, anchor_date: str | None = STEPS_DATE) -> ResultStore:
    """Commit 1's steps at 100M and 1B (synthetic_results, dated STEPS_DATE) and, unless anchor_date
    is None, the anchor at 100M only (a record of the steps' run where the dates are equal)."""
    store = ResultStore(tmp_path / "results")
    save(store, "h100-sxm", commit(1), STEPS_DATE, _steps(1, True))
    if anchor_date:
        save(store, "h100-sxm", commit(1), anchor_date, [_anchor("100M", 120.0, 7)])
    return store


def _rows(table: str, start: str) -> list[str]:
    return [line for line in table.splitlines() if line.startswith(start)]


def test_x_hf_is_the_anchors_median_over_our_fastest_from_one_run(tmp_path):
    store = _hf_store(tmp_path)
    run = data.runs(store)["h100-sxm"][-1]
    ours = data.steps(run)["100M"]
    fastest = min(ours, key=lambda v: data.step_ms(ours[v]))
    assert fastest == "best"
    x = data.step_ms(data.anchor_steps(run)["100M"]) / data.step_ms(ours["best"])
    assert data.hf_ratio(run, "100M") == (pytest.approx(x), "best", "same run")
    assert 1.5 < x < 2.0  # 120 ms over best's ~68.6 ms: neither inverted nor against eager
    table = headline.headline_table(store)
    row = "| × HF (HF ms / our fastest's ms) |"
    assert _rows(table, row) == [f"{row} {x:.2f}× vs best | n/a |"]
    hf_ms, hf_iqr = (
        data.step_ms(data.anchor_steps(run)["100M"]),
        data.step_iqr_ms(data.anchor_steps(run)["100M"]),
    )
    assert (
        f"| HF + torch.compile (ms per step [IQR]) | {hf_ms:.1f} ms [{hf_iqr:.1f}] | n/a |" in table
    )
    assert (
        anchors.HF_SETUP in table
        and "transformers 5.0" in table
        and catalog.ANCHOR_BENCHMARK in table
    )


@pytest.mark.parametrize(
    ("anchor_date", "where"),
    [
        ("2025-01-01T15:00:00+00:00", "another run, same day"),
        ("2025-01-02T12:00:00+00:00", "another run of the commit"),
    ],
)
def test_x_hf_says_when_the_anchor_came_from_another_run(tmp_path, anchor_date, where):
    run = data.runs(_hf_store(tmp_path, anchor_date))["h100-sxm"][-1]
    assert data.hf_ratio(run, "100M")[1:] == ("best", where)
    assert f"× vs best ({where}) | n/a |" in headline.headline_table(
        _hf_store(tmp_path / "again", anchor_date)
    )


def test_x_hf_takes_the_anchor_of_our_fastest_steps_own_run(tmp_path):
    """The steps' run measured the anchor too (a shard); a later run, another shard on a GPU twice
    as slow, measured it again: x HF divides the anchor of our fastest step's run, not the latest
    anchor, and says 'same run'."""
    store = _hf_store(tmp_path)
    later = "2025-01-01T12:00:01+00:00"
    save(store, "h100-sxm", commit(1), later, [_anchor("100M", 240.0, 8)], gpu_uuid="GPU-b")
    run = data.runs(store)["h100-sxm"][-1]
    assert data.anchor_steps(run)["100M"].date == later  # the latest anchor
    mine = run.by_run[data.run_of(data.steps(run)["100M"]["best"])][
        record_key(catalog.ANCHOR_BENCHMARK, {"size": "100M"})
    ]
    x = data.step_ms(mine) / data.step_ms(data.steps(run)["100M"]["best"])
    assert data.hf_ratio(run, "100M") == (pytest.approx(x), "best", "same run")


@pytest.mark.parametrize("failed", [None, "oom", "wrong"])
def test_no_hf_rows_without_an_anchor(tmp_path, failed):
    store = _hf_store(tmp_path, anchor_date=None)
    if failed:  # a case that did not measure is no anchor
        save(
            store,
            "h100-sxm",
            commit(1),
            STEPS_DATE,
            [record(catalog.ANCHOR_BENCHMARK, {"size": "100M"}, status=failed)],
        )
    run = data.runs(store)["h100-sxm"][-1]
    assert data.hf_ratio(run, "100M") is None and data.anchor_steps(run) == {}
    assert "HF" not in headline.headline_table(store)


def test_x_hf_only_from_the_columns_commit(tmp_path):
    """The anchor measured at an older commit than the step table's column (a newer run that
    measured as much of the table: one step pair more, no anchor) is not divided by a newer
    step."""
    store = _hf_store(tmp_path)
    extra = record(
        "bench_step.Step100M",
        {"variant": "fused-adamw"},
        times={"step": (None, samples(90.0, 5))},
        info={"primary_clock": "wall"},
    )
    save(store, "h100-sxm", commit(2), "2025-01-02T12:00:00+00:00", [*_steps(2, True), extra])
    table = headline.headline_table(store)
    assert "| 100M @ `fffffff2` |" in table and "× HF (HF ms / our fastest's ms)" not in table
    # the table of x HF run by run keeps the anchor beside its own run's steps only
    (row,) = [line for line in table.splitlines() if line.startswith("| 100M | ")]
    assert "| fffffff1 |" in row
