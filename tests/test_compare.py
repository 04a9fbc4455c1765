"""optbench.gate.compare on synthetic stores in tmp_path (test data, not measurements).

Each statistic and exit code has a planted case that a wrong rule fails: noise pooled across GPUs,
noise from the spread inside one run, a prior for metrics without history, one threshold for every
class, refs looked up without their measured code commit.
"""

from __future__ import annotations

import math
import random
import statistics
import subprocess

import pytest
from synthetic_results import GPU, commit, record, samples, save, slower

from optbench.gate import compare as cmp
from optbench.store.records import EARLIER_METER
from optbench.store.store import ResultStore

BASE, HEAD = commit(1), commit(2)
OTHER_GPU = "GPU-00000000-0000-0000-0000-000000000002"
SHAPES = ["8192x768", "16384x768", "16384x4096"]
IMPLS = ["eager", "triton"]
SLOW = ("16384x768", "triton")
SLOW_KEY = "bench_kernels.RMSNorm|shape=16384x768|impl=triton"
MiB = 2**20


def kernels(
    seed: int,
    slower: tuple[str, str] | None = None,
    peak_scale: float = 1.0,
    level: float = 1.0,
    run_sd: float = 0.01,
    scale: float = 1.2,
) -> list[dict]:
    """RMSNorm records of one run: times jittered by a run-to-run factor (relative sd ``run_sd``,
    drawn from ``seed``) times ``level``; the (shape, impl) ``slower`` takes ``scale`` times longer
    by both clocks."""
    jitter = level * (1 + random.Random(seed).gauss(0, run_sd))
    out = []
    for i, shape in enumerate(SHAPES):
        for j, impl in enumerate(IMPLS):
            ms = jitter * (1.0 + i) / (1 + j) * (scale if (shape, impl) == slower else 1.0)
            times = {
                m: (
                    samples(ms * f, seed + 7 * i + j, rel_sd=0.002),
                    samples(ms * f + 0.02, seed - i - j, rel_sd=0.002),
                )
                for m, f in (("fwd", 1.0), ("fwdbwd", 3.0))
            }
            peak = int(100 * MiB * (1 + i) * (peak_scale if impl == "triton" else 1.0))
            out.append(
                record(
                    "bench_kernels.RMSNorm",
                    {"shape": shape, "impl": impl},
                    times=times,
                    peak={"fwdbwd": peak},
                    info={"device_clock": "cold-l2"},
                )
            )
    return out


def history(
    store: ResultStore,
    commits: int = 6,
    runs: int = 2,
    level=lambda n: 1.0,
    gpu: str = GPU,
    run_sd: float = 0.01,
) -> None:
    """Earlier commits of the same kernels, each with ``runs`` runs on ``gpu`` (dates before
    BASE's): the A/A sets of the noise."""
    for n in range(10, 10 + commits):
        for r in range(runs):
            save(
                store,
                "h100-sxm",
                commit(n),
                f"2024-12-{n:02d}T0{r}:00:00+00:00",
                kernels(100 * n + r, level=level(n), run_sd=run_sd),
                gpu_uuid=gpu,
                run_id=f"{gpu}-{n}-{r}",
            )


def step(seed: int, status: str = "ok") -> dict:
    """A tiny step record: wall clock is primary and there is no device time."""
    return record(
        "bench_step.StepTiny",
        {"variant": "eager"},
        status=status,
        times={"step": (None, samples(50.0, seed))},
        peak={"step": 0},
        info={"primary_clock": "wall", "tokens": 512},
    )


@pytest.fixture
def store(tmp_path) -> ResultStore:
    return ResultStore(tmp_path / "results")


def write(
    store: ResultStore,
    base: list[dict],
    head: list[dict],
    machine: str = "h100-sxm",
    base_gpu: str = GPU,
    head_gpu: str = GPU,
) -> None:
    save(store, machine, BASE, "2025-01-01T00:00:00+00:00", base, gpu_uuid=base_gpu)
    save(store, machine, HEAD, "2025-01-02T00:00:00+00:00", head, gpu_uuid=head_gpu)


def run_main(store: ResultStore, *args: str, base: str = BASE, head: str = HEAD) -> int:
    return cmp.main([base[:10], head[:10], "--results", str(store.root), *args])


def test_aa_flags_nothing(store, capsys):
    history(store)
    write(store, kernels(0), kernels(1000))
    changes = cmp.compare(store, BASE, HEAD)
    assert len(changes) == len(SHAPES) * len(IMPLS) * 5  # fwd and fwdbwd by two clocks, peak memory
    assert not [c for c in changes if c.significant]
    assert {c.clock for c in changes if c.quantity == "time"} == {"device", "wall"}
    assert {c.gpu for c in changes} == {GPU}
    assert run_main(store) == 0
    assert "no change beyond" in capsys.readouterr().out


