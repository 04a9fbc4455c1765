"""The report's memory figures (optbench.reporting.memory) on synthetic records with a ``memory``
dict (optbench.store.records.CaseMemory): the case's peak where recorded, else the per-call figure
of a step not replayed from a CUDA graph, marked; a graphed step's per-call figure is never shown;
the estimate beside each. Test data, not measurements."""

from __future__ import annotations

import dataclasses

import pytest
from synthetic_results import commit, record, samples, save

from models.config import CONFIGS
from optbench.measure.hardware import lookup
from optbench.reporting import dashboard, data, memory, site
from optbench.store.records import CASE_METER
from optbench.store.store import ResultStore
from optbench.suite.baseline import step_pair
from optbench.suite.memory_estimate import step_memory_bytes

GB = 1e9


def _step(size: str, variant: str, ms: float, per_call: float, peak: float | None) -> dict:
    rec = record(
        f"bench_step.Step{size}",
        {"variant": variant},
        times={"step": (None, samples(ms, len(variant)))},
        peak={"step": int(per_call)},
        info={"tokens": 8192, "primary_clock": "wall"},
    )
    if peak is not None:
        rec["memory"] = {"peak_bytes": peak, "resident_bytes": peak / 2, "meter": CASE_METER}
    return rec


@pytest.fixture
def history(tmp_path) -> list[data.Run]:
    """1B: case peaks for eager and best-kernels (graphed), none for cuda-graph (graphed: its call
    allocates 512 bytes) or graph-prereqs; 100M: no case peak at all."""
    records = [
        _step("1B", "eager", 300.0, 20e9, 30e9),
        _step("1B", "graph-prereqs", 280.0, 18e9, None),
        _step("1B", "cuda-graph", 250.0, 512, None),
        _step("1B", "best-kernels", 100.0, 512, 25e9),
        _step("100M", "eager", 60.0, 7e9, None),
        _step("100M", "cuda-graph", 20.0, 512, None),
        _step("100M", "checkpoint", 80.0, 3e9, None),
    ]
    store = ResultStore(tmp_path / "results")
    save(store, "h100-sxm", commit(1), "2025-01-01T12:00:00+00:00", records)
    return data.runs(store)["h100-sxm"]


def _estimate(size: str, variant: str) -> str:
    options = step_pair(lookup("h100-sxm"), size, variant)[1]
    return f"{step_memory_bytes(CONFIGS[size], options) / GB:.1f}"


def test_each_step_shows_its_case_peak_else_a_marked_per_call_figure_never_a_graphs(history):
    """Mutation: a graphed step's per-call figure shown ('0.0†' for cuda-graph)."""
    sizes = data.by_size(data.fullest(history, data.steps))
    rows = {row[0]: row[1:] for row in memory.memory_rows(sizes)}
    assert memory.memory_columns(sizes) == [
        "variant",
        "100M @ fffffff1: measured GB",
        "100M: estimate GB",
        "1B @ fffffff1: measured GB",
        "1B: estimate GB",
    ]
    assert list(rows) == ["eager", "cuda-graph", "checkpoint", "graph-prereqs", "best-kernels"]
    assert rows["eager"] == ["7.0†", _estimate("100M", "eager"), "30.0", _estimate("1B", "eager")]
    assert rows["cuda-graph"] == [
        "–",
        _estimate("100M", "cuda-graph"),
        "–",
        _estimate("1B", "cuda-graph"),
    ]
    assert rows["graph-prereqs"] == ["", "", "18.0†", _estimate("1B", "graph-prereqs")]
    assert rows["best-kernels"][2] == "25.0"  # graphed, with its case peak
    assert float(rows["checkpoint"][1]) < float(rows["eager"][1])  # the estimate sees the trade


def test_time_against_memory_puts_one_kind_of_figure_in_a_panel(history):
    """1B has case peaks: its panel shows those only; 100M has none: the per-call figures of the
    steps not replayed from a CUDA graph."""
    run = history[-1]
    label, points = memory.time_against_memory(run, "1B", data.steps(run)["1B"])
    assert label.startswith("peak memory of the case")
    assert {(v, gb) for v, gb, _ in points} == {("eager", 30.0), ("best-kernels", 25.0)}
    label, points = memory.time_against_memory(run, "100M", data.steps(run)["100M"])
    assert label.startswith("extra memory of one step call")
    assert {(v, gb) for v, gb, _ in points} == {("eager", 7.0), ("checkpoint", 3.0)}
    ms = {v: m for v, _, m in points}
    assert ms["checkpoint"] == data.step_ms(data.steps(run)["100M"]["checkpoint"])


def test_memory_page_draws_the_trade_then_the_table(history):
    chart, table, note = site.memory_parts(history)
    fig = chart.figure()
    assert [ax.get_title() for ax in fig.axes] == ["100M @ fffffff1", "1B @ fffffff1"]
    drawn = [ax.get_legend_handles_labels()[1] for ax in fig.axes]
    # 100M: no cuda-graph point; 1B: best-kernels among the others
    assert drawn == [["eager", "checkpoint"], ["other steps", "eager"]]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["eager", "checkpoint", "other steps"]
    assert "<td>cuda-graph</td><td>–</td>" in table and "†" in note


def test_an_earlier_meters_case_peak_is_marked(history):
    """Mutation: a case peak measured before the meter's version 2 (which read a step after a CUDA
    graph case low) shown as if measured the current way."""
    run = history[-1]
    rec = data.steps(run)["1B"]["eager"]
    earlier = dataclasses.replace(rec, memory=dataclasses.replace(rec.memory, meter=None))
    assert memory.step_memory(run, "1B", "eager", earlier).cell() == "30.0°"
    assert memory.step_memory(run, "1B", "eager", rec).cell() == "30.0"


def test_the_index_headline_shows_the_fastest_steps_memory(history):
    """The fastest at 1B, best-kernels, is graphed and has a case peak: shown; at 100M the fastest,
    cuda-graph, has none: '–', never its per-call 512 bytes."""
    rows = {row[0]: row for row in dashboard.headline_rows(history)}
    eager = data.step_ms(data.steps(history[-1])["1B"]["eager"])
    best = data.step_ms(data.steps(history[-1])["1B"]["best-kernels"])
    assert rows["1B @ fffffff1"][1:] == [
        "best-kernels",
        rows["1B @ fffffff1"][2],
        f"{eager / best:.2f}×",
        "n/a",
        "25.0",
    ]
    assert rows["100M @ fffffff1"][1] == "cuda-graph" and rows["100M @ fffffff1"][5] == "–"


def test_a_figure_under_a_tenth_of_a_gb_is_shown_in_named_mb_not_as_zero():
    """A tiny step's few MB read 0.0 in a GB column."""
    tiny = memory.StepMemory(12.4e6, memory.PER_CALL, None, graphed=False)
    assert tiny.cell() == "12 MB†"
    assert dataclasses.replace(tiny, measured=1.54e9, kind=memory.CASE).cell() == "1.5"
    assert dataclasses.replace(tiny, estimate=5e7).estimate_cell() == "50 MB"  # as its figure
