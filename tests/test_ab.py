"""optbench ab and bisect on synthetic runs (test data, not measurements): the interval, the
verdicts, the rounds' order and stopping, the exit codes; each with a planted case it must catch."""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

import pytest
from synthetic_results import record, samples

from optbench.gate import ab, bisect
from optbench.gate.ratio import (
    IMPROVEMENT,
    INCONCLUSIVE,
    NO_CHANGE,
    NOT_SLOWER,
    REGRESSION,
    Ratio,
    ratio,
)
from optbench.store.records import CASE_PEAK, CASE_RESIDENT, EARLIER_METER
from optbench.store.store import MACHINE_KEY, ResultStore

STEP_1B = "bench_step.Step1B|variant=best-kernels"
STEP_100M = "bench_step.Step100M|variant=eager"


def noisy(level: float, n: int, sd: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + rng.gauss(0, sd)) for _ in range(n)]


# The interval and its verdicts.


def test_a_five_percent_shift_at_half_a_percent_noise_is_a_regression_at_three():
    r = ratio(noisy(100, 5, 0.005, 1), noisy(105, 5, 0.005, 2))
    assert r.low > 1.03 and r.verdict(0.03) == REGRESSION
    assert r.low <= r.estimate <= r.high


def test_the_same_code_is_no_change_and_its_interval_holds_one():
    for seed in range(20):
        r = ratio(noisy(100, 5, 0.005, seed), noisy(100, 5, 0.005, seed + 100))
        assert r.low < 1 < r.high and r.verdict(0.03) == NO_CHANGE