def test_a_slower_kernel_is_a_regression_in_that_key_only(store, capsys):
    history(store)
    write(store, kernels(0), kernels(1000, slower=SLOW))
    changes = cmp.compare(store, BASE, HEAD)
    flagged = [c for c in changes if c.significant]
    assert {c.key for c in flagged} == {SLOW_KEY}
    assert {(c.metric, c.clock) for c in flagged} == {
        (m, k) for m in ("fwd", "fwdbwd") for k in ("device", "wall")
    }
    assert all(1.15 < c.ratio < 1.25 and c.noise.df == 6 and c.detectable < 0.15 for c in flagged)
    assert all(c.base.q25 <= c.base.median <= c.base.q75 for c in flagged)
    gated = [c for c in flagged if c.gated]
    assert {c.clock for c in gated} == {"device"} and all(
        c.regression and not c.improvement for c in gated
    )
    assert [cmp.verdict(c) for c in flagged if not c.gated] == ["slower (not gated)"] * 2
    assert run_main(store) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "16384x768" in out and "2 regressions" in out


def test_without_a_noise_estimate_on_the_gpu_nothing_is_gated(store, capsys):
    """One run a side and no A/A history: a 30% slower kernel gets the verdict 'no noise estimate on
    this GPU' and passes (a prior noise would flag it)."""
    write(store, kernels(0), kernels(1000, slower=SLOW, scale=1.3))
    times = [c for c in cmp.compare(store, BASE, HEAD) if c.quantity == "time"]
    assert not [c for c in times if c.regression or c.significant]
    device = [c for c in times if c.clock == "device"]
    assert all(c.noise is None and c.reason == cmp.NO_NOISE and not c.gated for c in device)
    assert {cmp.verdict(c) for c in device} == {cmp.NO_NOISE}
    assert {cmp.verdict(c) for c in times if c.clock == "wall"} == {""}  # never gated anyway
    assert run_main(store) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"12 time metrics on h100-sxm on {GPU}: {cmp.NO_NOISE}" in out


def test_noise_needs_degrees_of_freedom_of_one_commit_on_one_gpu(store):
    """A/A sets are the runs of one commit on one GPU: two runs of one commit on two GPUs, or one
    run of each of two commits on one GPU, are no A/A set."""
    series = ("bench_kernels.RMSNorm|shape=8192x768|impl=eager", "fwd", "device")
    save(store, "h100-sxm", commit(10), "2024-12-01T00:00:00+00:00", kernels(1), gpu_uuid=GPU)
    save(store, "h100-sxm", commit(10), "2024-12-01T01:00:00+00:00", kernels(2), gpu_uuid=OTHER_GPU)
    save(store, "h100-sxm", commit(11), "2024-12-02T00:00:00+00:00", kernels(3), gpu_uuid=GPU)
    assert cmp.NoiseModel.of(store.machine_runs("h100-sxm")).fitted == {}
    for r, n in enumerate((10, 10, 11, 11)):
        save(store, "h100-sxm", commit(n), f"2024-12-03T0{r}:00:00+00:00", kernels(10 + r))
    model = cmp.NoiseModel.of(store.machine_runs("h100-sxm"))
    assert model.fitted[(GPU, series)][1] == 4  # commits 10 and 11: 3 runs each on GPU
    assert model.noise(GPU, series).df == 4 and model.noise(OTHER_GPU, series) is None
    assert cmp.NoiseModel({(GPU, series): (0.01, 2)}).noise(GPU, series) is None  # under MIN_DF


def test_noise_of_another_gpu_is_never_used(store):
    """A/A history on another GPU only: a 20% slower kernel on this GPU is not judged. Noisy history
    on another GPU (runs of one commit 30% apart) does not hide a 20% slowdown on a quiet GPU."""
    history(store, gpu=OTHER_GPU)
    write(store, kernels(0), kernels(1000, slower=SLOW))
    slow = [c for c in cmp.compare(store, BASE, HEAD) if c.key == SLOW_KEY and c.clock == "device"]
    assert slow and all(c.reason == cmp.NO_NOISE and not c.regression for c in slow)

    quiet = ResultStore(store.root.parent / "quiet")
    history(quiet, gpu=GPU, run_sd=0.003)
    history(quiet, gpu=OTHER_GPU, run_sd=0.3)
    write(quiet, kernels(0, run_sd=0.003), kernels(1000, slower=SLOW, run_sd=0.003))
    flagged = {c.key for c in cmp.compare(quiet, BASE, HEAD) if c.regression}
    assert flagged == {SLOW_KEY}


