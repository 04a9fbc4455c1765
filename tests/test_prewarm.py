"""The compile warm-up (``optbench.suite.prewarm``): which cases it builds and when, how its
processes share the machine, and that one of them leaves a cache a later process compiles from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optbench.measure.hardware import lookup
from optbench.run import breakdown
from optbench.run.compile_cache import COLD
from optbench.store.settings import VARIABLES
from optbench.store.store import REPO_ROOT, record_key
from optbench.suite import catalog, prewarm

COMPILED = "bench_step.StepTiny|variant=compile-default"


def suite_keys(suite: str) -> list[str]:
    return [
        record_key(b.name, params) for b in catalog.BENCHMARKS.values() for params in b.cases(suite)
    ]


def test_compiles_names_the_full_suites_compiled_cases():
    keys = suite_keys("full")
    chosen = {key for key in keys if prewarm.compiles(key, "cpu")}
    kernels = {k for k in keys if k.startswith("bench_kernels.")}
    assert {k for k in kernels if k.endswith("impl=compile")} <= chosen
    assert not {k for k in kernels if not k.endswith("impl=compile")} & chosen
    for variant in ("compile-default", "compile-regional", "best-kernels", "best-compile-graph"):
        assert f"bench_step.Step100M|variant={variant}" in chosen
    for variant in ("eager", "triton-norm", "cuda-graph", "fused-ce"):
        assert f"bench_step.Step100M|variant={variant}" not in chosen
    assert "bench_step.Step1B|variant=best-kernels" in chosen
    # max-autotune's matmul templates, chosen by timing them, are part of the code it caches
    assert not prewarm.compiles("bench_step.Step100M|variant=compile-max-autotune", "cpu")


def test_wanted_only_where_a_gpu_run_starts_with_empty_caches():
    keys, h200, t4 = suite_keys("full"), lookup("h200"), lookup("t4")
    compiled = [key for key in keys if prewarm.compiles(key, "cpu")]
    assert prewarm.wanted(COLD, False, "cuda", keys, h200) == compiled
    assert prewarm.wanted(None, True, "cuda", keys, h200) == compiled
    assert prewarm.wanted(None, False, "cuda", keys, h200) == []  # caches this machine kept
    assert prewarm.wanted("restored nvidia-h200-x", True, "cuda", keys, h200) == []
    assert prewarm.wanted(COLD, True, "cpu", keys, h200) == []
    assert prewarm.wanted(COLD, True, "cuda", compiled[:1], h200) == []  # alone it gains nothing
    # a case the run skips on the GPU it runs on (or emulates) is not warmed either
    on_t4 = prewarm.wanted(COLD, True, "cuda", keys, t4)
    assert on_t4 == [k for k in compiled if prewarm.skip_reason(k, t4) is None]
    assert 1 < len(on_t4) < len(compiled)


def test_slots_share_the_cpus_among_runs():
    assert prewarm.slots(16) == 8
    assert prewarm.slots(16, runs_at_once=4) == 2
    assert prewarm.slots(1) == 1


def test_worker_env_leaves_the_check_and_the_progress_file_to_the_run():
    env = prewarm.worker_env({VARIABLES["progress"]: "/p.jsonl", "TORCHINDUCTOR_CACHE_DIR": "/c"})
    assert VARIABLES["progress"] not in env
    assert env[VARIABLES["checked_in"]] == prewarm.RUN_CHECKS
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/c"
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == str(prewarm.THREADS_PER_PROCESS)
    assert env[VARIABLES["prewarm_parent"]] == str(os.getpid())  # it ends when the run does


def _logging_worker(
    log: Path, exits: dict[str, int] | None = None, sleep_s: float = 0.0, meet: int = 1
):
    """A command for :func:`prewarm.warm`: a process that appends [key, 'start'|'end'] to ``log``,
    between them waits until ``meet`` processes have started (60 s at most: then it exits 1) and
    sleeps ``sleep_s``, and exits with ``exits[key]`` (default 0), saying so."""
    exits = exits or {}

    def command(key: str) -> list[str]:
        code = exits.get(key, 0)
        script = (
            "import json, sys, time\n"
            f"log = open({str(log)!r}, 'a')\n"
            f"log.write(json.dumps([{key!r}, 'start']) + '\\n'); log.flush()\n"
            "waited = time.time()\n"
            f"while open({str(log)!r}).read().count('start') < {meet}:\n"
            "    if time.time() - waited > 60: sys.exit(1)\n"
            "    time.sleep(0.05)\n"
            f"time.sleep({sleep_s})\n"
            f"log.write(json.dumps([{key!r}, 'end']) + '\\n'); log.flush()\n"
            f"print('worker of {key} exits {code}')\n"
            f"sys.exit({code})\n"
        )
        return [sys.executable, "-c", script]

    return command


def _events(log: Path) -> list[tuple[str, str]]:
    return [tuple(json.loads(line)) for line in log.read_text().splitlines()]


def test_warm_runs_its_processes_at_once_within_the_memory_they_fit(tmp_path):
    """Two processes at once (each of the first two waits for the other to start), never the two
    large ones together, the largest first (with the small one that fits beside it)."""
    log = tmp_path / "log.jsonl"
    need = {"big1": 60.0, "big2": 60.0, "s1": 10.0, "s2": 10.0, "s3": 10.0}
    command = _logging_worker(log, meet=2)
    out = prewarm.warm(need, {}, need=need, usable=100.0, processes=2, command=command)
    assert sorted(out.warmed) == sorted(need) and not out.failed
    running: set[str] = set()
    for key, what in _events(log):
        if what == "start":
            running.add(key)
            assert len(running) <= 2 and sum(need[k] for k in running) <= 100.0
        else:
            running.discard(key)
    assert {key for key, _ in _events(log)[:2]} == {"big1", "s1"}


def test_warm_starts_the_longest_earlier_cold_case_first(tmp_path):
    log = tmp_path / "log.jsonl"
    need = {"big": 60.0, "small": 10.0, "slow": 10.0, "unknown": 30.0}
    first = {"slow": 25.0, "big": 20.0, "small": 1.0}  # seconds in an earlier cold run
    out = prewarm.warm(
        need, {}, need=need, usable=100.0, processes=1, first=first, command=_logging_worker(log)
    )
    assert [key for key, what in _events(log) if what == "start"] == [
        "slow",
        "big",
        "small",
        "unknown",
    ]
    assert set(out.took) == set(need) and "the longest: " in out.line(1)


def test_warm_reports_each_start_and_end(tmp_path):
    seen: list[tuple[int, list[str]]] = []
    out = prewarm.warm(
        ["a", "b"],
        {},
        need={},
        usable=1.0,
        processes=1,
        command=_logging_worker(tmp_path / "log.jsonl", sleep_s=1.0),  # past the first poll
        report=lambda so_far, running: seen.append((len(so_far.warmed), running)),
    )
    assert sorted(out.warmed) == ["a", "b"]
    assert seen[0] == (0, ["a"]) and seen[-1] == (2, [])
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_warm_forgets_the_autotuning_its_processes_did(tmp_path):
    """A launch config chosen while other warm-up processes shared the GPU is removed; the
    compiled code stays."""
    cache = tmp_path / "inductor"
    script = (
        "import pathlib, sys\n"
        f"folder = pathlib.Path({str(cache)!r}) / 'ab'; folder.mkdir(parents=True, exist_ok=True)\n"
        "(folder / (sys.argv[1] + '.py')).write_text('code')\n"
        "(folder / (sys.argv[1] + '.best_config')).write_text('{}')\n"
    )
    out = prewarm.warm(
        ["k1", "k2"],
        {"TORCHINDUCTOR_CACHE_DIR": str(cache)},
        need={},
        usable=1.0,
        processes=2,
        command=lambda key: [sys.executable, "-c", script, key],
    )
    assert sorted(out.warmed) == ["k1", "k2"]
    assert sorted(p.name for p in (cache / "ab").iterdir()) == ["k1.py", "k2.py"]


def test_warm_ends_its_processes_where_it_raises(tmp_path, monkeypatch):
    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def popen(*args, **kwargs) -> subprocess.Popen:
        started.append(real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(prewarm.subprocess, "Popen", popen)
    sleeper = _logging_worker(tmp_path / "log.jsonl", sleep_s=600.0)

    def command(key: str) -> list[str]:
        if key == "second":
            raise KeyboardInterrupt  # as an interrupt would, with one process running
        return sleeper(key)

    with pytest.raises(KeyboardInterrupt):
        prewarm.warm(["first", "second"], {}, need={}, usable=1.0, processes=2, command=command)
    assert len(started) == 1 and started[0].returncode is not None  # ended, and waited for


def test_warm_says_why_a_process_failed(tmp_path):
    command = _logging_worker(tmp_path / "log.jsonl", exits={"bad": 3})
    out = prewarm.warm(["ok", "bad"], {}, need={}, usable=1.0, processes=2, command=command)
    assert out.warmed == ["ok"]
    assert out.failed == {"bad": "exit 3: worker of bad exits 3"}
    assert out.line(2).endswith(
        "not warmed (each compiles in the run instead): 1, first bad: exit 3: worker of bad exits 3"
    )


def test_warm_ends_a_process_past_its_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(prewarm, "CASE_LIMIT_S", 1.0)
    slow = _logging_worker(tmp_path / "slow.jsonl", sleep_s=600.0)
    out = prewarm.warm(["slow"], {}, need={}, usable=1.0, processes=1, command=slow)
    assert not out.warmed and out.failed["slow"].startswith("ended after")


def test_warm_starts_nothing_after_the_deadline(tmp_path):
    log = tmp_path / "log.jsonl"
    out = prewarm.warm(
        ["a", "b"],
        {},
        need={},
        usable=1.0,
        processes=1,
        deadline=time.time() - 1.0,
        command=_logging_worker(log),
    )
    assert not out.warmed and set(out.failed) == {"a", "b"}
    assert not log.exists()


def test_breakdown_counts_the_warm_up_as_its_own_phase():
    events = [{"event": "prewarm", "seconds": 40.0}, {"event": "process", "startup_seconds": 5.0}]
    split = breakdown.phases(events, 100.0)
    assert split["prewarm"] == 40.0 and split["startup"] == 5.0 and split["overhead"] == 55.0


def _compile_counters(env: dict[str, str]) -> dict:
    """What torch.compile did in a fresh process that builds and calls :data:`COMPILED`."""
    script = (
        "import json\n"
        "from torch._dynamo.utils import counters\n"
        "from optbench.suite.grids import cases\n"
        "(case,) = cases('bench_step.StepTiny', [['compile-default']], 'cpu')\n"
        "work = case.build()\n"
        "for fn in work.timed.values(): fn()\n"
        "print(json.dumps({**counters['inductor'], **counters['aot_autograd']}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_warmed_case_compiles_from_the_cache_in_a_later_process(tmp_path):
    """The warm-up's one promise: a process that builds a case after it loads inductor's graphs
    and AOTAutograd's from the cache instead of compiling them (a warm-up that built the case
    without calling it leaves nothing to load)."""
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    out = prewarm.warm([COMPILED], env, need={}, usable=1.0, processes=1)
    assert out.warmed == [COMPILED], out.failed
    counts = _compile_counters(prewarm.worker_env(env))
    assert counts.get("fxgraph_cache_hit", 0) >= 1 and not counts.get("fxgraph_cache_miss")
    assert counts.get("autograd_cache_hit", 0) >= 1


@pytest.mark.parametrize("argv", [[], ["a", "b"]])
def test_worker_usage(argv, capsys):
    assert prewarm.main(argv) == 2
    assert "usage" in capsys.readouterr().err
