"""Lockstep pairs (optbench.measure.lockstep) between real processes on a CPU, timing's turns, and
the paired interval ab judges them with (synthetic shifts: test data, not measurements)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from optbench.gate.ratio import INCONCLUSIVE, NO_CHANGE, REGRESSION, paired_ratio
from optbench.measure import lockstep
from optbench.measure.timing import measure
from optbench.run.runner import Case, measure_case

# One side: a session per label given, 5 samples each of ~20 ms of sleep, timestamps printed.
SIDE = textwrap.dedent(
    """
    import json, os, sys, time
    from optbench.measure.lockstep import partner
    out, fail_at = [], int(os.environ.get("FAIL_AT", "-1"))
    pair = partner()
    for label in sys.argv[1:]:
        try:
            with pair.session(label) as turns:
                for i in range(5):
                    with turns():
                        if i == fail_at and label == sys.argv[1]:
                            raise RuntimeError("planted failure")
                        start = time.monotonic()
                        time.sleep(0.02)
                        out.append((start, time.monotonic()))
                out.append(turns.paired)
        except RuntimeError:
            out.append("failed")
        out.append(pair.paired)
    print(json.dumps(out))
    """
)


def _pair(
    labels_a: list[str], labels_b: list[str], cpu: int, fail_b_at: int = -1
) -> tuple[list, list]:
    a_read, b_write = os.pipe()
    b_read, a_write = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = []
    for (read_fd, write_fd), first, labels in (
        ((a_read, a_write), True, labels_a),
        ((b_read, b_write), False, labels_b),
    ):
        env[lockstep.ENV] = lockstep.Partner.env_value(read_fd, write_fd, first, cpu)
        env["FAIL_AT"] = str(-1 if first else fail_b_at)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", SIDE, *labels],
                env=dict(env),
                stdout=subprocess.PIPE,
                text=True,
                pass_fds=(read_fd, write_fd),
            )
        )
    for fd in (a_read, a_write, b_read, b_write):
        os.close(fd)
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    return outs[0], outs[1]


def _cpu() -> int:
    return sorted(os.sched_getaffinity(0))[-1]


def test_two_processes_take_turns_one_sample_each_and_never_overlap():
    a, b = _pair(["case step"], ["case step"], _cpu())
    assert a[-2:] == b[-2:] == [True, True]
    spans = sorted([(*s, "a") for s in a[:-2]] + [(*s, "b") for s in b[:-2]])
    assert [owner for *_, owner in spans] == ["a", "b"] * 5
    assert all(end <= next_start for (_, end, _), (next_start, _, _) in zip(spans, spans[1:]))


def test_partners_timing_different_cases_time_alone_and_say_so():
    """Mutation: a partner on another case must not pass as paired."""
    a, b = _pair(["case step"], ["other step"], _cpu())
    assert a[-2:] == b[-2:] == [False, False]
    assert len(a) == len(b) == 7  # each still took its samples


def test_a_partner_that_ended_leaves_the_other_alone_at_once():
    a, b = _pair(["case step", "case forward"], ["case step"], _cpu())
    assert a[5:7] == b[5:7] == [True, True]
    assert a[-2:] == [False, False] and len(a) == 14


def test_a_partner_whose_case_fails_midway_leaves_the_other_to_finish_alone_then_pairs_again():
    """Mutation: the failing side's closing meet taken for a turn deadlocked both until the case
    budget, and the healthy side's case was recorded as a timeout."""
    start = time.monotonic()
    a, b = _pair(["case step", "next step"], ["case step", "next step"], _cpu(), fail_b_at=2)
    assert time.monotonic() - start < lockstep.WAIT_S / 2
    assert b[:2] == [[*b[0]], [*b[1]]] and b[2:4] == ["failed", True]
    assert len([s for s in a[:6] if isinstance(s, list)]) == 5 and a[5:7] == [False, True]
    assert a[-2:] == b[-2:] == [True, True]  # the next session is paired again


WARMING = textwrap.dedent(
    """
    import json, os, time
    from optbench.measure.lockstep import partner
    pair, out = partner(), {}
    with pair.session("case step") as turns:
        time.sleep(float(os.environ["WARM_S"]))  # this side's warm-up, inside the timing
        out["warm_end"] = time.monotonic()
        for _ in range(3):
            with turns():
                out.setdefault("first_start", time.monotonic())
                time.sleep(0.01)
    print(json.dumps(out))
    """
)


def test_the_first_sample_waits_for_the_partners_warm_up():
    """Mutation: a barrier before the warm-ups let the first side's first sample run beside the
    other side's warm-up."""
    a_read, b_write = os.pipe()
    b_read, a_write = os.pipe()
    procs = []
    for (read_fd, write_fd), first, warm in (
        ((a_read, a_write), True, 0.0),
        ((b_read, b_write), False, 0.5),
    ):
        env = {**os.environ, "PYTHONPATH": os.getcwd(), "WARM_S": str(warm)}
        env[lockstep.ENV] = lockstep.Partner.env_value(read_fd, write_fd, first, _cpu())
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WARMING],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
                pass_fds=(read_fd, write_fd),
            )
        )
    for fd in (a_read, a_write, b_read, b_write):
        os.close(fd)
    a, b = (json.loads(p.communicate(timeout=120)[0]) for p in procs)
    assert a["first_start"] >= b["warm_end"]


def test_a_malformed_partner_variable_is_refused():
    with pytest.raises(ValueError):
        lockstep.Partner.from_env({lockstep.ENV: "3,4"})
    assert lockstep.Partner.from_env({}) is None