def spread(ms: float, half_width: float) -> list[float]:
    """41 samples evenly from ms * (1 - half_width) to ms * (1 + half_width): median exactly ms."""
    return [ms * (1 + half_width * (k - 20) / 20) for k in range(41)]


def wide_kernel(ms: float) -> list[dict]:
    """A kernel whose samples spread +-15% inside each run around a median of ``ms``."""
    return [
        record(
            "bench_kernels.RMSNorm",
            {"shape": "8192x768", "impl": "eager"},
            times={"fwd": (spread(ms, 0.15), spread(ms, 0.15))},
            info={"device_clock": "cold-l2"},
        )
    ]


def test_the_spread_inside_a_run_is_not_its_noise(store):
    """Runs whose samples each spread +-15% but whose medians repeat within 0.3% between runs: a 12%
    change of the median is a regression (a within-run floor on the noise would hide it)."""
    for n in range(10, 16):
        for r in range(2):
            ms = 1.0 + random.Random(10 * n + r).gauss(0, 0.003)
            save(store, "h100-sxm", commit(n), f"2024-12-{n:02d}T0{r}:00:00+00:00", wide_kernel(ms))
    write(store, wide_kernel(1.0), wide_kernel(1.12))
    (device,) = [c for c in cmp.compare(store, BASE, HEAD) if c.clock == "device"]
    assert device.noise.sigma < 0.01 and device.regression


def test_a_change_within_the_run_to_run_spread_is_not_a_regression(store):
    """Earlier runs of a host-bound step spread 20% between runs of one commit: a 20% slowdown stays
    within that noise, while the same run's 20% slower kernel (1% between runs) fails the gate."""

    def host_step(ms: float, seed: int) -> dict:
        return record(
            "bench_step.Step100M",
            {"variant": "eager"},
            times={"step": (None, samples(ms, seed))},
            info={"primary_clock": "wall"},
        )

    for n, pair in ((3, (60.0, 72.0)), (4, (78.0, 66.0)), (5, (70.0, 58.0)), (6, (62.0, 75.0))):
        for r, ms in enumerate(pair):
            save(
                store,
                "h100-sxm",
                commit(n),
                f"2024-12-0{n}T0{r}:00:00+00:00",
                [host_step(ms, n + r), *kernels(10 * n + r)],
            )
    write(
        store, [host_step(65.0, 1), *kernels(0)], [host_step(78.0, 2), *kernels(1000, slower=SLOW)]
    )
    changes = cmp.compare(store, BASE, HEAD)
    step_change = next(c for c in changes if c.key == "bench_step.Step100M|variant=eager")
    assert step_change.ratio > 1.19 and step_change.noise.sigma > 0.08
    assert not step_change.regression
    assert {c.key for c in changes if c.regression} == {SLOW_KEY}


def test_thresholds_are_the_catalogs_per_metric_class(store):
    """A 4.5% slower kernel (device-bound: 3%) is a regression and an 8% slower host-bound step
    (10%) is not, with quiet history; one 5% threshold for both passes the kernel and finds the
    step's change, which on a GPU machine it reports and does not gate (compare.HOST_BOUND)."""

    def host_step(ms: float) -> dict:
        return record(
            "bench_step.Step100M",
            {"variant": "eager"},
            times={"step": (None, spread(ms, 0.01))},
            info={"primary_clock": "wall"},
        )

    for n in range(10, 16):
        for r in range(2):
            jitter = 1 + random.Random(10 * n + r).gauss(0, 0.002)
            save(
                store,
                "h100-sxm",
                commit(n),
                f"2024-12-{n:02d}T0{r}:00:00+00:00",
                [host_step(100.0 * jitter), *kernels(100 * n + r, run_sd=0.002)],
            )
    write(
        store,
        [host_step(100.0), *kernels(0, run_sd=0.002)],
        [host_step(108.0), *kernels(1000, slower=SLOW, scale=1.045, run_sd=0.002)],
    )
    changes = cmp.compare(store, BASE, HEAD)
    host = next(c for c in changes if c.key.startswith("bench_step"))
    assert host.detectable == pytest.approx(0.10) and host.ratio > 1.07 and not host.significant
    assert {c.key for c in changes if c.regression} == {SLOW_KEY}
    assert all(c.detectable == pytest.approx(0.03) for c in changes if c.regression)
    overridden = cmp.compare(store, BASE, HEAD, threshold=0.05)
    assert not [c for c in overridden if c.regression]  # the kernel's 4.5% is under 5%
    host = next(c for c in overridden if c.key.startswith("bench_step"))
    assert host.significant and not host.gated and host.reason == cmp.HOST_BOUND


