"""Shards of a suite (optbench.suite.shard): every case in exactly one shard, balanced by the
cases' times, the same shards for the same inputs; ``--shard`` and ``--gpus`` on the command line,
the GPUs faked."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from synthetic_results import commit, record, save

from optbench import cli
from optbench.run import progress
from optbench.store.store import ResultStore, record_key, split_key
from optbench.suite import catalog, shard
from optbench.suite.catalog import BENCHMARKS

Split = Callable[[list[str], Mapping[str, float], int], list[list[str]]]


def problems(split: Split, keys: list[str], seconds: Mapping[str, float], count: int) -> list[str]:
    """What is wrong with ``split``'s shards of ``keys``: a case lost or in two shards, a shard over
    the mean by more than the longest case, other shards for the same input reordered."""
    found = []
    shards = split(keys, seconds, count)
    placed = [k for s in shards for k in s]
    if len(shards) != count:
        found.append(f"{len(shards)} shards, not {count}")
    if sorted(placed) != sorted(keys):
        found.append("not every case exactly once")
    weight = shard.weights(keys, seconds)
    loads = [sum(weight[k] for k in s) for s in shards]
    if weight and max(loads) > sum(loads) / count + max(weight.values()) + 1e-9:
        found.append(f"unbalanced: {loads}")
    again = split(list(reversed(keys)), seconds, count)
    if [set(s) for s in again] != [set(s) for s in shards]:
        found.append("depends on the order of the keys")
    return found


def inputs(seed: int) -> tuple[list[str], dict[str, float], int]:
    """Random keys, times (heavy-tailed, some unknown) and a shard count."""
    rng = random.Random(seed)
    keys = [f"bench_{rng.randrange(5)}.Case|i={i}" for i in range(rng.randrange(0, 40))]
    seconds = {k: rng.paretovariate(1.2) * 5 for k in keys if rng.random() < 0.8}
    return keys, seconds, rng.randrange(1, 9)


SEEDS = range(300)


def test_shards_are_complete_disjoint_balanced_and_order_free():
    for seed in SEEDS:
        assert problems(shard.split, *inputs(seed)) == [], seed


def test_the_same_input_gives_the_same_shards_in_the_keys_order():
    keys, seconds, _ = inputs(7)
    assert shard.split(keys, seconds, 3) == shard.split(list(keys), dict(seconds), 3)
    for s in shard.split(keys, seconds, 3):
        assert s == [k for k in keys if k in s]


def test_longest_first_into_the_emptiest_and_ties_by_key():
    seconds = {"a": 10.0, "b": 6.0, "c": 5.0, "d": 5.0, "e": 4.0}
    # a to 1; b, c to 2 (6 < 10, then 11); d (5, 'c' < 'd' took 2) to 1; e to 2: 15 s each
    assert shard.split(list("edcba"), seconds, 2) == [["d", "a"], ["e", "c", "b"]]
    assert shard.split(["y", "x"], {}, 2) == [["x"], ["y"]]  # equal weights: by key
    assert shard.split(["a"], {}, 3) == [["a"], [], []]


def test_a_case_never_run_weighs_the_median_of_the_known_or_1():
    assert shard.weights(["a", "b", "c", "new"], {"a": 1.0, "b": 3.0, "c": 20.0}) == {
        "a": 1.0,
        "b": 3.0,
        "c": 20.0,
        "new": 3.0,
    }
    assert shard.weights(["a", "b"], {"other": 9.0}) == {"a": 1.0, "b": 1.0}


def test_a_case_never_run_weighs_what_its_benchmark_s_known_cases_take():
    """A variant first run at 1B weighs the 1B steps' median, not the suite's (most cases are
    kernels of a few seconds). Mutation: the median of every known case weighs them 4 s."""
    seconds = {
        **{f"bench_kernels.SwiGLU|shape={i}": 4.0 for i in range(9)},
        "bench_step.Step1B|variant=eager": 40.0,
        "bench_step.Step1B|variant=best-kernels": 44.0,
    }
    new = [f"bench_step.Step1B|variant=fp8-{i}" for i in range(3)]
    weight = shard.weights([*seconds, *new], seconds)
    assert all(weight[k] == 42.0 for k in new)
    assert (
        shard.weights(["bench_kernels.RoPE|shape=1", *seconds], seconds)[
            "bench_kernels.RoPE|shape=1"
        ]
        == 4.0
    )  # a benchmark never run here: the median of every known case


def dropping(keys, seconds, count):  # loses the last case
    return shard.split(keys[:-1], seconds, count)


def doubling(keys, seconds, count):  # puts the longest case in two shards
    shards = shard.split(keys, seconds, count)
    if count > 1 and keys:
        longest = max(keys, key=lambda k: shard.weights(keys, seconds)[k])
        next(s for s in shards if longest not in s).append(longest)
    return shards


def round_robin(keys, seconds, count):  # ignores the times
    ordered = sorted(keys)
    return [ordered[i::count] for i in range(count)]


def first_come(keys, seconds, count):  # by time, but ties in the keys' order, not the keys' sort
    return shard.split(keys, {k: seconds.get(k, 1.0) + i * 1e-9 for i, k in enumerate(keys)}, count)


@pytest.mark.parametrize(
    "planted", [dropping, doubling, round_robin, first_come], ids=lambda f: f.__name__
)
def test_a_planted_bug_is_caught(planted):
    assert any(problems(planted, *inputs(seed)) for seed in SEEDS)


def test_round_robin_is_caught_by_the_times_alone():
    seconds = {"a": 10.0, "b": 1.0, "c": 10.0, "d": 1.0, "e": 10.0, "f": 1.0}
    assert problems(round_robin, list(seconds), seconds, 2) == ["unbalanced: [30.0, 3.0]"]


def test_the_pattern_matches_exactly_the_keys():
    keys = ["bench_step.Step1B|variant=best", "bench_kernels.RMSNorm|impl=eager|shape=16384x768"]
    regex = shard.pattern(keys)
    assert all(re.search(regex, k) for k in keys)
    others = [
        "bench_step.Step1B|variant=best2",
        "xbench_step.Step1B|variant=best",
        "bench_step.Step1B|variant=bes",
    ]
    assert not any(re.search(regex, k) for k in others)
    assert not re.search(shard.pattern([]), "anything") and not re.search(shard.pattern([]), "")


def test_the_shards_of_a_suite_select_every_planned_case_once(tmp_path, capsys):
    planned = progress.planned_cases(BENCHMARKS.values(), "full", "Step")
    regexes = [
        shard.shard_select((i, 3), "full", "Step", ResultStore(tmp_path), "h100-sxm", commit(1))
        for i in (1, 2, 3)
    ]
    chosen = [[k for k in progress.planned_cases(BENCHMARKS.values(), "full", r)] for r in regexes]
    owned = shard.split(planned, {}, 3, lambda key: catalog.with_references([key], planned))
    assert sorted(k for c in owned for k in c) == sorted(planned) and all(owned)
    for mine, own in zip(chosen, owned):
        # its own cases, and the references of theirs that it lacks (each speedup within one run)
        assert mine == catalog.with_references(own, planned) and set(own) <= set(mine)
        for key in mine:
            benchmark, params = split_key(key)
            refs = {record_key(benchmark, p) for p in catalog.references(benchmark, params)}
            assert refs & set(planned) <= set(mine)
    extra = len(chosen[0]) - len(owned[0])
    assert 0 < extra < len(owned[0])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        f"optbench: shard 1/3: {len(owned[0])} of {len(planned)} cases and {extra} of their "
        "references, expected ~"
    )


def timed(seconds: Mapping[str, float]) -> list[dict]:
    """Records of the keys of ``seconds``, each with its seconds."""
    return [
        {**record(k.split("|")[0], dict(p.split("=") for p in k.split("|")[1:])), "seconds": s}
        for k, s in seconds.items()
    ]


def test_the_times_come_from_other_commits_runs_of_this_machine(tmp_path, capsys):
    """A shard's split ignores the records of the commit it measures (those its sibling shards store
    meanwhile) and other machines'."""
    keys = progress.planned_cases(BENCHMARKS.values(), "full", r"Step100M\|")
    store = ResultStore(tmp_path)
    slow = timed({**{k: 1.0 for k in keys[:-1]}, keys[-1]: 1000.0})
    save(store, "h100-sxm", commit(1), "2026-01-01T00:00:00+00:00", slow)
    other = timed({**{k: 1.0 for k in keys[:-1]}, keys[-1]: 0.001})
    save(store, "h100-sxm", commit(2), "2026-01-02T00:00:00+00:00", other)
    save(store, "t4", commit(1), "2026-01-01T00:00:00+00:00", other)
    regexes = [
        shard.shard_select((i, 2), "full", r"Step100M\|", store, "h100-sxm", commit(2))
        for i in (1, 2)
    ]
    chosen = [[k for k in keys if re.search(r, k)] for r in regexes]
    # 1000 s (fp16-scaler) alone with its reference (1 s), against the rest
    assert keys[-2:] == [precision("eager"), precision("fp16-scaler")]
    assert chosen == [keys[-2:], keys[:-1]]
    assert capsys.readouterr().out.startswith(
        f"optbench: shard 1/2: 1 of {len(keys)} cases and 1 of their references, expected ~1001 s "
        f"(every shard: 1001, {len(keys) - 1} s; 0 cases never run here"
    )


