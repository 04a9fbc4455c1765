"""optbench.gate.noisecheck on synthetic stores in tmp_path (test data, not measurements): held-out
A/A pairs, plants, exit codes."""

from __future__ import annotations

import math
import random

import pytest
from synthetic_results import commit, record, samples, save

from optbench.gate import noisecheck as nc
from optbench.gate.compare import ALPHA, Change, Noise, Summary
from optbench.store.records import CASE_METER, CASE_PEAK, CASE_RESIDENT, Record
from optbench.store.store import ResultStore

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
    assert (
        capsys.readouterr().out
        == "h100-sxm: nothing checked: no two runs of one commit on one GPU\n"
    )


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


def flaky_store(root, hungry_records: int) -> ResultStore:
    """The quiet store and one commit whose second run holds 5% more peak memory in
    ``hungry_records`` of its records: that many false alarms when the pair is held out, and no
    time noise added to the other pairs' fits."""
    store = aa_store(root)
    save(store, "h100-sxm", commit(9), "2025-01-09T00:00:00+00:00", kernels(90, 0.003))
    flaky = kernels(91, 0.003)
    for rec in flaky[:hungry_records]:
        rec["peak_mem_bytes"] = {m: 1.05 * v for m, v in rec["peak_mem_bytes"].items()}
    save(store, "h100-sxm", commit(9), "2025-01-09T01:00:00+00:00", flaky)
    return store


def test_false_alarms_beyond_those_allowed_exit_1(tmp_path, capsys):
    """A quiet store's noise model expects under 1.5 false alarms, so 3 are allowed: a flaky pair
    with 3 alarms passes, one with 4 fails, and the console leads with the verdict. Mutation: no
    alarm allowed, or a strict bound (<), fails."""
    within = nc.audit(flaky_store(tmp_path / "within", 3), "h100-sxm")
    assert within.expected < 1.5 and within.alarms_allowed == 3
    assert len(within.false_alarms) == 3 and within.missed == [] and within.ok
    assert all(commit(9)[:8] in x for x in within.false_alarms)
    assert run_main(flaky_store(tmp_path / "within2", 3)) == 0
    required = 6 * 4 * 3  # pairs x records x (1.15x device time and memory, 1.05x device time)
    assert capsys.readouterr().out.startswith(
        f"h100-sxm: target met: 3 false alarms, at most 3.00 allowed; 0 of {required} required "
        "plants missed\n"
    )
    beyond = nc.audit(flaky_store(tmp_path / "beyond", 4), "h100-sxm")
    assert len(beyond.false_alarms) == 4 and beyond.missed == [] and not beyond.ok
    assert run_main(flaky_store(tmp_path / "beyond2", 4)) == 1
    out = capsys.readouterr().out
    assert out.startswith(
        f"h100-sxm: target missed: 4 false alarms, over 3.00 allowed; 0 of {required} required "
        "plants missed\n"
    )
    assert f"false alarm: {commit(9)[:8]}" in out


def test_the_alarms_allowed_are_twice_those_expected_above_one_and_a_half():
    """max(3, 2 x expected): at 1.0 expected, 3 pass and 4 fail; at 2.5, 5 pass and 6 fail; a
    missed plant fails whatever the alarms. Mutation: 2 x expected alone, or 3 alone, fails."""
    alarms = ["x"] * 6
    assert nc.Audit("m", expected=1.0, false_alarms=alarms[:3]).ok
    assert not nc.Audit("m", expected=1.0, false_alarms=alarms[:4]).ok
    assert nc.Audit("m", expected=2.5, false_alarms=alarms[:5]).ok
    assert not nc.Audit("m", expected=2.5, false_alarms=alarms[:6]).ok
    assert not nc.Audit("m", expected=2.5, missed=["1.05x: y"]).ok


