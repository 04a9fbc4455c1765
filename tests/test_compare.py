"""optbench.gate.compare on synthetic stores in tmp_path (test data, not measurements)."""

from __future__ import annotations

import random

import pytest
from synthetic_results import commit, record, samples, save

from optbench.core.records import Record
from optbench.core.store import ResultStore
from optbench.gate import compare as cmp

BASE, HEAD = commit(1), commit(2)
SHAPES = ["8192x768", "16384x768", "16384x4096"]
IMPLS = ["eager", "triton"]
MiB = 2**20


def kernels(seed: int, slower: tuple[str, str] | None = None, peak_scale: float = 1.0, level: float = 1.0,
            run_sd: float = 0.01) -> list[dict]:
    """RMSNorm records of one run: times jittered by a run-to-run factor (relative sd ``run_sd``, drawn from
    ``seed``) times ``level``; the (shape, impl) ``slower`` takes 10% longer by both clocks."""
    jitter = level * (1 + random.Random(seed).gauss(0, run_sd))
    out = []
    for i, shape in enumerate(SHAPES):
        for j, impl in enumerate(IMPLS):
            ms = jitter * (1.0 + i) / (1 + j)
            scale = 1.1 if (shape, impl) == slower else 1.0
            times = {m: (samples(ms * scale * f, seed + 7 * i + j, rel_sd=0.002),
                         samples(ms * scale * f + 0.02, seed - i - j, rel_sd=0.002))
                     for m, f in (("fwd", 1.0), ("fwdbwd", 3.0))}
            peak = int(100 * MiB * (1 + i) * (peak_scale if impl == "triton" else 1.0))
            out.append(record("bench_kernels.RMSNorm", {"shape": shape, "impl": impl}, times=times,
                              peak={"fwdbwd": peak}, info={"device_clock": "cold-l2"}))
    return out


def history(store: ResultStore, commits: int = 6, runs: int = 2, level=lambda n: 1.0) -> None:
    """Earlier commits of the same kernels, each with ``runs`` runs (dates before BASE's)."""
    for n in range(10, 10 + commits):
        for r in range(runs):
            save(store, "h100-sxm", commit(n), f"2024-12-{n:02d}T0{r}:00:00+00:00",
                 kernels(100 * n + r, level=level(n)))


def step(seed: int, status: str = "ok") -> dict:
    """A CPU step record: wall clock is primary and there is no device time."""
    return record("bench_step.StepTiny", {"variant": "eager"}, status=status,
                  times={"step": (None, samples(50.0, seed))}, peak={"step": 0},
                  info={"primary_clock": "wall", "tokens": 512})


@pytest.fixture
def store(tmp_path) -> ResultStore:
    return ResultStore(tmp_path / "results")


def write(store: ResultStore, base: list[dict], head: list[dict], machine: str = "h100-sxm") -> None:
    save(store, machine, BASE, "2025-01-01T00:00:00+00:00", base)
    save(store, machine, HEAD, "2025-01-02T00:00:00+00:00", head)


def run_main(store: ResultStore, *args: str) -> int:
    return cmp.main([BASE[:10], HEAD[:10], "--results", str(store.root), *args])


def test_aa_flags_nothing(store, capsys):
    write(store, kernels(0), kernels(1000))
    changes = cmp.compare(store, BASE, HEAD)
    assert len(changes) == len(SHAPES) * len(IMPLS) * 5  # fwd and fwdbwd by two clocks, peak memory
    assert not [c for c in changes if c.significant]
    assert {c.clock for c in changes if c.quantity == "time"} == {"device", "wall"}
    assert run_main(store) == 0
    assert "no change beyond" in capsys.readouterr().out


def test_without_history_the_prior_noise_hides_a_ten_percent_change(store, capsys):
    """One run a side and no history: each run may be 5% off (PRIOR_SIGMA), so 10% is not evidence."""
    write(store, kernels(0), kernels(1000, slower=("16384x768", "triton")))
    changes = [c for c in cmp.compare(store, BASE, HEAD) if c.quantity == "time"]
    assert not [c for c in changes if c.regression]
    assert all(c.noise.source == "prior" and c.detectable > 0.2 for c in changes)
    assert run_main(store) == 0
    assert "noise from prior 24" in capsys.readouterr().out