def test_a_kernels_host_wall_time_is_reported_not_gated(store, capsys):
    """A kernel whose host launch time doubles while its device time holds passes the gate and is
    listed as slower; a step's wall time (its primary clock) is a gated class."""
    history(store)
    head = kernels(1000)
    for rec in head:
        wall = rec["metrics"]["fwd"]["wall"]
        wall.update(median_ms=wall["median_ms"] * 2, samples_ms=[x * 2 for x in wall["samples_ms"]])
    write(store, kernels(0), head)
    changes = [c for c in cmp.compare(store, BASE, HEAD) if c.significant]
    assert changes and all(c.clock == "wall" and not c.gated and not c.regression for c in changes)
    assert run_main(store) == 0
    assert "slower (not gated)" in capsys.readouterr().out
    assert cmp.gate_threshold("bench_step.StepTiny", {"variant": "eager"}, "time", "wall") == 0.10


def test_a_real_change_in_history_is_not_counted_as_noise(store):
    """History whose kernels got 30% faster half-way: only runs of one commit are A/A sets, so the
    run-to-run noise stays ~1% and a 20% slowdown is still caught."""
    history(store, commits=8, level=lambda n: 1.3 if n < 14 else 1.0)
    write(store, kernels(0), kernels(1000, slower=SLOW))
    assert {c.key for c in cmp.compare(store, BASE, HEAD) if c.regression} == {SLOW_KEY}
    fitted = cmp.NoiseModel.of(store.machine_runs("h100-sxm")).noise(
        GPU, ("bench_kernels.RMSNorm|shape=8192x768|impl=eager", "fwd", "device")
    )
    assert fitted.sigma < 0.03


def test_runs_add_up_and_an_aa_comparison_of_one_commit(store, capsys):
    history(store)
    for r in range(3):
        save(store, "h100-sxm", HEAD, f"2025-01-02T0{r}:00:00+00:00", kernels(2000 + r))
    one = cmp.compare(store, HEAD, HEAD, head_runs=["run-2025-01-02T00"])
    assert one and {c.runs for c in one if c.quantity == "time"} == {(2, 1)}
    assert not [c for c in one if c.significant]
    noise = cmp.NoiseModel.of(store.machine_runs("h100-sxm")).noise(
        GPU, ("bench_kernels.RMSNorm|shape=8192x768|impl=eager", "fwd", "device")
    )
    assert noise.detectable(3, 3, 0.0) < noise.detectable(1, 1, 0.0)
    assert (
        run_main(
            store, "--base-run", "run-2025-01-02T01", "--head-run", "run-2025-01-02T02", base=HEAD
        )
        == 0
    )


def test_faster_is_an_improvement_and_passes(store):
    history(store)
    write(store, kernels(0, slower=("8192x768", "eager")), kernels(1000))
    flagged = [c for c in cmp.compare(store, BASE, HEAD) if c.significant]
    assert flagged and all(c.improvement == c.gated and not c.regression for c in flagged)
    assert {c.clock for c in flagged if c.improvement} == {"device"}
    assert run_main(store) == 0


def test_peak_memory_growth_is_flagged(store):
    write(store, kernels(0), kernels(1000, peak_scale=1.02))
    flagged = [c for c in cmp.compare(store, BASE, HEAD) if c.significant]
    assert flagged and {c.quantity for c in flagged} == {"peak memory"}
    assert all(
        c.params["impl"] == "triton"
        and c.regression
        and c.detectable == 0.01
        and c.ratio == pytest.approx(1.02, rel=1e-3)
        for c in flagged
    )
    assert not [c for c in cmp.compare(store, BASE, HEAD, threshold=0.05) if c.significant]
    assert run_main(store) == 1


def graphed_step(case_peak: int) -> list[dict]:
    """The 1B best-kernels step (a CUDA graph): its own call reads 512 bytes; its case peak is
    ``case_peak``."""
    return [
        record(
            "bench_step.Step1B",
            {"variant": "best-kernels"},
            times={"step": (samples(100.0, 1), samples(100.0, 2))},
            peak={"step": 512},
            memory={"peak_bytes": case_peak, "resident_bytes": 20 * 10**9},
            info={"primary_clock": "wall"},
        )
    ]