def precision(variant: str) -> str:
    return record_key("bench_precision.Step100M", {"variant": variant})


def test_a_case_joins_the_shard_of_its_reference_unless_another_is_emptier_by_more():
    """Longest first: e (eager, 10 s) to 1; its variant a (4 s) to 1 beside it (14 against 4 + 10
    in 2: the first among equals); b to 2 with a second eager (18 against 14); c to 1 (18 = 18: the
    first); x (no reference, 3 s) to 2 (17 against 21). Without references: the emptiest."""
    seconds = {"e": 10.0, "a": 4.0, "b": 4.0, "c": 4.0, "x": 3.0}
    needs = {"a": ["e"], "b": ["e"], "c": ["e"]}
    shards = shard.split(list(seconds), seconds, 2, lambda k: needs.get(k, []))
    assert shards == [["e", "a", "c"], ["b", "x"]]
    assert shard.split(list(seconds), seconds, 2) == [["e", "x"], ["a", "b", "c"]]


@pytest.mark.parametrize("text,parsed", [("1/1", (1, 1)), ("2/4", (2, 4)), (" 3 / 3 ", (3, 3))])
def test_shard_argument(text, parsed):
    assert shard.parse_shard(text) == parsed


BAD_SHARDS = ["0/2", "3/2", "1/0", "2", "a/b", "-1/2", "1/2/3", ""]