def test_ten_percent_slower_is_a_regression_in_that_key_only(store, capsys):
    history(store)
    slow = ("16384x768", "triton")
    write(store, kernels(0), kernels(1000, slower=slow))
    changes = cmp.compare(store, BASE, HEAD)
    flagged = [c for c in changes if c.significant]
    assert {c.key for c in flagged} == {"bench_kernels.RMSNorm|shape=16384x768|impl=triton"}
    assert {(c.metric, c.clock) for c in flagged} == {(m, k) for m in ("fwd", "fwdbwd") for k in ("device", "wall")}
    assert all(1.05 < c.ratio < 1.15 and c.noise.source == "own" and c.detectable < 0.1 for c in flagged)
    assert all(c.base.q25 <= c.base.median <= c.base.q75 for c in flagged)
    gated = [c for c in flagged if c.gated]
    assert {c.clock for c in gated} == {"device"} and all(c.regression and not c.improvement for c in gated)
    assert [cmp.verdict(c) for c in flagged if not c.gated] == ["slower (not gated)"] * 2
    assert run_main(store) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "16384x768" in out and "2 regressions" in out


def test_a_kernels_host_wall_time_is_reported_not_gated(store, capsys):
    """A kernel whose host launch time doubles while its device time holds (two lent machines, one code) passes
    the gate and is listed as slower; a step's wall time (its primary clock) still gates."""
    history(store)
    base = kernels(0)
    head = kernels(1000)
    for rec in head:
        wall = rec["metrics"]["fwd"]["wall"]
        wall.update(median_ms=wall["median_ms"] * 2, samples_ms=[x * 2 for x in wall["samples_ms"]])
    write(store, base, head)
    changes = [c for c in cmp.compare(store, BASE, HEAD) if c.significant]
    assert changes and all(c.clock == "wall" and not c.gated and not c.regression for c in changes)
    assert run_main(store) == 0
    assert "slower (not gated)" in capsys.readouterr().out
    assert cmp.gated_clock(Record.of({"info": {"primary_clock": "wall"}}), "wall")


def test_a_real_change_in_history_is_not_counted_as_noise(store):
    """History whose kernels got 30% faster half-way: the step detection cuts it there, so the run-to-run
    noise stays ~1% and a 10% slowdown is still caught."""
    history(store, commits=8, level=lambda n: 1.3 if n < 14 else 1.0)
    write(store, kernels(0), kernels(1000, slower=("16384x768", "triton")))
    flagged = {c.key for c in cmp.compare(store, BASE, HEAD) if c.regression}
    assert flagged == {"bench_kernels.RMSNorm|shape=16384x768|impl=triton"}
    fitted = cmp.NoiseModel.of(cmp.history_runs(store, "h100-sxm")).noise(
        ("bench_kernels.RMSNorm|shape=8192x768|impl=eager", "fwd", "device"))
    assert fitted.source == "own" and fitted.sigma < 0.03


def test_runs_add_up_and_an_aa_comparison_of_one_commit(store):
    history(store)
    for r in range(3):
        save(store, "h100-sxm", HEAD, f"2025-01-02T0{r}:00:00+00:00", kernels(2000 + r))
    one = cmp.compare(store, HEAD, HEAD, head_runs=["run-2025-01-02T00"])
    assert one and {c.runs for c in one if c.quantity == "time"} == {(2, 1)}
    assert not [c for c in one if c.significant]
    key = ("bench_kernels.RMSNorm|shape=8192x768|impl=eager", "fwd", "device")
    noise = cmp.NoiseModel.of(cmp.history_runs(store, "h100-sxm")).noise(key)
    assert noise.detectable(3, 3, 0.0) < noise.detectable(1, 1, 0.0)


def test_faster_is_an_improvement_and_passes(store):
    history(store)
    write(store, kernels(0, slower=("8192x768", "eager")), kernels(1000))
    flagged = [c for c in cmp.compare(store, BASE, HEAD) if c.significant]
    assert flagged and all(c.improvement == c.gated and not c.regression for c in flagged)
    assert {c.clock for c in flagged if c.improvement} == {"device"}
    assert run_main(store) == 0