def test_a_graphed_steps_case_peak_is_judged_and_its_own_calls_is_not(store):
    write(store, graphed_step(25 * 10**9), graphed_step(26 * 10**9))
    memory = {c.metric: c for c in cmp.compare(store, BASE, HEAD) if c.quantity == "peak memory"}
    assert memory["case peak"].significant and memory["case peak"].regression
    assert not memory["case resident"].significant
    assert memory["step"].detectable is None  # reported, never gated


def test_an_earlier_meters_case_memory_is_reported_not_judged(store):
    """Mutation: the case figures of a meter before CASE_METER depended on the cases before them in
    their process (the same step read 4,199 and 5,230 MiB): a 24% move between two such runs is
    reported, not gated; the current meter's would be judged (test above)."""

    def earlier(case_peak: int) -> list[dict]:
        (rec,) = graphed_step(case_peak)
        del rec["memory"]["meter"]
        return [rec]

    write(store, earlier(4_199 << 20), earlier(5_230 << 20))
    memory = {c.metric: c for c in cmp.compare(store, BASE, HEAD) if c.quantity == "peak memory"}
    assert set(memory) == {"step", *EARLIER_METER}
    peak = memory[EARLIER_METER[0]]
    assert peak.ratio > 1.2 and not peak.regression and not peak.gated


def test_a_time_of_several_runs_shows_their_geometric_mean_and_range(store):
    """Mutation: the base column showing its latest run (18.2 ms) beside a 1.57x "slower" taken
    over four runs whose others read ~9 ms, as a stored h200 comparison did."""
    base_ms, head_ms = (9.0, 9.4, 8.8, 18.2), (24.4, 11.6)
    for sha, day, levels in ((BASE, "01", base_ms), (HEAD, "02", head_ms)):
        for r, ms in enumerate(levels):
            save(store, "h100-sxm", sha, f"2025-01-{day}T0{r}:00:00+00:00", kernels(0, level=ms))
    change = next(
        c for c in cmp.compare(store, BASE, HEAD) if (c.metric, c.clock) == ("fwd", "device")
    )

    def geomean(values: tuple[float, ...]) -> float:
        return math.exp(statistics.fmean(math.log(v) for v in values))

    assert change.runs == (4, 2)
    assert change.base.median == pytest.approx(geomean(base_ms), rel=0.01)
    assert (change.base.q25, change.base.q75) == pytest.approx((8.8, 18.2), rel=0.01)
    assert change.head.median == pytest.approx(geomean(head_ms), rel=0.01)
    assert change.head.median / change.base.median == pytest.approx(change.ratio)


def compiled(seconds: float) -> list[dict]:
    """A compiled step's record (the catalog gates compile seconds of steps, not of kernels)."""
    rec = record(
        "bench_step.Step100M",
        {"variant": "compile-default"},
        times={"step": (samples(20.0, 1), samples(20.1, 2))},
        info={"primary_clock": "wall"},
    )
    return [{**rec, "compile_seconds": seconds}]


def test_compile_seconds_growth_is_flagged_on_one_gpu_from_a_cold_cache(store, capsys):
    """Compile seconds 20% up from a cold cache on one GPU, with A/A history of their own there (4
    runs of the base, 1% apart): a regression (15%); a warm cache's seconds are not compared; across
    GPUs reported, not gated."""
    for sha, date, seconds in (
        (BASE, "01T00", 10.0),
        (BASE, "01T01", 10.1),
        (BASE, "01T02", 9.9),
        (BASE, "01T03", 10.05),
        (HEAD, "02T00", 12.0),
        (HEAD, "02T01", 12.1),
    ):
        save(
            store,
            "h100-sxm",
            sha,
            f"2025-01-{date}:00:00+00:00",
            compiled(seconds),
            compile_cache="cold",
        )
    (change,) = [c for c in cmp.compare(store, BASE, HEAD) if c.quantity == "compile"]
    assert change.regression and change.ratio == pytest.approx(12.05 / 10.0125, rel=1e-3)
    assert change.runs == (4, 2) and change.detectable == pytest.approx(0.15)
    assert cmp.rows([change])[0][2:6] == ("compile", "", "10 s", "12.1 s")
    assert run_main(store) == 1
    assert "REGRESSION" in capsys.readouterr().out