def test_a_peak_memory_alarm_counts_as_a_false_alarm(tmp_path, capsys):
    """A second run of one commit with 5% more peak memory is a false alarm (one, within those
    allowed), while every plant is caught."""
    hungry = aa_store(tmp_path / "hungry")
    save(
        hungry, "h100-sxm", commit(9), "2025-01-09T01:00:00+00:00", kernels(91, 0.003, hungry=1.05)
    )
    save(hungry, "h100-sxm", commit(9), "2025-01-09T00:00:00+00:00", kernels(90, 0.003))
    a = nc.audit(hungry, "h100-sxm")
    assert a.missed == [] and len(a.false_alarms) == 1 and "fwd peak memory" in a.false_alarms[0]
    assert run_main(hungry) == 0
    assert f"1 false alarms in {a.aa_judged} gated verdicts, at most" in capsys.readouterr().out


def test_the_pair_is_held_out_of_the_fit(tmp_path):
    """Three commits of two runs: without the pair, two degrees of freedom remain, under MIN_DF, so
    no time is judged (a fit that kept the pair would have three and judge them)."""
    a = nc.audit(aa_store(tmp_path / "results", commits=3), "h100-sxm")
    assert a.pairs == 3 and a.blind["device-bound"] == 3 * 4
    assert a.planted[1.05]["device-bound"] == 0 and a.planted[1.15]["memory"] == 3 * 4


def test_a_plant_missed_where_required_exits_1(tmp_path, capsys):
    """Runs 3% apart: 5% plants of device-bound times are not caught, nor all 15% ones, with no
    false alarm, and the check fails saying so. Mutation: misses left out of the exit code, or
    device-bound left out of the classes required at 1.05x, fails."""
    store = aa_store(tmp_path / "results", commits=6, run_sd=0.03)
    a = nc.audit(store, "h100-sxm")
    uncaught = a.planted[1.05]["device-bound"] - a.caught[1.05]["device-bound"]
    assert a.false_alarms == [] and uncaught > 0
    assert sum(m.startswith("1.05x") for m in a.missed) == uncaught
    assert run_main(store) == 1
    out = capsys.readouterr().out
    required = sum(a.planted[1.15].values()) + a.planted[1.05]["device-bound"]  # kernels only
    assert out.startswith(
        f"h100-sxm: target missed: 0 false alarms, at most 3.00 allowed; {len(a.missed)} of "
        f"{required} required plants missed\n"
    )
    assert "missed 1.05x" in out


def with_case_memory(records: list[dict]) -> list[dict]:
    """``records`` with a case memory (:class:`optbench.store.records.CaseMemory`) each."""
    memory = {
        "peak_bytes": 3 * 2**30,
        "resident_bytes": 2**30,
        "reserved_peak_bytes": 4 * 2**30,
        "held_before_bytes": 2**20,
        "meter": CASE_METER,
    }
    return [{**r, "memory": dict(memory)} for r in records]


def test_planted_scales_times_memory_and_compile(tmp_path):
    """Every time, every peak the gate judges (a call's, the case's own peak and resident bytes)
    and compile seconds grow by the factor; what the gate does not judge stays. Mutation: the case
    memory left out of the plant fails."""
    store = ResultStore(tmp_path / "results")
    save(store, "h100-sxm", commit(1), "2025-01-01T00:00:00+00:00", with_case_memory(kernels(1, 0)))
    run = store.runs("h100-sxm", commit(1))[0]
    key = next(iter(run.results()))
    run.records[key]["compile_seconds"] = 10.0
    slow = nc.planted(run, 1.5)
    rec, old = slow.records[key], run.records[key]
    device = rec["metrics"]["fwd"]["device"]["median_ms"]
    assert device == 1.5 * old["metrics"]["fwd"]["device"]["median_ms"]
    peaks, before = Record.of(rec).peaks(), Record.of(old).peaks()
    assert set(peaks) == {"fwd", CASE_PEAK, CASE_RESIDENT}
    assert peaks == {name: 1.5 * value for name, value in before.items()}
    assert rec["memory"]["reserved_peak_bytes"] == old["memory"]["reserved_peak_bytes"]
    assert rec["memory"]["held_before_bytes"] == old["memory"]["held_before_bytes"]
    assert rec["compile_seconds"] == 15.0 and old["compile_seconds"] == 10.0
    assert slow.commit == f"planted-{commit(1)}" and slow.info == run.info