@pytest.mark.parametrize("text", BAD_SHARDS)
def test_a_bad_shard_is_a_usage_error(text, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--shard", text])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--shard" in err and "Traceback" not in err


def test_gpus_with_a_shard_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--gpus", "all", "--shard", "1/2"])
    assert exc.value.code == 2 and "without --shard" in capsys.readouterr().err


def test_gpus_without_a_gpu_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(shard, "cuda_device_count", lambda: 0)
    assert cli.main(["run", "--gpus", "all", "--no-html"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == "optbench run: --gpus all: no CUDA GPU visible here\n"


class FakeProcess:
    def __init__(self, code: int) -> None:
        self.code = code

    def wait(self, timeout: float | None = None) -> int:
        return self.code


def fake_start(codes: list[int]) -> tuple[list[dict], Callable[..., FakeProcess]]:
    calls: list[dict] = []

    def start(command, **kwargs):
        calls.append({"command": command, **kwargs, "log": Path(kwargs["stdout"].name)})
        return FakeProcess(codes[len(calls) - 1])

    return calls, start


def gpus_run(
    tmp_path,
    spec: str,
    codes: list[int],
    env: dict[str, str] | None = None,
    argv: tuple[str, ...] | None = None,
) -> tuple[int, list]:
    """``run_on_gpus`` on 4 faked GPUs, ``start`` faked: its exit status and what it started."""
    argv = argv or ("--suite", "quick", "--select", "Step", "--gpus", spec)
    calls, start = fake_start(codes)
    ids = iter(f"run-{i}" for i in range(10))
    code = shard.run_on_gpus(
        list(argv),
        spec,
        device_count=lambda: 4,
        start=start,
        env=env or {"PATH": "/bin"},
        root=tmp_path,
        machine="h100-sxm",
        new_run_id=lambda: next(ids),
    )
    return code, calls


def test_gpus_all_starts_one_shard_per_gpu_each_a_run_of_its_own(tmp_path, capsys):
    code, calls = gpus_run(tmp_path, "all", [0, 0, 0, 0])
    assert code == 0 and len(calls) == 4
    for n, call in enumerate(calls, 1):
        assert call["command"] == [
            sys.executable,
            "-m",
            "optbench",
            "run",
            "--suite",
            "quick",
            "--select",
            "Step",
            "--shard",
            f"{n}/4",
            "--no-html",
        ]
        assert call["env"] == {
            "PATH": "/bin",
            "CUDA_VISIBLE_DEVICES": str(n - 1),
            "OPTBENCH_RUN_ID": f"run-{n - 1}",
            "OPTBENCH_RUNS_AT_ONCE": "4",
        }
        assert call["cwd"] == tmp_path and call["stderr"] == subprocess.STDOUT
        assert call["log"] == tmp_path / "results" / "h100-sxm" / "progress" / f"run-{n - 1}.log"
        assert call["log"].exists()
    out = capsys.readouterr().out
    assert f"optbench: shard 2/4 on GPU 1: run run-1, log {calls[1]['log']}" in out
    assert "shard 4/4 on GPU 3 (run run-3) ended with exit 0" in out


def test_gpus_listed_map_through_the_visible_devices_and_the_first_failure_is_the_exit(tmp_path):
    code, calls = gpus_run(
        tmp_path,
        "0,2",
        [0, 3],
        env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"},
        argv=("--gpus=0,2", "--time-budget", "600"),
    )
    assert code == 3
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in calls] == ["4", "6"]
    assert [c["command"][4:] for c in calls] == [
        ["--time-budget", "600", "--shard", f"{n}/2", "--no-html"] for n in (1, 2)
    ]


@pytest.mark.parametrize("spec", ["4", "0,0", "x", "", "-1"])
def test_gpus_naming_no_gpu_here_is_one_line_and_exit_2(spec, tmp_path, capsys):
    code, calls = gpus_run(tmp_path, spec, [])
    assert code == 2 and calls == []
    err = capsys.readouterr().err
    assert err.startswith(f"optbench run: --gpus {spec}: ") and err.count("\n") == 1


def test_without_option_takes_every_spelling_of_it():
    argv = ["--suite", "full", "--gpus", "all", "--gpu=0,1", "--select", "x", "--gp", "1"]
    assert shard.without_option(argv, "--gpus") == ["--suite", "full", "--select", "x"]


def test_shards_writing_one_asv_results_file_at_once_keep_each_others_cases(tmp_path):
    """asv reads a commit's results file as it starts and writes it whole as it ends: the shard that
    ends last keeps the cases that another shard wrote meanwhile; a null never erases a value, a
    new value replaces an old one."""
    from optbench.asv import asv_atomic

    columns = ["result", "params", "version"]
    row = "bench_step.Step100M.track_step_ms"
    params = [["'eager'", "'best'", "'fused-ce'"]]

    def results(values: list[float | None]) -> dict:
        return {
            "commit_hash": "c",
            "result_columns": columns,
            "durations": {},
            "results": {row: [values, params, "1"]},
        }

    path = tmp_path / "asv" / "h100-sxm" / "c-existing-py.json"
    asv_atomic._write_json(path, results([80.0, None, 9.0]), api_version=2)  # shard 1 ends
    asv_atomic._write_json(path, results([None, 20.0, 7.0]), api_version=2)  # shard 2, read before
    written = json.loads(path.read_text())
    assert written["results"][row][0] == [80.0, 20.0, 7.0] and written["version"] == 2
    other = tmp_path / "asv" / "h100-sxm" / "machine.json"  # not a results file: written as it is
    asv_atomic._write_json(other, {"machine": "h100-sxm"}, api_version=1)
    asv_atomic._write_json(other, {"machine": "h100-sxm", "cpu": "x"}, api_version=1)
    assert json.loads(other.read_text()) == {"machine": "h100-sxm", "cpu": "x", "version": 1}


def test_the_cases_outside_a_shard_are_skipped_with_a_short_reason(monkeypatch):
    from optbench.suite import grids

    others = progress.planned_cases(BENCHMARKS.values(), "full", None)
    monkeypatch.setenv("OPTBENCH_SUITE", "cpu")
    monkeypatch.setenv("OPTBENCH_SELECT", shard.pattern(others))  # none of the CPU suite's cases
    kept = grids.measure_suite(["bench_step.StepTiny"])
    assert kept and {r["status"] for r in kept.values()} == {"skipped"}
    assert all(
        r["reason"].startswith("not selected in this run") and len(r["reason"]) < 150
        for r in kept.values()
    )


class HungProcess:
    """A shard that outlives its time budget: ends on SIGINT with 130 where ``obeys``, else only
    when killed."""

    def __init__(self, obeys: bool) -> None:
        self.obeys, self.signals, self.killed = obeys, [], False

    def wait(self, timeout: float | None = None) -> int:
        if self.killed or (self.obeys and self.signals):
            return -9 if self.killed else 130
        if timeout is None:
            raise AssertionError("waited on a hung shard without a limit")
        raise subprocess.TimeoutExpired("optbench", timeout)

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)

    def kill(self) -> None:
        self.killed = True


@pytest.mark.parametrize("obeys", [True, False])
def test_a_shard_past_its_time_budget_is_interrupted_then_killed(tmp_path, capsys, obeys):
    """With --time-budget, a shard still running a grace period past it gets SIGINT (the run
    records what it stopped), then is killed if it goes on: the others' results still come back.
    Mutation: waiting without a limit fails (the hung shard would hold every shard's results)."""
    hung = HungProcess(obeys)
    procs = iter([FakeProcess(0), hung, FakeProcess(0)])
    code = shard.run_on_gpus(
        ["--suite", "sweep", "--time-budget", "450", "--gpus", "0,1,2"],
        "0,1,2",
        time_budget=450.0,
        device_count=lambda: 4,
        start=lambda command, **kwargs: next(procs),
        env={"PATH": "/bin"},
        root=tmp_path,
        machine="h100-sxm",
    )
    assert hung.signals == [signal.SIGINT] and hung.killed == (not obeys)
    assert code == (130 if obeys else -9)
    out = capsys.readouterr().out
    assert "shard 2/3 on GPU 1 still runs 60 s past its time budget: interrupted" in out
    assert ("killed" in out) == (not obeys)


def test_the_machine_file_is_written_once_before_the_shards_and_not_without_gpus(tmp_path):
    """``prepare`` (asv's machine file, which every shard would otherwise write at once) runs once,
    before the first shard starts; where ``--gpus`` names no GPU, not at all."""
    events: list[str] = []

    def start(command, **kwargs):
        events.append("start")
        return FakeProcess(0)

    def launch(count: int) -> int:
        return shard.run_on_gpus(
            ["--gpus", "all"],
            "all",
            prepare=lambda: events.append("prepare"),
            device_count=lambda: count,
            start=start,
            env={"PATH": "/bin"},
            root=tmp_path,
            machine="h100-sxm",
        )

    assert launch(2) == 0 and events == ["prepare", "start", "start"]
    events.clear()
    assert launch(0) == 2 and events == []