def test_compile_seconds_without_their_own_noise_are_reported_not_gated(store):
    """Mutation: judging compile seconds by the threshold alone (a process's first compile and later
    ones differ several-fold) raised false alarms on pairs of runs of one commit."""
    write(store, compiled(10.0), compiled(13.0))
    for sha, date in ((BASE, "01T00"), (HEAD, "02T00")):
        save(
            store,
            "h100-sxm",
            sha,
            f"2025-01-{date}:30:00+00:00",
            compiled(10.0 if sha == BASE else 13.0),
            compile_cache="cold",
        )
    (change,) = [c for c in cmp.compare(store, BASE, HEAD) if c.quantity == "compile"]
    assert not change.gated and not change.regression and change.reason == cmp.NO_NOISE

    small = ResultStore(store.root.parent / "small")
    write(small, compiled(10.0), compiled(11.0))
    no_cache_info = cmp.compare(small, BASE, HEAD)
    assert [c.quantity for c in no_cache_info].count("compile") == 0
    for sha, date, seconds, cache in (
        (BASE, "01T10", 10.0, "cold"),
        (HEAD, "02T10", 11.0, "cold"),
        (HEAD, "02T11", 1.0, "local"),
    ):
        save(
            small,
            "h100-sxm",
            sha,
            f"2025-01-{date}:00:00+00:00",
            compiled(seconds),
            compile_cache=cache,
        )
    (change,) = [c for c in cmp.compare(small, BASE, HEAD) if c.quantity == "compile"]
    assert change.runs == (1, 1) and not change.significant  # the warm run is left out

    apart = ResultStore(store.root.parent / "apart")
    save(apart, "h100-sxm", BASE, "2025-01-01T00:00:00+00:00", compiled(10.0), compile_cache="cold")
    save(
        apart,
        "h100-sxm",
        HEAD,
        "2025-01-02T00:00:00+00:00",
        compiled(20.0),
        compile_cache="cold",
        gpu_uuid=OTHER_GPU,
    )
    (change,) = [c for c in cmp.compare(apart, BASE, HEAD) if c.quantity == "compile"]
    assert change.significant and not change.gated and cmp.verdict(change) == "slower (CROSS-GPU)"


def test_ok_to_oom_is_a_regression_and_skipped_twice_is_silent(store, capsys):
    skipped = record(
        "bench_kernels.SwiGLU", {"shape": "8192x2048", "impl": "liger"}, status="skipped"
    )
    write(store, [step(0), skipped], [step(1, status="oom"), skipped], machine="gpu-host")
    changes = cmp.compare(store, BASE, HEAD)
    assert [(c.quantity, c.base_status, c.head_status, c.regression) for c in changes] == [
        ("status", "ok", "oom", True)
    ]
    assert run_main(store) == 1
    assert "oom" in capsys.readouterr().out


def test_wall_clock_when_device_time_is_null(store):
    write(store, [step(0)], [step(1)], machine="gpu-host")
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
    write(store, [step(0)], [step(1)], machine="gpu-host")
    assert run_main(store, "--machine", "gpu-host", "--all") == 0
    out = capsys.readouterr().out
    assert "gpu-host" in out and "StepTiny" in out and "h100-sxm" not in out


def test_a_run_that_shared_its_host_is_compared_across_gpus_only(store):
    """The shards of ``run --gpus`` measure at once on one host (``runs_at_once`` 4): host-bound
    steps read slower there with no change of code, so a head measured so and a base measured
    alone on the same GPU are compared across GPUs only, never gated (the mutation, a unit without
    the count, gates this 69% slower kernel as a regression)."""
    history(store)
    save(store, "h100-sxm", BASE, "2025-01-01T00:00:00+00:00", kernels(0))
    save(
        store,
        "h100-sxm",
        HEAD,
        "2025-01-02T00:00:00+00:00",
        kernels(1000, slower=SLOW, scale=1.69),
        runs_at_once=4,
    )
    changes = cmp.compare(store, BASE, HEAD)
    assert changes and all(c.gpu is None and c.reason == cmp.CROSS_GPU for c in changes)
    assert not [c for c in changes if c.regression or c.gated]


def test_an_unknown_ref_exits_2_naming_the_ref_and_machine(store, capsys):
    save(store, "h100-sxm", BASE, "2025-01-01T00:00:00+00:00", kernels(0))
    assert cmp.compare(store, BASE, HEAD) == []
    assert run_main(store) == 2
    err = capsys.readouterr().err
    assert "nothing to compare" in err and repr(HEAD[:10]) in err and "h100-sxm" in err
    assert run_main(store, "--machine", "h200") == 2
    assert f"{BASE[:10]!r} has no stored runs on h200" in capsys.readouterr().err


