"""optbench.gate.changepoints on synthetic series (test data, not measurements): a planted step is
found in its commit range, a flat noisy series gives none, and GPUs never share a series."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from optbench.gate.changepoints import (
    MIN_COMMITS,
    ChangePoint,
    RunMedian,
    change_points,
    unit_of,
    unit_series,
)


def commit(i: int) -> str:
    return f"{i:040x}"


def noisy(level: float, rng: random.Random, rel_sd: float = 0.01) -> float:
    return level * (1 + rng.gauss(0, rel_sd))


def series(
    levels: list[float], units: list[str], seed: int = 0, runs: int = 2, rel_sd: float = 0.01
) -> list[tuple[str, list[RunMedian]]]:
    """Commit i: ``runs`` runs on ``units[i]`` around ``levels[i]`` ms."""
    rng = random.Random(seed)
    return [
        (commit(i), [RunMedian(unit, noisy(level, rng, rel_sd)) for _ in range(runs)])
        for i, (level, unit) in enumerate(zip(levels, units))
    ]


def test_a_planted_step_is_found_in_its_commit_range():
    (point,) = change_points(series([1.0] * 8 + [1.2] * 8, ["GPU-a"] * 16))
    assert (point.unit, point.before, point.after) == ("GPU-a", commit(7), commit(8))
    assert point.index == 8
    assert point.ratio == pytest.approx(1.2, rel=0.02)
    assert point.significance > 1


def test_a_step_down_is_found_too():
    (point,) = change_points(series([1.0] * 10 + [0.8] * 6, ["GPU-a"] * 16, seed=3))
    assert (point.before, point.after) == (commit(9), commit(10))
    assert point.ratio == pytest.approx(0.8, rel=0.02)


@pytest.mark.parametrize("seed", range(5))
def test_a_flat_noisy_series_has_no_change_point(seed):
    assert change_points(series([1.0] * 16, ["GPU-a"] * 16, seed=seed, rel_sd=0.02)) == []


def test_a_step_below_min_magnitude_is_not_reported():
    """2% on a series without noise: asv finds the step, the 3% floor drops it; 10% passes."""
    flat = series([1.0] * 8 + [1.02] * 8, ["GPU-a"] * 16, rel_sd=0.0)
    assert change_points(flat) == []
    assert len(change_points(flat, min_magnitude=0.01)) == 1


def test_a_series_with_too_few_commits_is_not_searched():
    short = series([1.0] * 4 + [1.5] * (MIN_COMMITS - 5), ["GPU-a"] * (MIN_COMMITS - 1))
    assert change_points(short) == []
    assert len(change_points(short, min_commits=MIN_COMMITS - 1)) == 1


def test_gpus_never_share_a_series():
    """Two GPUs of one kind, one 20% slower, each measuring half the commits: no change on either.
    One series over both (the same levels under one name) would find the step where the GPU
    changes."""
    levels, units = [1.0] * 8 + [1.2] * 8, ["GPU-fast"] * 8 + ["GPU-slow"] * 8
    assert change_points(series(levels, units)) == []
    assert len(change_points(series(levels, ["GPU-fast"] * 16))) == 1
    split = unit_series(series(levels, units))
    assert {u: [c for c, _ in commits] for u, commits in split.items()} == {
        "GPU-fast": [commit(i) for i in range(8)],
        "GPU-slow": [commit(i) for i in range(8, 16)],
    }


def test_each_gpu_reports_its_own_change_point():
    """Two GPUs measure every commit at levels 10% apart, both 20% slower from commit 8: one change
    point per GPU, each the ratio of its own levels."""
    rng = random.Random(7)
    both = [
        (
            commit(i),
            [
                RunMedian("GPU-a", noisy(1.0 * step, rng)),
                RunMedian("GPU-b", noisy(1.1 * step, rng)),
            ],
        )
        for i, step in enumerate([1.0] * 8 + [1.2] * 8)
    ]
    found = change_points(both)
    assert [(p.unit, p.before, p.after) for p in found] == [
        ("GPU-a", commit(7), commit(8)),
        ("GPU-b", commit(7), commit(8)),
    ]
    assert all(p.ratio == pytest.approx(1.2, rel=0.03) for p in found)


def test_a_commit_is_the_median_of_its_runs_on_the_gpu():
    """One odd run among three at a commit moves nothing."""
    s = series([1.0] * 16, ["GPU-a"] * 16, runs=3)
    s[5] = (s[5][0], [*s[5][1][:2], RunMedian("GPU-a", 3.0)])
    assert change_points(s) == []


def test_a_flat_series_on_each_side_gives_infinite_significance():
    (point,) = change_points(series([1.0] * 8 + [1.5] * 8, ["GPU-a"] * 16, rel_sd=0.0))
    assert point == ChangePoint("GPU-a", commit(7), commit(8), 8, 1.5, float("inf"))


def test_unit_of_a_run():
    h100 = "NVIDIA H100 80GB HBM3"
    assert unit_of({"gpu_name": h100, "gpu_uuid": "GPU-98cc"}, "h100-sxm") == "GPU-98cc"
    assert unit_of({"gpu_name": h100}, "h100-sxm") is None  # which GPU: unknown
    assert unit_of({"gpu_name": None, "cpu": "AMD EPYC"}, "cpu-amd-epyc") == "cpu-amd-epyc"


def test_importable_without_torch_or_asv():
    """The module loads neither torch nor asv (asv's step detection is imported when a series is
    searched)."""
    code = (
        "import sys, optbench.gate.changepoints; "
        "print(sorted(m for m in ('torch', 'asv') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_run_that_shared_its_host_is_a_unit_of_its_own_and_says_so_shortened():
    """Shards of ``run --gpus`` (``runs_at_once`` 4) measure on a GPU as another unit than its lone
    runs; cut to 12 characters for a table, the unit keeps the count (the mutation, the unit cut
    whole, reads as the lone GPU's)."""
    from optbench.gate.changepoints import gpu_unit, short_unit

    uuid = "GPU-915ebd26-7e01-2129-fe06-7fe71276af70"
    alone, shared = gpu_unit({"gpu_uuid": uuid}), gpu_unit({"gpu_uuid": uuid, "runs_at_once": 4})
    assert alone == uuid and shared != alone and gpu_unit({"gpu_name": "H100"}) is None
    assert short_unit(alone) == "GPU-915ebd26"
    assert short_unit(shared) == "GPU-915ebd26 (4 runs at once)"