def test_peak_memory_growth_is_flagged(store):
    write(store, kernels(0), kernels(1000, peak_scale=1.10))
    flagged = [c for c in cmp.compare(store, BASE, HEAD) if c.significant]
    assert flagged and {c.quantity for c in flagged} == {"peak memory"}
    assert all(c.params["impl"] == "triton" and c.regression and c.ratio == pytest.approx(1.1, rel=1e-3)
               for c in flagged)
    assert not [c for c in cmp.compare(store, BASE, HEAD, threshold=0.2) if c.significant]
    assert run_main(store) == 1


def test_ok_to_oom_is_a_regression_and_skipped_twice_is_silent(store, capsys):
    skipped = record("bench_kernels.SwiGLU", {"shape": "8192x2048", "impl": "liger"}, status="skipped")
    write(store, [step(0), skipped], [step(1, status="oom"), skipped], machine="cpu-host")
    changes = cmp.compare(store, BASE, HEAD)
    assert [(c.quantity, c.base_status, c.head_status, c.regression) for c in changes] == [
        ("status", "ok", "oom", True)]
    assert run_main(store) == 1
    assert "oom" in capsys.readouterr().out


def test_wall_clock_when_device_time_is_null(store):
    write(store, [step(0)], [step(1)], machine="cpu-host")
    (time, memory) = cmp.compare(store, BASE, HEAD)
    assert (time.quantity, time.clock, time.metric) == ("time", "wall", "step")
    assert memory.quantity == "peak memory" and memory.ratio == 1.0 and not memory.significant


def test_missing_result_is_reported_but_does_not_fail(store, capsys):
    write(store, kernels(0), kernels(1000)[1:])
    missing = [c for c in cmp.compare(store, BASE, HEAD) if c.head_status == cmp.MISSING]
    assert len(missing) == 1 and not missing[0].significant
    assert run_main(store) == 0
    assert "1 results of the base commit are missing" in capsys.readouterr().out


def test_machine_filter_and_all(store, capsys):
    write(store, kernels(0), kernels(1000, slower=("8192x768", "eager")))
    write(store, [step(0)], [step(1)], machine="cpu-host")
    assert run_main(store, "--machine", "cpu-host", "--all") == 0
    out = capsys.readouterr().out
    assert "cpu-host" in out and "StepTiny" in out and "h100-sxm" not in out


def test_nothing_to_compare_exits_2(store, capsys):
    save(store, "h100-sxm", BASE, "2025-01-01T00:00:00+00:00", kernels(0))
    assert cmp.compare(store, BASE, HEAD) == []
    assert run_main(store) == 2
    assert "nothing to compare" in capsys.readouterr().out


def host_bound_step(median_ms: float, seed: int) -> dict:
    """A GPU step record timed by the wall clock, as the 100M eager step is."""
    return record("bench_step.Step100M", {"variant": "eager"}, times={"step": (None, samples(median_ms, seed))},
                  info={"primary_clock": "wall"})


def test_a_change_within_the_run_to_run_spread_is_not_a_regression(store, capsys):
    """Earlier runs of the step spread 30% between runs: a 20% slowdown stays within that noise, while the same
    run's 10% slower kernel (1% between runs) fails the gate."""
    for n, ms in ((3, 60.0), (4, 78.0), (5, 70.0), (6, 62.0), (7, 75.0)):  # earlier commits: 60-78 ms
        save(store, "h100-sxm", commit(n), f"2024-12-0{n}T00:00:00+00:00", [host_bound_step(ms, n), *kernels(n)])
    write(store, [host_bound_step(65.0, 1), *kernels(0)],
          [host_bound_step(78.0, 2), *kernels(1000, slower=("16384x768", "triton"))])
    changes = cmp.compare(store, BASE, HEAD)
    step = next(c for c in changes if c.key == "bench_step.Step100M|variant=eager")
    assert step.ratio > 1.19 and step.noise.sigma > 0.08 and not step.regression
    slower = "bench_kernels.RMSNorm|shape=16384x768|impl=triton"
    assert {c.key for c in changes if c.regression} == {slower}
    assert run_main(store) == 1


