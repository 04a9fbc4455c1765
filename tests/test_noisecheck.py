"""optbench.gate.noisecheck on synthetic stores in tmp_path (test data, not measurements): held-out
A/A pairs, plants, exit codes."""

from __future__ import annotations

import math
import random

import pytest
from synthetic_results import commit, record, samples, save

from optbench.core.store import ResultStore
from optbench.gate import noisecheck as nc
from optbench.gate.compare import ALPHA, Change, Noise, Summary

SHAPES = ["8192x768", "16384x768"]
SLOW_KEY = "bench_kernels.RMSNorm|shape=16384x768|impl=triton"


def kernels(seed: int, run_sd: float, slow: float = 1.0, hungry: float = 1.0) -> list[dict]:
    """RMSNorm records of one run, every time jittered by one run-to-run factor (relative sd
    ``run_sd``); the 16384x768 triton kernel ``slow`` times longer, its peak memory ``hungry`` times
    larger."""
    jitter = 1 + random.Random(seed).gauss(0, run_sd)
    out = []
    for i, shape in enumerate(SHAPES):
        for j, impl in enumerate(("eager", "triton")):
            odd = (shape, impl) == ("16384x768", "triton")
            ms = jitter * (1.0 + i) / (1 + j) * (slow if odd else 1)
            out.append(
                record(
                    "bench_kernels.RMSNorm",
                    {"shape": shape, "impl": impl},
                    times={
                        "fwd": (
                            samples(ms, seed + i + j, rel_sd=0.002),
                            samples(ms + 0.02, seed - i - j, rel_sd=0.002),
                        )
                    },
                    peak={"fwd": 2**20 * (1 + i) * (hungry if odd else 1)},
                    info={"device_clock": "cold-l2"},
                )
            )
    return out


def aa_store(root, commits: int = 5, run_sd: float = 0.003) -> ResultStore:
    """``commits`` commits of two runs each on one GPU."""
    store = ResultStore(root)
    for n in range(1, commits + 1):
        for r in range(2):
            save(
                store,
                "h100-sxm",
                commit(n),
                f"2025-01-0{n}T0{r}:00:00+00:00",
                kernels(10 * n + r, run_sd),
            )
    return store


def run_main(store: ResultStore, *args: str) -> int:
    return nc.main(["--results", str(store.root), *args])


def test_nothing_to_check_exits_2(tmp_path, capsys):
    empty = ResultStore(tmp_path / "empty")
    assert run_main(empty) == 2
    assert "nothing checked" in capsys.readouterr().err
    store = aa_store(tmp_path / "results")
    assert run_main(store, "--machine", "h200") == 2
    assert "no stored runs of machine h200" in capsys.readouterr().err
    single = ResultStore(tmp_path / "single")  # one run per commit: no A/A pair
    for n in (1, 2, 3):
        save(single, "h100-sxm", commit(n), f"2025-01-0{n}T00:00:00+00:00", kernels(n, 0.003))
    assert run_main(single) == 2


def test_held_out_pairs_raise_no_alarm_and_catch_the_plants(tmp_path, capsys):
    """Five commits of two quiet runs (0.3% apart) on one GPU: each pair, held out, is judged on the
    noise of the other four (4 degrees of freedom); nothing flags, every plant is caught."""
    store = aa_store(tmp_path / "results")
    a = nc.audit(store, "h100-sxm")
    assert a.pairs == 5 and a.gpus == {"GPU-00000000-0000-0000-0000-000000000001"}
    assert a.false_alarms == [] and a.missed == []
    assert a.aa_judged == 5 * 4 * 2  # device time and peak memory of 4 records
    assert a.planted[1.15] == {"device-bound": 20, "memory": 20}
    assert a.caught[1.15] == a.planted[1.15]
    assert a.planted[1.05] == {"device-bound": 20} and a.caught[1.05] == a.planted[1.05]
    assert run_main(store) == 0
    out = capsys.readouterr().out
    assert "0 false alarms in 40 gated verdicts" in out and "device-bound 20 of 20 (100%)" in out


def test_a_false_alarm_on_a_held_out_pair_exits_1(tmp_path, capsys):
    """One commit whose second run is 30% slower at one kernel (what a flaky machine would do): the
    A/A comparison of that held-out pair flags it and the check fails. So does a second run of one
    commit with 5% more peak memory, while every plant is caught."""
    store = aa_store(tmp_path / "results")
    save(store, "h100-sxm", commit(9), "2025-01-09T00:00:00+00:00", kernels(90, 0.003))
    save(store, "h100-sxm", commit(9), "2025-01-09T01:00:00+00:00", kernels(91, 0.003, slow=1.3))
    a = nc.audit(store, "h100-sxm")
    assert len(a.false_alarms) == 1 and SLOW_KEY in a.false_alarms[0]
    assert run_main(store) == 1

    hungry = aa_store(tmp_path / "hungry")
    save(
        hungry, "h100-sxm", commit(9), "2025-01-09T01:00:00+00:00", kernels(91, 0.003, hungry=1.05)
    )
    save(hungry, "h100-sxm", commit(9), "2025-01-09T00:00:00+00:00", kernels(90, 0.003))
    a = nc.audit(hungry, "h100-sxm")
    assert a.missed == [] and len(a.false_alarms) == 1 and "fwd peak memory" in a.false_alarms[0]
    assert run_main(hungry) == 1
    assert f"false alarm: {commit(9)[:8]}" in capsys.readouterr().out