def test_different_code_on_different_gpus_is_cross_gpu_and_exits_2(store, capsys):
    """Base on one H100, head on another, 69% slower at one kernel: reported as CROSS-GPU, never
    gated, and the gate says it had nothing comparable."""
    history(store)
    write(store, kernels(0), kernels(1000, slower=SLOW, scale=1.69), head_gpu=OTHER_GPU)
    changes = cmp.compare(store, BASE, HEAD)
    assert changes and all(c.gpu is None and c.reason == cmp.CROSS_GPU for c in changes)
    assert not [c for c in changes if c.gated]
    assert not [c for c in changes if c.regression or c.improvement]
    assert {c.key for c in changes if c.significant} == {SLOW_KEY}
    assert run_main(store) == 2
    out, err = capsys.readouterr()
    assert "CROSS-GPU, not gated" in out and "slower (CROSS-GPU)" in out
    assert "nothing comparable" in err and BASE[:10] in err and "h100-sxm" in err


def test_the_same_code_across_gpus_exits_0(store, capsys):
    """Two runs of one commit on two GPUs, 69% apart at one kernel: the same code, exit 0, whether
    compared run against run (CROSS-GPU, reported) or as a whole."""
    save(store, "h100-sxm", HEAD, "2025-01-02T00:00:00+00:00", kernels(0), gpu_uuid=GPU)
    save(
        store,
        "h100-sxm",
        HEAD,
        "2025-01-02T01:00:00+00:00",
        kernels(1, slower=SLOW, scale=1.69),
        gpu_uuid=OTHER_GPU,
    )
    assert (
        run_main(
            store, "--base-run", "run-2025-01-02T00", "--head-run", "run-2025-01-02T01", base=HEAD
        )
        == 0
    )
    assert "CROSS-GPU, not gated" in capsys.readouterr().out
    assert run_main(store, base=HEAD) == 0
    assert "same code" in capsys.readouterr().out