def _affinities() -> dict[int, set[int]]:
    """Each live thread's CPUs, by thread id (a thread that ended meanwhile is left out)."""
    found = {}
    for tid in lockstep._threads():
        with contextlib.suppress(OSError):
            found[tid] = os.sched_getaffinity(tid)
    return found


@pytest.mark.parametrize("fail_at", [None, 1])
def test_every_thread_gets_its_cpus_back_when_the_turns_end_also_where_the_timed_code_raises(
    fail_at,
):
    """A session's turns pin every thread of the process (here: this one and a helper thread with
    CPUs of its own) to the partner's CPU, and at the session's end, also where the timed code
    raises midway, give each thread back the CPUs it had (os.sched_getaffinity). The partner is this
    process itself, over one pipe: it meets and takes turns with its own lines. Mutation: unpinning
    outside a ``finally`` (Partner.session's ``yield`` not in try/finally) left the process pinned
    to one CPU after a case that raised."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to tell pinned from unpinned")
    cpu, other = allowed[-1], allowed[0]
    started, stop = threading.Event(), threading.Event()

    def helper() -> None:
        os.sched_setaffinity(0, {other})
        started.set()
        stop.wait(60)

    thread = threading.Thread(target=helper, daemon=True)
    thread.start()
    started.wait(60)
    before = _affinities()
    read_fd, write_fd = os.pipe()
    pinned = []
    try:
        assert before[thread.native_id] == {other} and before[threading.get_native_id()] != {cpu}
        pair = lockstep.Partner(read_fd, write_fd, first=True, cpu=cpu)
        with pytest.raises(RuntimeError) if fail_at is not None else contextlib.nullcontext():
            with pair.session("case step") as turns:
                for i in range(3):
                    with turns():
                        pinned.append(_affinities())
                        if i == fail_at:
                            raise RuntimeError("planted failure")
        assert turns.paired and pinned and all(a == {cpu} for a in pinned[-1].values())
        assert set(pinned[-1]) >= {thread.native_id, threading.get_native_id()}
        after = _affinities()
        alive = [tid for tid in before if tid in after]
        assert {thread.native_id, threading.get_native_id()} <= set(alive)
        assert {tid: after[tid] for tid in alive} == {tid: before[tid] for tid in alive}
    finally:
        for tid, cpus in before.items():  # whatever the outcome, this process is not left pinned
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)
        stop.set()
        thread.join(60)
        os.close(read_fd)
        os.close(write_fd)


def _skip_in_build():
    raise NotImplementedError("needs a CUDA GPU")


def _error_in_build():
    raise RuntimeError("planted failure")


@pytest.mark.parametrize(
    ("build", "status"), [(_skip_in_build, "skipped"), (_error_in_build, "error")]
)
def test_every_record_of_a_lockstep_process_is_marked_whatever_its_end(monkeypatch, build, status):
    """In a process with a partner, a case that ends before any timing (a skip or an error in its
    build) still has ``lockstep`` in its record, by which the store's one-figure view and the trends
    leave ab's paired design out; in one without, it has none. Mutation: marking the record only
    where a metric is timed in turns left a lockstep round's skipped and failed records unmarked."""
    case = Case({"case": status}, build)
    monkeypatch.setattr(lockstep, "partner", lambda: None)
    alone = measure_case(case, device="cpu", budget_s=30, key="bench_test.Grid|case")
    monkeypatch.setattr(lockstep, "partner", lambda: lockstep.Partner(-1, -1, True, 0))
    paired = measure_case(case, device="cpu", budget_s=30, key="bench_test.Grid|case")
    assert alone["status"] == paired["status"] == status and paired["metrics"] == {}
    assert "lockstep" not in alone and paired.get("lockstep") == {}


class CountingTurns:
    """Turns without a partner that count what timing asks of them."""

    samples = 7

    def __init__(self) -> None:
        self.entered = 0

    def __call__(self):
        from contextlib import contextmanager

        @contextmanager
        def turn():
            self.entered += 1
            yield

        return turn()


def test_timing_takes_exactly_the_turns_samples_each_in_a_turn():
    turns = CountingTurns()
    wall = measure(lambda: sum(range(1000)), device="cpu", rep_ms=50, turns=turns).wall
    assert wall.n == turns.samples == turns.entered


# The paired interval.


def _shifts(shift: float, sd: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [shift + rng.gauss(0, sd) for _ in range(n)]


def test_six_rounds_are_the_fewest_that_bound_the_paired_interval():
    assert paired_ratio(_shifts(0.0, 0.02, 5, 1)).low == 0.0
    six = paired_ratio(_shifts(0.0, 0.02, 6, 1))
    assert 0.0 < six.low < 1.0 < six.high < float("inf")


@pytest.mark.parametrize("seed", range(5))
def test_a_fifteen_percent_shift_at_three_percent_noise_is_a_regression_in_eight_rounds(seed):
    r = paired_ratio(_shifts(0.14, 0.03, 8, seed))
    assert r.verdict(0.10) == REGRESSION and 1.10 < r.estimate < 1.20


@pytest.mark.parametrize("seed", range(5))
def test_no_shift_at_three_percent_noise_is_no_change_in_eight_rounds(seed):
    r = paired_ratio(_shifts(0.0, 0.03, 8, seed))
    assert r.verdict(0.10) == NO_CHANGE and r.low < 1.0 < r.high


def test_one_wild_round_moves_the_estimate_by_little_and_leaves_it_undecided_not_wrong():
    shifts = [0.0, 0.01, -0.01, 0.02, -0.02, 0.9]
    r = paired_ratio(shifts)
    assert r.estimate < 1.03 and r.verdict(0.10) == INCONCLUSIVE
    with pytest.raises(ValueError):
        paired_ratio([])