def test_a_case_memory_plant_is_required_and_caught(tmp_path):
    """Runs whose records hold a case memory: each pair's case peak and resident bytes are judged
    beside the call's peak, in the memory class, and their 1.15x plants are caught. Mutation: the
    case memory left out of the plant misses them (exit 1)."""
    store = ResultStore(tmp_path / "results")
    for n in range(1, 6):
        for r in range(2):
            records = with_case_memory(kernels(10 * n + r, 0.003))
            save(store, "h100-sxm", commit(n), f"2025-01-0{n}T0{r}:00:00+00:00", records)
    a = nc.audit(store, "h100-sxm")
    assert a.pairs == 5 and a.false_alarms == [] and a.missed == []
    assert a.planted[1.15]["memory"] == 5 * 4 * 3 == a.caught[1.15]["memory"]
    assert run_main(store) == 0


def steps(seed: int, run_sd: float) -> list[dict]:
    """One host-bound step record (the 100M eager step) of one run, jittered by one run-to-run
    factor of relative sd ``run_sd``."""
    ms = 70.0 * (1 + random.Random(seed).gauss(0, run_sd))
    times = {"step": (samples(ms * 0.98, seed, rel_sd=0.01), samples(ms, seed + 1, rel_sd=0.01))}
    return [record("bench_step.Step100M", {"variant": "eager"}, times=times)]


def test_host_bound_catches_are_a_trend_not_required(tmp_path, capsys):
    """Quiet kernels beside a host-bound step whose runs move by 5%, on a GPU machine: the
    comparison reports the step's times, never gates them (compare.HOST_BOUND), so neither its
    noise nor its plants are judged, and the check passes on the kernels."""
    store = ResultStore(tmp_path / "results")
    for n in range(1, 7):
        for r in range(2):
            seed = 10 * n + r
            records = kernels(seed, 0.003) + steps(seed, 0.05)
            save(store, "h100-sxm", commit(n), f"2025-01-0{n}T0{r}:00:00+00:00", records)
    a = nc.audit(store, "h100-sxm")
    assert a.false_alarms == [] and a.missed == []
    assert a.planted[1.15]["host-bound"] == a.caught[1.15]["host-bound"] == 0
    assert a.caught[1.15]["device-bound"] == a.planted[1.15]["device-bound"] == 6 * 4
    assert run_main(store) == 0
    out = capsys.readouterr().out
    assert "trend, not required (ab's lockstep rounds decide host-bound changes): none" in out


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
    least as many: a quiet store expects few and sees none; a flaky run's peak memory is an alarm
    the model gives a small chance, within those allowed. Mutation: an expectation left at 0, or a
    chance of 1 for a seen alarm, fails."""
    assert nc._calibration(0, 0.5) == "the noise model expects 0.50 (P(at least 0) = 1)"
    assert nc._calibration(1, 0.5) == f"the noise model expects 0.50 (P(at least 1) = {0.3935:.2g})"
    store = aa_store(tmp_path / "results", run_sd=0.01)
    quiet = nc.audit(store, "h100-sxm")
    assert 0 < quiet.expected < 1
    store = flaky_store(tmp_path / "flaky", 1)
    flaky = nc.audit(store, "h100-sxm")
    assert len(flaky.false_alarms) == 1 and flaky.expected < 0.5
    assert run_main(store) == 0
    out = capsys.readouterr().out
    assert (
        f"1 false alarms in {flaky.aa_judged} gated verdicts, at most max(3, 2 x expected) = "
        f"3.00 allowed; the noise model expects {flaky.expected:.2f} (P(at least 1) = "
    ) in out