def git(repo, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_a_docs_only_commit_compares_as_its_code_commit(store, tmp_path, monkeypatch, capsys):
    """Runs are stored under the measured code commit: a commit that changes only docs resolves to
    its parent's code, so comparing it with its parent is the same code (exit 0) and with an older
    commit compares that code."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for path, text in (("code.py", "a = 1\n"), ("code.py", "a = 2\n"), ("docs/notes.md", "docs\n")):
        (repo / path).parent.mkdir(exist_ok=True)
        (repo / path).write_text(text)
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", path)
    old, code, docs = git(repo, "rev-list", "--reverse", "HEAD").split()
    monkeypatch.setattr(cmp, "REPO_ROOT", repo)
    history(store)
    for sha, day in ((old, 1), (code, 2)):
        for r in range(2):
            save(
                store,
                "h100-sxm",
                sha,
                f"2025-01-0{day}T0{r}:00:00+00:00",
                kernels(10 * day + r, slower=SLOW if sha == code else None),
            )
    assert cmp.resolve(store, "h100-sxm", docs) == cmp.resolve(store, "h100-sxm", "HEAD") == code
    assert cmp.main([code, docs, "--results", str(store.root)]) == 0
    assert "same code" in capsys.readouterr().out
    assert cmp.main(["HEAD~1", "HEAD", "--results", str(tmp_path / "none")]) == 0  # nothing stored
    assert f"both measure {code[:12]}" in capsys.readouterr().out
    assert cmp.main(["HEAD~2", "HEAD", "--results", str(store.root)]) == 1
    assert "REGRESSION" in capsys.readouterr().out


def test_a_device_clock_that_measures_another_thing_is_not_compared(store, capsys):
    """Records of the cold-L2 method (info.device_clock) against older warm-L2 ones: the device
    clocks are listed as not compared, the wall clocks are still reported."""
    history(store)
    warm = [{**r, "info": {}} for r in kernels(0)]  # kernel records from before device_clock
    write(store, warm, kernels(1000, level=1.5))
    changes = [c for c in cmp.compare(store, BASE, HEAD) if c.quantity == "time"]
    assert {c.clock for c in changes if c.method_changed} == {"device"}
    assert not [c for c in changes if c.method_changed and (c.significant or c.gated)]
    assert {c.clock for c in changes if c.significant} == {"wall"}
    assert all(cmp.verdict(c) == "slower (not gated)" for c in changes if c.significant)
    run_main(store)
    assert "12 time metrics are not compared" in capsys.readouterr().out


def test_another_machine_is_compared_labelled_and_never_gated(store, capsys):
    """Base on the H100, head on an H200 that is 30% faster at one kernel and 10% slower at another:
    every change is reported, none gates, and nothing comparable is exit 2."""
    history(store)
    save(store, "h100-sxm", BASE, "2025-01-01T00:00:00+00:00", kernels(0))
    save(
        store,
        "h200",
        HEAD,
        "2025-01-02T00:00:00+00:00",
        kernels(1000, level=0.7, slower=("8192x768", "eager")),
    )
    changes = cmp.compare(store, BASE, HEAD, ["h200"], base_machine="h100-sxm")
    times = [c for c in changes if c.quantity == "time"]
    assert times and all(c.base_machine == "h100-sxm" and not c.gated for c in times)
    assert any(c.significant for c in times) and not [
        c for c in changes if c.regression or c.improvement
    ]
    assert (
        cmp.main(
            [
                BASE[:10],
                HEAD[:10],
                "--results",
                str(store.root),
                "--machine",
                "h200",
                "--base-machine",
                "h100-sxm",
            ]
        )
        == 2
    )
    assert "CROSS-GPU, not gated: h100-sxm" in capsys.readouterr().out
    # without --base-machine nothing mixes machines
    assert cmp.compare(store, BASE, HEAD, ["h200"]) == []


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        cmp.main(["--help"])
    out = capsys.readouterr().out
    assert "0  no regression" in out and "1  a regression" in out and "2  nothing comparable" in out


CPU = "AMD EPYC 7B13"
CPU_MACHINE = "cpu-amd-epyc-003596"


def cpu_run(store: ResultStore, sha: str, date: str, records: list[dict], **machine) -> None:
    """One run of ``records`` on a CPU machine (no GPU), by default host 003596's with :data:`CPU`
    (``machine``: its ``host_id`` or ``cpu`` instead)."""
    save(
        store,
        CPU_MACHINE,
        sha,
        date,
        records,
        gpu_name=None,
        **{"cpu": CPU, "host_id": "003596", **machine},
    )


def test_runs_of_one_cpu_machine_compare_as_that_machine_and_others_stay_apart(store, capsys):
    """A CPU has no UUID: its runs are one unit by host id and CPU model (what its machine name
    ``cpu-<model>-<host id>`` holds). A tiny step 69% slower at head on the host of the base and of
    the A/A history is a regression on that machine (exit 1), headed by it, not CROSS-GPU; a head on
    another host, or on another CPU, is compared across machines, never gated (exit 2). The
    mutation, a CPU run with no unit, makes the first CROSS-GPU."""
    for n in range(10, 13):  # the A/A history: 3 degrees of freedom
        for r in range(2):
            cpu_run(store, commit(n), f"2024-12-{n:02d}T0{r}:00:00+00:00", [step(100 * n + r)])
    cpu_run(store, BASE, "2025-01-01T00:00:00+00:00", [step(0)])
    cpu_run(store, HEAD, "2025-01-02T00:00:00+00:00", slower([step(1)], 1.69))
    changes = cmp.compare(store, BASE, HEAD)
    assert {c.gpu for c in changes} == {f"host 003596 ({CPU})"}
    assert [c.key for c in changes if c.regression] == ["bench_step.StepTiny|variant=eager"]
    assert run_main(store) == 1
    out = capsys.readouterr().out
    assert f"{CPU_MACHINE} on host 003596 ({CPU}):" in out and cmp.CROSS_GPU not in out
    for n, other in enumerate(({"host_id": "00aaaa"}, {"cpu": "Intel Xeon Platinum 8480+"})):
        apart = ResultStore(store.root.with_name(f"apart-{n}"))
        cpu_run(apart, BASE, "2025-01-01T00:00:00+00:00", [step(0)])
        cpu_run(apart, HEAD, "2025-01-02T00:00:00+00:00", slower([step(1)], 1.69), **other)
        changes = cmp.compare(apart, BASE, HEAD)
        assert changes and all(c.gpu is None and c.reason == cmp.CROSS_GPU for c in changes)
        assert run_main(apart) == 2
        assert f"{cmp.CROSS_GPU}, not gated: {CPU_MACHINE}" in capsys.readouterr().out


def test_a_row_shows_the_figure_its_ratio_comes_from_not_an_ab_rounds(store):
    """ab's rounds at head (records reusing their check: an ab design, left out of the ratio) came
    after its ordinary run: the row showed the last round's median beside a ratio taken from the
    ordinary run's (9.08 ms shown as 14.32 on the h200 page)."""
    write(store, kernels(0), kernels(1, slower=SLOW))
    rounds = [{**rec, "checked_in": "earlier-run"} for rec in kernels(2, slower=SLOW, scale=3.0)]
    save(store, "h100-sxm", HEAD, "2025-01-03T00:00:00+00:00", rounds)
    (slow,) = [
        c
        for c in cmp.compare(store, BASE, HEAD)
        if c.key == SLOW_KEY and c.metric == "fwd"
        if c.clock == "device"
    ]
    assert slow.head.median == pytest.approx(slow.base.median * slow.ratio, rel=0.02)