def test_a_run_whose_samples_drift_is_no_more_repeatable_than_they_are(store):
    """The within-run spread bounds the noise from below: a 12% change of a metric whose runs each spread
    +-10% is not a regression even with a quiet history."""
    history(store)
    wide = [record("bench_kernels.RMSNorm", {"shape": "8192x768", "impl": "eager"},
                   times={"fwd": (samples(ms, seed, rel_sd=0.1), samples(ms, seed))})
            for ms, seed in ((1.0, 1), (1.12, 2))]
    write(store, [wide[0]], [wide[1]])
    (device, wall) = [c for c in cmp.compare(store, BASE, HEAD) if c.quantity == "time"]
    assert device.noise.source == "within run" and not device.regression


def test_noise_needs_degrees_of_freedom():
    model = cmp.NoiseModel({("k|a=1", "step", "wall"): (0.01, 1)})
    assert model.noise(("k|a=1", "step", "wall")) == cmp.PRIOR
    fitted = {("k|a=1", "step", "wall"): (0.01, 1), ("k|a=2", "step", "wall"): (0.03, 3),
              ("k|a=3", "step", "wall"): (0.02, 2), ("k|a=4", "step", "wall"): (5.0, 1)}  # a=4: a change
    model = cmp.NoiseModel(fitted)
    assert model.noise(("k|a=1", "step", "wall")) == cmp.Noise(0.1, 4, "benchmark")  # the median, not a=4's
    assert model.noise(("k|a=2", "step", "wall")) == cmp.Noise(0.1, 3, "own")
    kernel = cmp.NoiseModel({("r|s=1", "fwd", "device_warm"): (0.03, 3), ("r|s=1", "fwd", "device"): (0.0, 1)})
    assert kernel.noise(("r|s=1", "fwd", "device")) == cmp.Noise(0.1, 3, "other clock")


def test_a_device_clock_that_measures_another_thing_is_not_gated(store, capsys):
    """Records of the cold-L2 method (info.device_clock) against older warm-L2 ones: the device clocks are
    listed as not compared, the wall clocks are still reported."""
    history(store)
    warm = [{**r, "info": {}} for r in kernels(0)]  # kernel records from before device_clock
    cold = kernels(1000, level=1.5)
    write(store, warm, cold)
    changes = [c for c in cmp.compare(store, BASE, HEAD) if c.quantity == "time"]
    assert {c.clock for c in changes if c.method_changed} == {"device"}
    assert not [c for c in changes if c.method_changed and c.significant]
    assert {c.clock for c in changes if c.significant} == {"wall"}
    assert all(cmp.verdict(c) == "slower (not gated)" for c in changes if c.significant)
    run_main(store)
    assert "12 time metrics are not compared" in capsys.readouterr().out


def test_another_machine_is_compared_labelled_and_never_gated(store, capsys):
    """Base on the H100, head on an H200 that is 30% faster at one kernel and 10% slower at another: every
    change is reported, none gates, and the title says it is a cross-machine comparison."""
    history(store)
    save(store, "h100-sxm", BASE, "2025-01-01T00:00:00+00:00", kernels(0))
    save(store, "h200", HEAD, "2025-01-02T00:00:00+00:00", kernels(1000, level=0.7, slower=("8192x768", "eager")))
    changes = cmp.compare(store, BASE, HEAD, ["h200"], base_machine="h100-sxm")
    times = [c for c in changes if c.quantity == "time"]
    assert times and all(c.base_machine == "h100-sxm" and not c.gated for c in times)
    assert any(c.significant for c in times) and not [c for c in changes if c.regression or c.improvement]
    assert cmp.main([BASE[:10], HEAD[:10], "--results", str(store.root), "--machine", "h200",
                     "--base-machine", "h100-sxm"]) == 0
    assert "CROSS-MACHINE, not gated: h100-sxm" in capsys.readouterr().out
    assert cmp.compare(store, BASE, HEAD, ["h200"]) == []  # without --base-machine nothing mixes machines