def test_the_pair_is_held_out_of_the_fit(tmp_path):
    """Three commits of two runs: without the pair, two degrees of freedom remain, under MIN_DF, so
    no time is judged (a fit that kept the pair would have three and judge them)."""
    a = nc.audit(aa_store(tmp_path / "results", commits=3), "h100-sxm")
    assert a.pairs == 3 and a.blind["device-bound"] == 3 * 4
    assert a.planted[1.05]["device-bound"] == 0 and a.planted[1.15]["memory"] == 3 * 4


def test_a_plant_missed_where_required_exits_1(tmp_path, capsys):
    """Runs 3% apart: a 5% plant of a device-bound time is not caught, and the check says so."""
    store = aa_store(tmp_path / "results", commits=6, run_sd=0.03)
    a = nc.audit(store, "h100-sxm")
    assert a.false_alarms == [] and a.caught[1.05]["device-bound"] < a.planted[1.05]["device-bound"]
    assert a.missed and all(m.startswith("1.05x") for m in a.missed)
    assert run_main(store) == 1
    assert "missed 1.05x" in capsys.readouterr().out


def test_planted_scales_times_memory_and_compile(tmp_path):
    store = aa_store(tmp_path / "results", commits=1)
    run = store.runs("h100-sxm", commit(1))[0]
    key = next(iter(run.results()))
    run.records[key]["compile_seconds"] = 10.0
    slow = nc.planted(run, 1.5)
    rec, old = slow.records[key], run.records[key]
    device = rec["metrics"]["fwd"]["device"]["median_ms"]
    assert device == 1.5 * old["metrics"]["fwd"]["device"]["median_ms"]
    assert rec["peak_mem_bytes"]["fwd"] == 1.5 * old["peak_mem_bytes"]["fwd"]
    assert rec["compile_seconds"] == 15.0 and old["compile_seconds"] == 10.0
    assert slow.commit == f"planted-{commit(1)}" and slow.info == run.info


def _change(sigma: float, df: int, detectable: float, runs=(1, 1), quantity="time") -> Change:
    summary = Summary(1.0, 1.0, 1.0)
    return Change(
        "h100-sxm", commit(1), commit(1), SLOW_KEY, "bench_kernels.RMSNorm", {}, "fwd", quantity,
        "device", summary, summary, 1.0, False, False, False, runs=runs,
        noise=Noise(sigma, df) if quantity == "time" else None, detectable=detectable,
    )  # fmt: skip


def test_the_alarm_probability_is_the_two_sided_tail_beyond_the_detectable_change():
    """A verdict whose detectable change sits at the t quantile of 1 - ALPHA raises an A/A alarm
    with chance 2 ALPHA (slower or faster); a detectable change held up by the class threshold,
    less; more runs, less; peak memory (no noise model), none. Mutation: one tail (ALPHA) or the
    runs left out of the scale fail."""
    from scipy import stats

    sigma, df = 0.01, 40
    edge = math.expm1(stats.t.ppf(1 - ALPHA, df) * sigma * math.sqrt(2))
    assert nc.alarm_probability(_change(sigma, df, edge)) == pytest.approx(2 * ALPHA, rel=1e-6)
    assert nc.alarm_probability(_change(sigma, df, 0.10)) < 1e-6
    assert nc.alarm_probability(_change(sigma, df, edge, runs=(4, 4))) < 1e-6
    assert nc.alarm_probability(_change(sigma, df, 0.01, quantity="peak memory")) == 0.0


def test_the_report_sets_the_alarms_seen_beside_those_the_model_expects(tmp_path, capsys):
    """The A/A line says how many false alarms the noise model expects and the chance of seeing at
    least as many: a quiet store expects few and sees none; one planted flaky run is an alarm the
    model gives a small chance. Mutation: an expectation left at 0, or a chance of 1 for a seen
    alarm, fails."""
    assert nc._calibration(0, 0.5) == "the noise model expects 0.50 (P(at least 0) = 1)"
    assert nc._calibration(1, 0.5) == f"the noise model expects 0.50 (P(at least 1) = {0.3935:.2g})"
    store = aa_store(tmp_path / "results", run_sd=0.01)
    quiet = nc.audit(store, "h100-sxm")
    assert 0 < quiet.expected < 1
    save(store, "h100-sxm", commit(9), "2025-01-09T00:00:00+00:00", kernels(90, 0.003))
    save(store, "h100-sxm", commit(9), "2025-01-09T01:00:00+00:00", kernels(91, 0.003, slow=1.3))
    flaky = nc.audit(store, "h100-sxm")
    assert len(flaky.false_alarms) == 1 and flaky.expected < 0.5
    assert run_main(store) == 1
    out = capsys.readouterr().out
    assert f"1 false alarms in {flaky.aa_judged} gated verdicts; the noise model expects" in out