def test_three_runs_a_side_bound_nothing_at_95_percent():
    """The exact two-sided test of 3 against 3 cannot reach 5%: however far apart, inconclusive."""
    r = ratio([1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
    assert (r.low, r.high) == (0.0, float("inf")) and r.verdict(0.03) == INCONCLUSIVE
    assert ratio([1.0] * 4, [2.0] * 4).verdict(0.03) == REGRESSION


def test_one_outlying_slow_run_leaves_the_lower_end_and_the_verdict():
    """A head run 5x slow moves only the pairwise differences it takes part in, all at the top: the
    interval's lower end, the estimate and the verdict stay."""
    base, head = noisy(100, 6, 0.002, 3), noisy(110, 6, 0.002, 4)
    clean = ratio(base, head)
    spoiled = ratio(base, [*head[:-1], 500.0])
    assert spoiled.verdict(0.03) == clean.verdict(0.03) == REGRESSION
    assert spoiled.low == pytest.approx(clean.low, rel=2e-3)
    assert spoiled.estimate == pytest.approx(clean.estimate, rel=5e-3)


def test_verdict_bounds_are_relative_to_the_threshold():
    at = lambda low, high: Ratio(1.0, low, high, 5, 5).verdict(0.10)  # noqa: E731
    assert at(1.11, 1.2) == REGRESSION and at(1.09, 1.2) == INCONCLUSIVE
    assert at(0.8, 0.9) == IMPROVEMENT and at(0.8, 0.95) == NOT_SLOWER
    assert at(0.95, 1.05) == NO_CHANGE and at(0.8, 1.05) == NOT_SLOWER
    assert at(0.8, 1.11) == INCONCLUSIVE  # faster or slower: a regression not ruled out


def test_a_mean_of_runs_would_be_moved_by_one_outlier_but_the_estimate_is_not():
    """Mutation: an estimator that averages (not a median of pairwise differences) follows one
    outlying run; Hodges-Lehmann does not."""
    r = ratio([100.0] * 5, [100.0] * 4 + [300.0])
    assert r.estimate == pytest.approx(1.0) and r.verdict(0.03) != REGRESSION


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        ratio([], [1.0])
    with pytest.raises(ValueError):
        ratio([1.0, 0.0], [1.0])


def _memory_verdicts(base: list[float], head: list[float]) -> ab.Verdict:
    series = ab.Series(STEP_1B, "case peak", "peak memory", "")
    (verdict,) = ab.judge([{series: b} for b in base], [{series: h} for h in head], 0.95)
    return verdict


def test_a_peak_memory_each_side_gave_alike_twice_is_bounded_by_its_extreme_ratios():
    gib = float(1 << 30)
    grown = _memory_verdicts([5 * gib, 5 * gib], [6 * gib, 6 * gib])
    assert grown.ratio.low == grown.ratio.high == 1.2 and grown.verdict == REGRESSION
    assert _memory_verdicts([5 * gib] * 2, [5 * gib] * 2).verdict == NO_CHANGE
    # one small block more in one run of a side (512 bytes, as the allocator's rounding gives)
    jittered = _memory_verdicts([5 * gib, 5 * gib + 512], [5 * gib + 512, 5 * gib])
    assert jittered.verdict == NO_CHANGE and jittered.ratio.low < 1 < jittered.ratio.high
    grown = _memory_verdicts([5 * gib, 5 * gib + 512], [6 * gib, 6 * gib + 512])
    assert grown.verdict == REGRESSION


def test_a_peak_memory_that_moves_between_runs_of_one_side_is_bounded_as_noise():
    gib = float(1 << 30)
    assert _memory_verdicts([5 * gib, 5.01 * gib], [6 * gib, 6 * gib]).verdict == INCONCLUSIVE
    assert _memory_verdicts([5 * gib], [6 * gib]).verdict == INCONCLUSIVE  # once: no replicate


def test_a_graphed_steps_own_call_is_not_judged_for_memory_but_its_case_is():
    per_call = ab.Series(STEP_1B, "step", "peak memory", "")  # a replay: 512 bytes, as measured
    case = ab.Series(STEP_1B, "case peak", "peak memory", "")
    base = [{per_call: 512.0, case: 5e9}] * 2
    head = [{per_call: 1024.0, case: 5e9}] * 2
    (verdict,) = ab.judge(base, head, 0.95)
    assert verdict.series == case and verdict.verdict == NO_CHANGE


# The rounds: a fake side run writes synthetic records where a real one would.


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """ab with its git, worktrees and grid processes replaced: each side run stores one synthetic
    run of the cases it was given, whose 1B step takes ``levels[label]`` ms (noise 0.3%) and whose
    100M step is host-bound noise (15% a run). With ``lockstep`` on, both worktrees can pair, and a
    lockstep round stores both sides' 100M step with paired samples: the round's host speed (15%
    between rounds) times ``host[label]``, 1% noise a sample."""
    results = tmp_path / "results"
    state = {
        "levels": {"base": 100.0, "head": 100.0, "head 1": 100.0, "head 2": 100.0},
        "host": {"base": 1.0, "head": 1.0, "head 1": 1.0, "head 2": 1.0},
        "calls": [],
        "status": {"base": "ok", "head": "ok", "head 1": "ok", "head 2": "ok"},
        "commits": {"BASE": "a" * 40, "HEAD": "b" * 40, "SLOW": "c" * 40, "NEUTRAL": "d" * 40},
        "lockstep": False,
        "paired": True,
        "compile": {"base": 30.0, "head": 30.0, "head 1": 30.0, "head 2": 30.0},
        "checked_in": [],
        "reuses_checks": {"BASE": True, "HEAD": True, "SLOW": True, "NEUTRAL": True},
        # bytes more a case holds in a process that ran its check (NOTES.md: ~100 MiB)
        "check_holds": 100 * 2**20,
        # whether the fake grid honours a reused check (the matmul and anchor grids never do)
        "honours_checked_in": True,
        # case keys a side's code lacks: its rounds never store them
        "lacks": {"base": set(), "head": set()},
    }
    rng, compile_rng = random.Random(7), random.Random(11)

    def resolve(ref, root=None):
        if ref not in state["commits"]:
            raise ValueError(f"git cannot resolve {ref!r}")
        return state["commits"][ref]

    def add_worktree(commit, root=None):
        tree = tmp_path / "trees" / commit[:12]
        (tree / "optbench" / "suite").mkdir(parents=True, exist_ok=True)
        (tree / "optbench" / "suite" / "grids.py").write_text("def measure_suite(): ...\n")
        if state["lockstep"]:
            (tree / ab.LOCKSTEP_MODULES[0]).parent.mkdir(parents=True, exist_ok=True)
            (tree / ab.LOCKSTEP_MODULES[0]).write_text("")
        ref = next(r for r, c in state["commits"].items() if c == commit)
        if state["reuses_checks"][ref]:
            (tree / "optbench" / "store").mkdir(parents=True, exist_ok=True)
            (tree / "optbench" / "store" / "settings.py").write_text(ab.CHECKED_IN_VARIABLE)
        return tree

    def save(side, run_id, recs):
        machine = {"key": MACHINE_KEY, "info": {"gpu_uuid": "GPU-test"}, "commit": side.commit}
        ResultStore(results).save("h100-sxm", side.commit, [machine, *recs], run_id=run_id)
        side.runs.append(run_id)

    def run_round(side, settings, groups, logs, checked=None):
        keys = {k for g in groups.values() for k in g} - state["lacks"].get(side.label, set())
        run_id = f"run{len(state['calls']):02d}"
        state["calls"].append(side.label)
        checked_in = (checked or {}).get("steps") if state["honours_checked_in"] else None
        state["checked_in"].append((side.label, checked_in))
        held = 0 if checked_in else state["check_holds"]
        level = state["levels"][side.label] * (1 + rng.gauss(0, 0.003))
        host = 70.0 * (1 + rng.gauss(0, 0.15))
        step_1b = record(
            "bench_step.Step1B",
            {"variant": "best-kernels"},
            status=state["status"][side.label],
            times={"step": (samples(level, 1), samples(level, 2))},
            peak={"step": 512},  # a graph replay's own call: not judged
            memory={"peak_bytes": 25 * 10**9, "resident_bytes": 21 * 10**9 + held},
            info={"primary_clock": "wall"},
        )
        if checked_in:
            step_1b["checked_in"] = checked_in
        step_1b["compile_seconds"] = state["compile"][side.label] * (1 + compile_rng.gauss(0, 0.01))
        recs = [
            step_1b,
            record(
                "bench_step.Step100M",
                {"variant": "eager"},
                times={"step": (None, samples(host, 3))},
                info={"primary_clock": "wall"},
            ),
        ]
        save(side, run_id, [r for r in recs if r["key"] in keys])
        return run_id, 1.0, 0

    def run_lockstep_round(sides, settings, groups, logs, cpu, base_first, checked=None):
        assert [k for g in groups.values() for k in g] == [STEP_100M]
        speed = 70.0 * (1 + rng.gauss(0, 0.15))
        ids = {}
        for label, side in sides.items():
            ids[label] = f"run{len(state['calls']):02d}"
            state["calls"].append(f"lockstep {side.label}")
            level = speed * state["host"][side.label]
            rec = record(
                "bench_step.Step100M",
                {"variant": "eager"},
                status=state["status"][side.label],
                times={"step": (None, [level * (1 + rng.gauss(0, 0.01)) for _ in range(30)])},
                peak={"step": 256},
                info={"primary_clock": "wall"},
            )
            paired = state["paired"]
            if isinstance(paired, list):  # one value a round
                paired = paired[(len(state["calls"]) - 1) // 2 % len(paired)]
            rec["lockstep"] = {"step": {"cpu": cpu, "paired": paired}}
            save(side, ids[label], [rec])
        return ids, 1.0, 0

    monkeypatch.setattr(ab, "resolve", resolve)
    monkeypatch.setattr(ab, "add_worktree", add_worktree)
    monkeypatch.setattr(ab, "remove_worktree", lambda tree, root=None: None)
    monkeypatch.setattr(ab, "run_round", run_round)
    monkeypatch.setattr(ab, "run_lockstep_round", run_lockstep_round)
    monkeypatch.setattr(ab, "planned", lambda suite, select: {"steps": [STEP_1B, STEP_100M]})
    state["options"] = ab.Options(
        suite="full", results=results, warmup=1, min_rounds=4, max_rounds=8
    )
    return state


def pairing(state, name: str = "*") -> dict:
    (path,) = Path(state["options"].results, "h100-sxm", "ab").glob(f"{name}.json")
    return json.loads(path.read_text())


def test_same_code_passes_with_nothing_measured(fake):
    fake["commits"]["HEAD"] = fake["commits"]["BASE"]
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_OK and fake["calls"] == []


def test_an_unknown_ref_is_nothing_to_compare(fake, capsys):
    assert ab.ab("BASE", "nosuch", fake["options"]) == ab.EXIT_NOTHING
    assert "nosuch" in capsys.readouterr().err


def test_neutral_change_passes_after_the_fewest_rounds_in_abba_order(fake):
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_OK
    assert fake["calls"] == ab.order(5)  # one warm-up pair, four judged
    assert fake["calls"][:6] == ["base", "head", "head", "base", "base", "head"]
    record = pairing(fake)
    assert (
        len(record["base"]["runs"]) == len(record["head"]["runs"]) == 5
        and record["warmup_pairs"] == 1
    )
    assert record["gpu_uuids"] == ["GPU-test"] and record["exit"] == 0
    step = next(v for v in record["verdicts"] if v["key"] == STEP_1B and v["quantity"] == "time")
    assert (
        step["class"] == "device-bound" and step["verdict"] == NO_CHANGE and len(step["base"]) == 4
    )


def test_a_five_percent_slower_1b_step_is_a_regression(fake):
    fake["levels"]["head"] = 105.0
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_REGRESSION
    verdicts = {(v["key"], v["quantity"]): v["verdict"] for v in pairing(fake)["verdicts"]}
    assert verdicts[STEP_1B, "time"] == REGRESSION and verdicts[STEP_1B, "peak memory"] == NO_CHANGE


def test_the_warm_up_pair_is_not_judged(fake, monkeypatch):
    """Mutation: a cold first pair (head 40% slower in its warm-up round only) must not decide."""
    original = fake["levels"]
    seen = {"head": 0}

    def level(label):
        seen[label] = seen.get(label, 0) + 1
        return 140.0 if label == "head" and seen[label] == 1 else 100.0

    class Levels(dict):
        def __getitem__(self, label):
            return level(label)

    fake["levels"] = Levels(original)
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_OK


def test_the_first_pair_is_judged_but_for_its_compile_seconds(fake):
    """Mutation: with no warm-up pair, the first pair's times decide with the rest, and its compile
    seconds do not: the head's first round compiling 3x longer (the caches it fills) is no
    regression, 3x longer in every round is one. Compile is required here, so the rounds go on
    until four judge it."""
    require = ("device-bound", "memory", "compile")
    options = ab.Options(**{**fake["options"].__dict__, "warmup": 0, "require": require})
    rounds = {"head": 0}

    class ColdFirst(dict):
        def __getitem__(self, label):
            rounds[label] = rounds.get(label, 0) + 1
            return 90.0 if label == "head" and rounds[label] == 1 else 30.0

    fake["compile"] = ColdFirst()
    assert ab.ab("BASE", "HEAD", options) == ab.EXIT_OK
    assert fake["calls"] == ab.order(5)
    verdicts = {(v["key"], v["quantity"]): v for v in pairing(fake)["verdicts"]}
    assert len(verdicts[STEP_1B, "time"]["base"]) == 5
    assert len(verdicts[STEP_1B, "compile"]["base"]) == 4
    assert verdicts[STEP_1B, "compile"]["verdict"] == NO_CHANGE
    fake["calls"].clear()
    fake["compile"] = {"base": 30.0, "head": 90.0}
    assert ab.ab("BASE", "HEAD", options) == ab.EXIT_REGRESSION


def test_a_series_is_judged_over_the_rounds_that_measured_it():
    """A case not ok in one round of four (no values there) is judged from the other three, not
    dropped; a series one side never measured is not judged."""
    step = ab.Series(STEP_1B, "step", "time", "device")
    only_head = ab.Series(STEP_1B, "forward", "time", "device")
    base = [{step: 100.0 + i * 0.1} for i in range(4)]
    head = [{step: 100.0 + i * 0.1, only_head: 30.0} for i in range(3)] + [{}]
    (verdict,) = ab.judge(base, head, 0.95)
    assert verdict.series == step and (len(verdict.base), len(verdict.head)) == (4, 3)


def test_a_grid_process_entry_is_python_that_exits_after_measuring():
    source = ab.GRID_ENTRY.format("steps")
    compile(source, "<grid entry>", "exec")
    assert source.index("measure_suite(") < source.index("os._exit(0)")


def test_case_memory_of_two_meters_is_not_compared_and_ab_says_so():
    """Mutation: base's case peak by an earlier meter and head's by the current one are two names,
    never judged against each other, and ab notes it (meters_differ)."""
    earlier = ab.Series(STEP_1B, EARLIER_METER[0], "peak memory", "")
    current = ab.Series(STEP_1B, CASE_PEAK, "peak memory", "")
    base, head = [{earlier: 5e9}] * 4, [{current: 5e9}] * 4
    assert ab.judge(base, head, 0.95) == []
    assert ab.meters_differ(base, head) and not ab.meters_differ(head, head)


def test_a_sides_later_rounds_reuse_its_first_rounds_check(fake):
    """Each side checks in its first round; its later rounds name that run and check nothing."""
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_OK
    first_run = {label: f"run{fake['calls'].index(label):02d}" for label in ("base", "head")}
    for label in ("base", "head"):
        mine = [c for side, c in fake["checked_in"] if side == label]
        assert mine[0] is None and set(mine[1:]) == {first_run[label]}


def test_memory_is_judged_from_rounds_that_reused_a_check_alone(fake):
    """Mutation: a process that ran its check holds 100 MiB more; judged with the rounds that
    reused it, the first pair's memory would leave case memory undecided, or flag it."""
    options = ab.Options(**{**fake["options"].__dict__, "warmup": 0})
    assert ab.ab("BASE", "HEAD", options) == ab.EXIT_OK
    verdicts = {(v["key"], v["metric"]): v for v in pairing(fake)["verdicts"]}
    resident = verdicts[STEP_1B, CASE_RESIDENT]
    assert resident["verdict"] == NO_CHANGE and len(resident["base"]) == 3


def test_where_a_sides_code_cannot_reuse_a_check_no_side_does(fake):
    """Mutation: a base that checks in every round against a head that reuses its check would
    read the check's 100 MiB as the head's saving."""
    fake["reuses_checks"]["BASE"] = False
    options = ab.Options(**{**fake["options"].__dict__, "warmup": 0})
    assert ab.ab("BASE", "HEAD", options) == ab.EXIT_OK
    assert {c for _, c in fake["checked_in"]} == {None}
    verdicts = {(v["key"], v["metric"]): v for v in pairing(fake)["verdicts"]}
    assert len(verdicts[STEP_1B, CASE_RESIDENT]["base"]) == 4


def test_a_side_whose_check_fails_checks_again_in_every_round(fake):
    """Mutation: a wrong head whose first failed check were reused would be timed unchecked in
    every later round."""
    fake["status"]["head"] = "wrong"
    ab.ab("BASE", "HEAD", fake["options"])
    assert [c for label, c in fake["checked_in"] if label == "head"] == [None] * fake[
        "calls"
    ].count("head")


def test_a_reused_check_reaches_its_grid_process_and_a_stray_one_does_not(tmp_path, monkeypatch):
    """Mutation: a grid process left the caller's OPTBENCH_CHECKED_IN would skip the first round's
    checks."""
    seen = []

    def run(args, cwd, env, stdout, stderr):
        seen.append(env.get(ab.CHECKED_IN_VARIABLE))
        return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(ab.subprocess, "run", run)
    monkeypatch.setenv(ab.CHECKED_IN_VARIABLE, "a stray run")
    side = ab.Side("base", "BASE", "a" * 40, tree=tmp_path)
    settings = ab.Settings(suite="full", select="Step", results=tmp_path / "results")
    ab.run_round(side, settings, {"steps": [STEP_1B]}, tmp_path / "logs", {"steps": "r1"})
    ab.run_round(side, settings, {"steps": [STEP_1B]}, tmp_path / "logs")
    assert seen == ["r1", None]


def test_a_side_reuses_the_run_that_checked_every_case_its_code_has():
    """A case a side's code lacks (never stored) does not hold its reuse up; one not yet ok does,
    until a run passes every check."""
    side = ab.Side("base", "BASE", "a" * 40, checked={"r1": {STEP_1B}}, stored={STEP_1B})
    assert side.checked_in([STEP_1B, STEP_100M]) == "r1"
    side.stored.add(STEP_100M)
    assert side.checked_in([STEP_1B, STEP_100M]) is None
    side.checked["r2"] = {STEP_100M}
    assert side.checked_in([STEP_1B, STEP_100M]) is None
    side.checked["r3"] = {STEP_1B, STEP_100M}
    assert side.checked_in([STEP_1B, STEP_100M]) == "r3"
    assert ab.Side("head", "HEAD", "b" * 40).checked_in([STEP_1B]) is None


def test_a_case_one_side_lacks_does_not_stop_both_reusing_checks(fake):
    """Mutation: counting a case the base's code lacks as unchecked, no side would ever reuse."""
    fake["lacks"]["base"] = {STEP_100M}
    options = ab.Options(**{**fake["options"].__dict__, "warmup": 0})
    assert ab.ab("BASE", "HEAD", options) == ab.EXIT_OK
    assert set(fake["checked_in"][2:]) == {("base", "run00"), ("head", "run01")}


def test_no_side_reuses_a_check_until_every_side_has_one(fake):
    """Mutation: a head reusing its check in the round where the base, wrong in its first round,
    checks again would carry a check's memory on one side alone."""
    rounds = {"base": 0}

    class BaseWrongFirst(dict):
        def __getitem__(self, label):
            rounds[label] = rounds.get(label, 0) + 1
            return "wrong" if label == "base" and rounds[label] == 1 else "ok"

    fake["status"] = BaseWrongFirst()
    options = ab.Options(**{**fake["options"].__dict__, "warmup": 0})
    ab.ab("BASE", "HEAD", options)
    assert fake["checked_in"][:4] == [
        ("base", None),
        ("head", None),
        ("head", None),
        ("base", None),
    ]
    assert set(fake["checked_in"][4:]) == {("base", "run03"), ("head", "run01")}


def test_memory_of_cases_that_never_reuse_a_check_is_judged_from_every_round(fake):
    """Mutation: where checks are reused but a grid never honours it (the matmul and anchor grids),
    leaving out the memory of rounds that checked would leave it out of every round, unjudged."""
    fake["honours_checked_in"] = False
    options = ab.Options(**{**fake["options"].__dict__, "warmup": 0})
    assert ab.ab("BASE", "HEAD", options) == ab.EXIT_OK
    verdicts = {(v["key"], v["metric"]): v for v in pairing(fake)["verdicts"]}
    resident = verdicts[STEP_1B, CASE_RESIDENT]
    assert resident["verdict"] == NO_CHANGE and len(resident["base"]) == 4


def test_a_case_failing_at_head_is_a_regression(fake, capsys):
    fake["status"]["head"] = "wrong"
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_REGRESSION
    assert f"REGRESSION: {STEP_1B}" in capsys.readouterr().out


@pytest.mark.parametrize("head_ms", [96.5, 97.1, 97.5])
def test_a_head_faster_by_about_the_threshold_is_decided_at_the_fewest_rounds(fake, head_ms):
    """A 1B step 2.5-3.5% faster (noise 0.3% a run) has an interval that may straddle the
    improvement bound, 1/1.03: below 1.03 whatever it straddles, so it is decided (``not slower``
    or ``improvement``) after the fewest judged pairs. Mutation: holding such a verdict
    undecided spends pairs up to --max-rounds on how much faster."""
    fake["levels"]["head"] = head_ms
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_OK
    opts = fake["options"]
    assert len(fake["calls"]) == 2 * (opts.warmup + opts.min_rounds)
    verdicts = {(v["key"], v["metric"], v["clock"]): v for v in pairing(fake)["verdicts"]}
    assert verdicts[STEP_1B, "step", "wall"]["verdict"] in (NOT_SLOWER, IMPROVEMENT)


def test_a_head_slower_by_about_the_threshold_runs_on(fake):
    """The mirror: a 1B step 3% slower straddles the regression bound, and the pairs run on to
    --max-rounds (a regression is not ruled out)."""
    fake["levels"]["head"] = 103.0
    assert ab.ab("BASE", "HEAD", fake["options"]) in (ab.EXIT_INCONCLUSIVE, ab.EXIT_REGRESSION)
    opts = fake["options"]
    assert len(fake["calls"]) > 2 * (opts.warmup + opts.min_rounds)


def test_a_required_class_left_undecided_is_inconclusive(fake):
    """Mutation: a 1B step whose noise (3% a run) cannot be decided at 3% in 8 rounds holds up the
    verdict while device-bound is required, and not once it is not."""
    fake["levels"] = {"base": 100.0, "head": 100.0}
    noisy_levels = fake["levels"]

    class Noisy(dict):
        def __getitem__(self, label):
            return noisy_levels[label] * (1 + random.gauss(0, 0.03))

    random.seed(3)
    fake["levels"] = Noisy()
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_INCONCLUSIVE
    assert len(fake["calls"]) == 2 * (1 + fake["options"].max_rounds)
    fake["calls"].clear()
    memory_only = ab.Options(**{**fake["options"].__dict__, "require": ("memory",)})
    assert ab.ab("BASE", "HEAD", memory_only) == ab.EXIT_OK


def test_a_host_bound_step_timed_in_fresh_processes_never_holds_up_the_verdict(fake, capsys):
    """Where a side cannot pair (code before lockstep), the 100M step (15% a run) is judged and
    reported in the ABBA rounds, inconclusive, and the gate passes after the fewest rounds; the
    console's last line says why that inconclusive verdict is not a required one."""
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_OK
    assert fake["calls"] == ab.order(5)
    step = next(v for v in pairing(fake)["verdicts"] if v["key"] == STEP_100M)
    assert step["class"] == "host-bound" and step["verdict"] == INCONCLUSIVE
    assert not step["paired"]
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("optbench ab: no regression; ")
    assert "none of them required (device-bound, memory, host-bound in lockstep rounds)" in last


def test_host_bound_steps_are_timed_in_lockstep_rounds_and_decided(fake):
    fake["lockstep"] = True
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_OK
    lockstep = [c for c in fake["calls"] if c.startswith("lockstep")]
    assert len(lockstep) == 2 * (1 + ab.LOCKSTEP_MIN_ROUNDS)  # a warm-up round and six judged
    assert [c for c in fake["calls"] if not c.startswith("lockstep")] == ab.order(5)
    record = pairing(fake)
    assert [r["first"] for r in record["lockstep_rounds"][:3]] == ["base", "head", "base"]
    (step,) = (v for v in record["verdicts"] if v["key"] == STEP_100M and v["quantity"] == "time")
    assert step["paired"] and step["verdict"] == NO_CHANGE and len(step["base"]) == 6
    assert all(
        v["key"] == STEP_100M
        for v in record["verdicts"]
        if v["metric"] == "step" and v["class"] == "host-bound"
    )


def test_lockstep_rounds_take_each_cpu_twice_in_a_row_once_with_either_side_first(
    fake, monkeypatch
):
    """The rounds go through the CPUs in turn, each for two rounds in a row, the base first in the
    first of them and the head in the second: over 2 x 3 rounds on 3 CPUs every (CPU, first side)
    comes once. Mutation: the CPU moving on every round (``cpus[rounds % len(cpus)]``) left no CPU
    two rounds in a row, with both sides first."""
    fake["lockstep"], seen = True, []
    monkeypatch.setattr(ab, "lockstep_cpus", lambda: [3, 5, 9])
    faked = ab.run_lockstep_round

    def run_lockstep_round(sides, settings, groups, logs, cpu, base_first, checked=None):
        seen.append((cpu, base_first))
        return faked(sides, settings, groups, logs, cpu, base_first, checked)

    monkeypatch.setattr(ab, "run_lockstep_round", run_lockstep_round)
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_OK
    assert len(seen) == 1 + ab.LOCKSTEP_MIN_ROUNDS  # a warm-up round and six judged
    assert seen[:6] == [(3, True), (3, False), (5, True), (5, False), (9, True), (9, False)]
    assert seen[6:] == [(3, True)]  # and round again
    assert [(r["cpu"], r["first"] == "base") for r in pairing(fake)["lockstep_rounds"]] == seen


def test_a_fifteen_percent_slower_host_bound_step_is_a_regression_in_lockstep(fake):
    """Mutation: the host's 15% between rounds hides a 15% slowdown from fresh processes; paired
    samples find it."""
    fake["lockstep"], fake["host"]["head"] = True, 1.15
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_REGRESSION
    (step,) = (v for v in pairing(fake)["verdicts"] if v["key"] == STEP_100M and v["paired"])
    assert step["verdict"] == REGRESSION and 1.13 < step["ratio"] < 1.17


def test_a_lockstep_round_whose_pairing_broke_is_not_judged_paired(fake):
    """Mutation: samples a process took alone (its partner gone) must not pass as paired."""
    fake["lockstep"], fake["paired"], fake["host"]["head"] = True, False, 1.15
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_OK
    assert not any(v["paired"] for v in pairing(fake)["verdicts"])


def test_only_the_rounds_that_paired_a_series_count_toward_its_verdict(fake, capsys):
    """Mutation: rounds whose samples were not taken in turns must not bound the interval; with
    every other round unpaired, 9 lockstep rounds hold too few paired ones to decide."""
    fake["lockstep"], fake["paired"] = True, [True, False]
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_INCONCLUSIVE
    assert "was not timed in turns" in capsys.readouterr().err
    (step,) = (
        v
        for v in pairing(fake)["verdicts"]
        if v["key"] == STEP_100M and v["paired"] and v["metric"] == "step"
    )
    assert step["verdict"] == INCONCLUSIVE and len(step["base"]) < ab.LOCKSTEP_MIN_ROUNDS


def test_a_case_failing_at_head_in_lockstep_is_a_regression(fake, capsys):
    fake["lockstep"], fake["status"]["head"] = True, "wrong"
    assert ab.ab("BASE", "HEAD", fake["options"]) == ab.EXIT_REGRESSION
    assert f"REGRESSION: {STEP_100M}" in capsys.readouterr().out


def test_the_time_budget_stops_the_rounds_and_says_what_would_reach_the_minimum(fake, capsys):
    options = ab.Options(**{**fake["options"].__dict__, "time_budget": 0.0})
    assert ab.ab("BASE", "HEAD", options) == ab.EXIT_INCONCLUSIVE
    assert fake["calls"] == ["base", "head", "head", "base"]  # the warm-up pair and one judged pair
    err = capsys.readouterr().err
    assert "1 judged ABBA pairs, short of the 4 they need" in err
    assert "lockstep" not in err  # none to run: no shortfall to report


@pytest.mark.parametrize("slow_first", [True, False])
def test_two_heads_share_the_base_rounds_and_each_gets_its_own_verdict(fake, capsys, slow_first):
    """A planted slowdown (1B step 5%, host-bound step 15%) and a neutral change in one job: the
    base runs once a pass (base, head 1, head 2, then the reverse), lockstep rounds pair the base
    with each head in turn, and ab exits with the worst. Mutation: a head's runs counted as
    another's (the neutral head judged from the slow one's rounds) flags the neutral change."""
    fake["lockstep"] = True
    slow_label, neutral_label = ("head 1", "head 2") if slow_first else ("head 2", "head 1")
    fake["levels"][slow_label], fake["host"][slow_label] = 105.0, 1.15
    heads = ["SLOW", "NEUTRAL"] if slow_first else ["NEUTRAL", "SLOW"]
    assert ab.ab("BASE", heads, fake["options"]) == ab.EXIT_REGRESSION
    passes = [c for c in fake["calls"] if not c.startswith("lockstep")]
    assert passes[:6] == ["base", "head 1", "head 2", "head 2", "head 1", "base"]
    assert passes.count("base") == passes.count("head 1") == 5  # a warm-up pass, four judged
    lockstep = [c for c in fake["calls"] if c.startswith("lockstep")]
    assert lockstep[:4] == ["lockstep base", "lockstep head 1", "lockstep base", "lockstep head 2"]
    slow, neutral = (
        pairing(fake, f"*-{label.replace(' ', '')}") for label in (slow_label, neutral_label)
    )
    for kept in (slow, neutral):  # each head its own warm-up, and either side first in turn
        rounds = kept["lockstep_rounds"]
        assert [r["kept"] for r in rounds[:2]] == ["warm-up", "judged"]
        assert [r["first"] for r in rounds[:4]] == ["base", "head", "base", "head"]
    assert (slow["exit"], neutral["exit"]) == (ab.EXIT_REGRESSION, ab.EXIT_OK)
    assert (slow["head"]["ref"], neutral["head"]["ref"]) == ("SLOW", "NEUTRAL")
    verdicts = {
        (v["key"], v["paired"]): v["verdict"] for v in slow["verdicts"] if v["metric"] == "step"
    }
    assert verdicts[STEP_1B, False] == verdicts[STEP_100M, True] == REGRESSION
    assert all(v["verdict"] != REGRESSION for v in neutral["verdicts"])
    # each record names the base runs its head was judged against: the shared ABBA runs and the
    # lockstep rounds it took part in, not the other head's
    assert len(set(slow["base"]["runs"]) & set(neutral["base"]["runs"])) == 5
    partners = {r["base"] for r in neutral["lockstep_rounds"]}
    assert partners <= set(neutral["base"]["runs"])
    assert not partners & {r["base"] for r in slow["lockstep_rounds"]}
    assert not partners & set(slow["base"]["runs"])
    out = capsys.readouterr().out
    assert f"{slow_label} SLOW" in out and f"{neutral_label} NEUTRAL" in out and "exit 1" in out


def test_a_head_with_the_base_code_is_dropped_and_two_heads_alike_are_refused(fake):
    fake["commits"]["SAME"] = fake["commits"]["BASE"]
    assert ab.ab("BASE", ["SAME"], fake["options"]) == ab.EXIT_OK and fake["calls"] == []
    # the one head left is the head, as if named alone
    assert ab.ab("BASE", ["SAME", "HEAD"], fake["options"]) == ab.EXIT_OK
    assert set(fake["calls"]) == {"base", "head"} and pairing(fake)["head"]["ref"] == "HEAD"
    fake["calls"].clear()
    fake["commits"]["TWIN"] = fake["commits"]["SLOW"]
    assert ab.ab("BASE", ["SLOW", "TWIN"], fake["options"]) == ab.EXIT_NOTHING


def test_the_command_line_takes_one_head_or_several(monkeypatch):
    seen = []
    monkeypatch.setattr(ab, "ab", lambda base, heads, options: seen.append((base, heads)) or 0)
    assert ab.main(["BASE", "HEAD"]) == 0 and ab.main(["BASE", "H1", "H2", "--select", "x"]) == 0
    assert seen == [("BASE", ["HEAD"]), ("BASE", ["H1", "H2"])]
    with pytest.raises(SystemExit):
        ab.main(["BASE"])  # a head is required


# Bisection.


@pytest.mark.parametrize("first", range(6))
def test_bisection_names_the_first_bad_commit(first):
    commits = [f"c{i}" for i in range(6)]
    asked = []

    def is_bad(c):
        asked.append(c)
        return commits.index(c) >= first

    assert bisect.first_bad(commits, is_bad) == (first, None)
    assert len(asked) <= 3


def test_bisection_stops_at_an_undecided_step():
    commits = [f"c{i}" for i in range(8)]
    index, undecided = bisect.first_bad(commits, lambda c: None)
    assert undecided == 3 and index == 7


def test_bisect_compares_every_step_with_good(monkeypatch, capsys):
    """Mutation: comparing a step with its neighbour would let two small steps each pass."""
    seen = []
    monkeypatch.setattr(bisect, "commits_between", lambda good, bad: ["c1", "c2", "c3", "c4"])
    monkeypatch.setattr(bisect, "_subject", lambda c: c)
    monkeypatch.setattr(
        bisect,
        "ab",
        lambda base, head, options: (
            seen.append((base, head)) or (ab.EXIT_REGRESSION if head >= "c2" else ab.EXIT_OK)
        ),
    )
    assert bisect.main(["GOOD", "BAD", "--select", "x"]) == 0
    assert {base for base, _ in seen} == {"GOOD"}
    assert "first bad commit is c2" in capsys.readouterr().out


def test_bisect_without_a_range_is_nothing_to_search(monkeypatch):
    monkeypatch.setattr(bisect, "commits_between", lambda good, bad: [])
    assert bisect.main(["GOOD", "BAD", "--select", "x"]) == ab.EXIT_NOTHING


def test_a_round_measures_exactly_its_groups_cases(tmp_path, monkeypatch):
    """Mutation: a round that runs the whole --select (its host-bound cases too) measures those
    twice, in fresh processes and in lockstep."""
    seen = []

    def run(args, cwd, env, stdout, stderr):
        seen.append(env["OPTBENCH_SELECT"])
        return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(ab.subprocess, "run", run)
    side = ab.Side("base", "BASE", "a" * 40, tree=tmp_path)
    settings = ab.Settings(suite="full", select="Step", results=tmp_path / "results")
    ab.run_round(side, settings, {"steps": [STEP_1B]}, tmp_path / "logs")
    assert [re.fullmatch(s, k) is not None for s in seen for k in (STEP_1B, STEP_100M)] == [
        True,
        False,
    ]


@pytest.mark.parametrize(
    ("key", "paired"),
    [
        (STEP_100M, True),
        ("bench_anchors.HFCompileStep|size=100M", True),
        (STEP_1B, False),
        ("bench_step.Step100M|variant=best-kernels", False),  # a CUDA graph: device-bound
        ("bench_kernels.SwiGLU|shape=8192x5632|impl=triton", False),
    ],
)
def test_only_one_process_host_bound_steps_go_to_lockstep(key, paired):
    assert ab.host_bound(key) is paired


NEW, OLD = "optbench/measure/lockstep.py", "optbench/core/lockstep.py"


@pytest.mark.parametrize(
    ("modules", "paired"),
    [
        ((NEW, NEW), True),
        ((OLD, NEW), True),  # a base from before the rooms of optbench/
        ((OLD, OLD), True),
        ((None, NEW), False),  # a base from before lockstep
        ((NEW, "optbench/measure/timing.py"), False),
    ],
)
def test_host_bound_steps_go_to_lockstep_where_every_side_has_it_at_either_path(
    tmp_path, modules, paired
):
    trees = []
    for side, module in zip(("base", "head"), modules):
        tree = tmp_path / side
        tree.mkdir()
        if module:
            (tree / module).parent.mkdir(parents=True)
            (tree / module).write_text("")
        trees.append(tree)
    groups = {"steps": [STEP_100M, STEP_1B]}
    abba, lockstep = ab.split_lockstep(groups, trees)
    assert (abba, lockstep) == (
        ({"steps": [STEP_1B]}, {"steps": [STEP_100M]}) if paired else (groups, {})
    )


def test_a_verdict_reads_in_its_table_as_measured():
    """Memory from 1 GiB on in GiB (never '3.125e+04 MiB'); a ratio bounded on neither side reads
    'unbounded', not an estimate that may point the other way from the medians shown beside it."""
    memory = ab.Series(STEP_1B, CASE_PEAK, "peak memory", "")
    peak = ab.Verdict(memory, "memory", 0.01, (2**35,) * 3, (2**35,) * 3, Ratio(1, 1, 1, 3, 3))
    assert ab._fmt(peak)[1:6] == (
        "case peak",
        "memory 1%",
        "32 GiB",
        "32 GiB",
        "1.000x [1.000, 1.000]",
    )
    compile_ = ab.Series(STEP_1B, "compile", "compile", "")
    base, head = (3.922, 3.306, 3.989), (3.801, 4.267, 3.72)  # ab 20261129T162342Z-9ea066, 100M
    loose = ab.Verdict(compile_, "compile", 0.15, base, head, ratio(base, head))
    assert ab._fmt(loose)[1] == "compile" and ab._fmt(loose)[5] == "unbounded"
    kernel = ab.Verdict(memory, "memory", 0.01, (2**29,) * 3, (2**29,) * 3, Ratio(1, 1, 1, 3, 3))
    assert ab._fmt(kernel)[3] == "512 MiB"
