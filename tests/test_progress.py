"""The live progress of a run (optbench.run.progress) and the breakdown of its time
(optbench.run.breakdown)."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optbench.run import breakdown, progress
from optbench.store.settings import Settings
from optbench.store.store import MACHINE_KEY, REPO_ROOT, ResultStore, StoredRun, record_key

ROOT = REPO_ROOT


def _start(key: str, t: float = 0.0) -> dict:
    return {"event": "start", "key": key, "t": t}


def _end(key: str, seconds: float | None, status: str = "ok", **fields) -> dict:
    return {"event": "end", "key": key, "status": status, "seconds": seconds, **fields}


def test_the_progress_file_is_a_run_setting():
    made = Settings(progress=Path("/r/cpu/progress/run.jsonl"))
    assert made.env()["OPTBENCH_PROGRESS"] == "/r/cpu/progress/run.jsonl"
    assert Settings.from_env(made.env()).progress == made.progress
    assert Settings.from_env({}).progress is None


def test_without_a_progress_file_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("OPTBENCH_PROGRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    progress.emit("start", key="k")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("OPTBENCH_PROGRESS", str(tmp_path / "p.jsonl"))
    progress.emit("start", key="k")
    progress.emit("end", key="k", status="ok", seconds=1.0)
    assert [e["event"] for e in progress.read_events(tmp_path / "p.jsonl")] == ["start", "end"]


def test_done_total_and_eta_from_the_events():
    t = progress.tally([], total=4, elapsed_s=3.0)
    assert (t.done, t.total, t.left, t.running, t.mean_s, t.eta_s) == (0, 4, 4, None, None, None)
    events = [_start("a"), _end("a", 10.0), _start("b"), _end("b", 20.0, "error"), _start("c")]
    t = progress.tally(events, total=4, elapsed_s=40.0)
    assert (t.done, t.left, t.running, t.elapsed_s) == (2, 2, "c", 40.0)
    # mean per finished case x left
    assert t.mean_s == pytest.approx(15.0) and t.eta_s == pytest.approx(30.0)
    assert t.statuses == {"ok": 1, "error": 1}
    # Cases the time budget did not start count as done but not in the mean; cases beyond the plan
    # count too.
    events += [_end("c", 6.0), _end("d", None, "skipped", not_started=True), _start("e")]
    t = progress.tally(events, total=4, elapsed_s=50.0)
    assert (t.done, t.total, t.running) == (4, 5, "e") and t.mean_s == pytest.approx(12.0)
    assert t.eta_s == pytest.approx(12.0)
    # A case reported twice (a watchdog's stop) is one case.
    assert progress.tally([_end("a", 1.0), _end("a", 1.0)], total=1, elapsed_s=1.0).done == 1


def test_the_eta_sums_what_each_case_left_took_here_before():
    planned, expected = ["a", "b", "c", "d"], {"a": 100.0, "b": 20.0, "c": 60.0}
    t = progress.tally([], 4, 0.0, planned, expected)
    assert t.eta_s is None  # d never ran here and this run has no mean yet
    t = progress.tally([], 4, 0.0, planned[:3], expected)
    assert t.eta_s == pytest.approx(180.0)  # not the mean x cases left, which has nothing to go on
    events = [_start("a", 1000.0), _end("a", 90.0), _start("b", 1090.0)]
    t = progress.tally(events, 4, 95.0, planned, expected, now=1095.0)
    # b, running for 5 of its 20 s: 15 left; c 60; d never ran here: this run's mean, 90
    assert t.eta_s == pytest.approx(15.0 + 60.0 + 90.0)
    # With no history each case left counts at the mean (the running one less its 5 s).
    assert progress.tally(events, 4, 95.0, planned, {}, now=1095.0).eta_s == pytest.approx(
        85.0 + 90.0 * 2
    )


def test_expected_seconds_are_the_median_of_the_cases_that_ran():
    def run(records):
        return StoredRun("h100-sxm", "c0", "r", {k: {"key": k, **r} for k, r in records.items()})

    runs = [
        run({"a": {"status": "ok", "seconds": 10.0}, "b": {"status": "skipped", "seconds": 0.0}}),
        run({"a": {"status": "timeout", "seconds": 40.0}, "b": {"status": "skipped"}}),
        run({"a": {"status": "wrong", "seconds": 12.0}, "c": {"status": "ok", "seconds": 5.0}}),
    ]
    assert progress.expected_seconds(runs, ["a", "b"]) == {"a": 12.0}


def test_expected_seconds_come_from_runs_whose_compile_cache_was_alike():
    """A run that starts without a compile cache is estimated from the cold runs where any ran the
    case (a cold torch.compile takes several times a warm one), a warm one from the warm runs;
    a case measured in runs of the other kind only falls back on those."""

    def run(cache, records):
        info = {"key": MACHINE_KEY, "info": {"compile_cache": cache}}
        data = {k: {"key": k, "status": "ok", "seconds": s} for k, s in records.items()}
        return StoredRun("h200", "c0", "r", {MACHINE_KEY: info, **data})

    runs = [
        run("cold", {"step": 40.0}),
        run("restored h200-key", {"step": 10.0, "kernel": 2.0}),
        run("local", {"step": 12.0}),
    ]
    assert progress.expected_seconds(runs, ["step", "kernel"], cold=True) == {
        "step": 40.0,
        "kernel": 2.0,
    }
    assert progress.expected_seconds(runs, ["step"], cold=False) == {"step": 11.0}
    assert progress.expected_seconds(runs, ["step"]) == {"step": 12.0}


def test_the_estimate_before_a_run_says_whether_its_budget_will_cut_cases():
    planned, expected = ["a", "b", "c"], {"a": 100.0, "b": 300.0}
    note = progress.estimate_note(planned, expected, None, 60.0)
    assert (
        "~600 s" in note and "2 of 3 measured here before; 1 never, counted at the median" in note
    )
    assert "cut" not in note
    assert "~600 s" in progress.estimate_note(
        planned, expected, 700.0, 60.0
    ) and "cut" not in progress.estimate_note(planned, expected, 700.0, 60.0)
    cut = progress.estimate_note(planned, expected, 600.0, 60.0)
    assert (
        "leaves 540 s for cases once 60 s are kept for asv's start and wrap-up: it will likely "
        "cut some" in cut
    )
    assert "no estimate" in progress.estimate_note(planned, {}, 600.0, 60.0)


def test_the_estimate_says_what_asv_times_itself_comes_on_top():
    """A CPU run read '~8 s of cases' and took 50: asv's own timing of its classes (most of it)
    leaves no records to estimate from, so the line names them; with no grid case, no estimate."""
    timed = ["bench_cpu.MLP", "bench_cpu.GradStats"]
    note = progress.estimate_note(["a"], {"a": 8.0}, None, 60.0, timed)
    assert note.startswith("optbench: expected ~8 s of grid cases") and note.endswith(
        "; asv's own timing of bench_cpu.MLP, bench_cpu.GradStats comes on top"
    )
    assert progress.estimate_note([], {}, None, 60.0, timed) == (
        "optbench: no grid case to estimate; asv's own timing of bench_cpu.MLP, "
        "bench_cpu.GradStats comes on top"
    )


def test_the_run_command_estimates_from_runs_with_its_compile_cache_state(monkeypatch, tmp_path):
    """`optbench run` asks for the estimate of a cold compile cache where OPTBENCH_COMPILE_CACHE
    says so, and names the classes asv times itself."""
    from optbench import cli

    asked, noted = [], []
    monkeypatch.setattr(
        progress, "expected_seconds", lambda runs, keys, cold=None: asked.append(cold) or {}
    )
    monkeypatch.setattr(
        progress, "estimate_note", lambda *args: noted.append(args) or "optbench: estimate"
    )
    monkeypatch.setenv("OPTBENCH_COMPILE_CACHE", "cold")
    args = argparse.Namespace(
        select="StepTiny|MLP",
        skip_existing=False,
        time_budget=None,
        verbose=False,
        no_prewarm=False,
    )
    store = ResultStore(tmp_path / "results")
    log = REPO_ROOT / "results" / "x.asv.log"
    cli._announce(args, store, "cpu", "cpu-host", "c" * 40, "run", log)
    assert (
        asked == [True]
        and noted
        and noted[0][-1] == progress.asv_timed(cli.BENCHMARKS.values(), "cpu", "StepTiny|MLP") != []
    )


def test_the_line_of_a_finished_case():
    t = progress.tally([_end("a", 10.0), _end("b", 20.0)], total=5, elapsed_s=3725.0)
    line = progress.case_line(_end("b", 20.0), t)
    assert line == "optbench: [2/5] b: ok, took 20.0 s; elapsed 1:02:05, ETA 0:45"
    shown = {"clock": "wall", "ms": {"forward": 91.94, "step": 542.87}}
    assert progress.case_line(_end("b", 20.0, figure=shown), t) == (
        "optbench: [2/5] b: ok, forward 91.9 ms, step 543 ms (wall), took 20.0 s; "
        "elapsed 1:02:05, ETA 0:45"
    )
    converged = {"deviation": 0.016089, "tolerance": 0.024812}
    assert progress.case_line(_end("b", 20.0, figure=converged), t) == (
        "optbench: [2/5] b: ok, loss curve 0.0161 nats from eager seeds' mean (RMS), "
        "tolerance 0.0248, took 20.0 s; elapsed 1:02:05, ETA 0:45"
    )
    failed = progress.case_line(_end("c", 1.25, "oom", reason="CUDA out of memory"), t)
    assert "c: oom (CUDA out of memory), took 1.2 s" in failed
    unstarted = _end(
        "d", None, "skipped", not_started=True, reason="not measured: the run's time budget ended"
    )
    assert "d: skipped (not measured: the run's time budget ended); elapsed" in progress.case_line(
        unstarted, t
    )
    assert (
        progress.clock(None) == "?"
        and progress.clock(59.6) == "1:00"
        and progress.clock(-1) == "0:00"
    )


def _write(path: Path, *events: dict) -> None:
    with open(path, "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def test_plain_mode_prints_one_line_per_finished_case(tmp_path, capsys):
    path = tmp_path / "p.jsonl"
    _write(path, _end("earlier", 1.0))  # an earlier run's, under the same run id: not this run's
    follower = progress.Follower(path, total=3, live=False)
    _write(path, {"event": "process", "startup_seconds": 2.0}, _start("a"))
    assert [e["event"] for e in follower.poll()] == ["process", "start"]
    assert capsys.readouterr().out == ""  # nothing per start
    _write(path, _end("a", 4.0))
    with open(path, "a") as f:
        f.write('{"event": "start", "key": "b"')  # a line being written: read once whole
    follower.poll()
    out = capsys.readouterr().out.splitlines()
    assert (
        len(out) == 1
        and out[0].startswith("optbench: [1/3] a: ok, took 4.0 s; elapsed ")
        and out[0].endswith("0:08")
    )
    with open(path, "a") as f:
        f.write("}\n")
    assert follower.poll() == [{"event": "start", "key": "b"}] and follower.tally().running == "b"
    follower.print("asv: some line")
    assert capsys.readouterr().out == "asv: some line\n"


def test_live_mode_shows_richs_progress_and_the_lines_above_it(tmp_path):
    from rich.console import Console

    path = tmp_path / "p.jsonl"
    path.touch()
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=160)
    with progress.Follower(
        path, total=2, live=True, console=console, poll_s=0.05, asv_timed=["bench_cpu.MLP"]
    ) as follower:
        follower.poll()  # asv's own classes come first on a CPU: the bar says so, not "starting"
        assert follower._progress.tasks[0].description == (
            "asv: starting, timing bench_cpu.MLP itself"
        )
        _write(path, _start("bench.A|x=1"))
        follower.poll()
        assert follower._progress.tasks[0].description == "bench.A|x=1"
        _write(path, _end("bench.A|x=1", 3.0))
        follower.poll()
        task = follower._progress.tasks[0]
        assert (task.completed, task.total, task.fields["eta"]) == (1, 2, "0:03")
        follower.print("[ 50.00%] ··· asv's line, [not] markup")
    text = screen.getvalue()
    assert (
        "optbench: [1/2] bench.A|x=1: ok, took 3.0 s" in text
        and "[ 50.00%] ··· asv's line, [not] markup" in text
    )


@pytest.mark.parametrize("echo", [False, True])
def test_a_followed_command_logs_its_output_and_shows_the_events_of_its_processes(
    tmp_path, capsys, echo
):
    """run_followed: the command's output (stdout and stderr) line by line into its log file, and
    through the follower only with ``echo``, while the follower reads the events that the command's
    processes append."""
    path, log = tmp_path / "p.jsonl", tmp_path / "p.asv.log"
    path.touch()
    child = textwrap.dedent("""
        import sys
        from optbench.run import progress
        print("asv: starting", flush=True)
        progress.case_started("bench.A|x=1", "bench.A")
        done = {"status": "ok", "seconds": 0.5, "build_seconds": 0.1}
        progress.case_ended("bench.A|x=1", "bench.A", done)
        print("asv: an error line", file=sys.stderr, flush=True)
        print("asv: done")
        raise SystemExit(3)
    """)
    follower = progress.Follower(path, total=1, live=False, poll_s=0.05)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OPTBENCH_PROGRESS": str(path)}
    code = progress.run_followed(
        [sys.executable, "-c", child], env, follower, cwd=tmp_path, log=log, echo=echo
    )
    out = capsys.readouterr().out
    asv = ["asv: starting", "asv: an error line", "asv: done"]
    assert code == 3 and log.read_text().splitlines() == asv
    assert all((line in out.splitlines()) == echo for line in asv)
    assert "optbench: [1/1] bench.A|x=1: ok, took 0.5 s" in out
    assert [e["event"] for e in follower.events] == ["start", "end"] and follower.events[1][
        "build_seconds"
    ] == 0.1


def test_the_end_of_an_ok_case_carries_its_figure_by_its_primary_clock(tmp_path, monkeypatch):
    """A case's figure: each metric's median by the record's primary clock, by wall time where that
    clock has none (a CPU); none for a case that is not ok."""
    path = tmp_path / "p.jsonl"
    monkeypatch.setenv("OPTBENCH_PROGRESS", str(path))

    def rec(status: str, primary: str | None) -> dict:
        def timing(ms: float) -> dict:
            return {"median_ms": ms, "q25_ms": ms, "q75_ms": ms}

        return {
            "status": status,
            "seconds": 1.0,
            "info": {"primary_clock": primary} if primary else {},
            "metrics": {
                "fwd": {"device": timing(0.5), "wall": timing(0.7)},
                "fwdbwd": {"device": timing(1.5), "wall": timing(1.9)},
            },
        }

    cpu = rec("ok", None)
    for metric in cpu["metrics"].values():
        metric["device"] = None
    progress.case_ended("k|a=1", "k", rec("ok", None))
    progress.case_ended("k|a=2", "k", rec("ok", "wall"))
    progress.case_ended("k|a=3", "k", cpu)
    progress.case_ended("k|a=4", "k", rec("wrong", None))
    converged = {"status": "ok", "seconds": 1.0, "metrics": {}}
    converged["info"] = {"rms_deviation": 0.016, "tolerance": 0.025, "curve": [2.0]}
    progress.case_ended("c|v=1", "c", converged)
    ends = [e.get("figure") for e in progress.read_events(path)]
    assert ends == [
        {"clock": "device", "ms": {"fwd": 0.5, "fwdbwd": 1.5}},
        {"clock": "wall", "ms": {"fwd": 0.7, "fwdbwd": 1.9}},
        {"clock": "wall", "ms": {"fwd": 0.7, "fwdbwd": 1.9}},
        None,
        {"deviation": 0.016, "tolerance": 0.025},
    ]


def test_the_start_up_of_a_process_is_its_age_by_the_kernel():
    age = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(0.3); from optbench.run import progress; "
            "print(progress.process_age())",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert 0.3 <= float(age.stdout) < 10
    assert progress.process_age() > 0


def test_the_planned_cases_are_the_suites_grids_as_selected():
    from optbench.suite import catalog

    entries = catalog.BENCHMARKS.values()
    cpu = progress.planned_cases(entries, "cpu")
    assert cpu == [
        record_key("bench_step.StepTiny", {"variant": v}) for v in catalog.STEP_GRIDS["tiny"]
    ]
    # asv times them
    assert progress.asv_timed(entries, "cpu") == ["bench_cpu.MLP", "bench_cpu.GradStats"]
    assert progress.planned_cases(entries, "cpu", "variant=eager$") == [
        "bench_step.StepTiny|variant=eager"
    ]
    quick = progress.planned_cases(entries, "quick")
    assert quick == [record_key(name, params) for name, params in catalog.suite_cases("quick")]
    assert progress.asv_timed(entries, "quick") == []
    assert progress.planned_cases(entries, "quick", "^bench_kernels") == [
        k for k in quick if k.startswith("bench_kernels")
    ]


def _events() -> list[dict]:
    return [
        {"event": "process", "startup_seconds": 5.0},
        _start("a"),
        _end(
            "a",
            30.0,
            build_seconds=4.0,
            build_compile_seconds=3.0,
            check_seconds=20.0,
            compile_seconds=15.0,
            timing_seconds=5.0,
            timing_compile_seconds=1.0,
            memory_seconds=0.5,
            free_seconds=0.25,
        ),
        _start("b"),
        _end("b", 2.0, "skipped", build_seconds=1.5),
        _end("c", None, "skipped", not_started=True),
        {"event": "process", "startup_seconds": 3.0},
        _start("d"),
        _end("d", 12.0, "wrong", build_seconds=2.0, check_seconds=9.0, compile_seconds=None),
        _start("e"),
        _end("e", None, progress.ABORTED),
        # cut in its build
        _start("f"),
        _end("f", 10.0, "skipped", build_seconds=9.0, build_compile_seconds=6.0),
    ]


def test_the_breakdown_sums_each_phase_over_the_run_and_leaves_the_rest_to_asv():
    # the run's compile warm-up, before its cases (optbench.suite.prewarm)
    prewarmed = [{"event": "prewarm", "seconds": 10.0, "warmed": 2, "failed": 0}, *_events()]
    split = breakdown.phases(prewarmed, wall_s=100.0)
    assert list(split) == list(breakdown.PHASES)
    # a's compile: 3 s in its build (a captured step's warm-up), 12 s in its check
    assert split == pytest.approx(
        {
            "prewarm": 10.0,
            "startup": 8.0,
            "build": 4.5 + 3.0,
            "compile": 15.0 + 6.0,
            "check_rest": 17.0,
            "timing_compile": 1.0,
            "timing": 4.0,
            "memory": 0.5,
            "free": 0.25,
            "case_other": 0.25 + 0.5 + 1.0 + 1.0,
            "overhead": 100.0 - 72.0,
        }
    )
    assert sum(split.values()) == pytest.approx(100.0)
    rows = breakdown.rows(split, 100.0)
    assert rows[0] == (breakdown.PHASES["prewarm"], "10.0", "10.0%")
    assert (
        rows[-1] == ("total (wall time)", "100.0", "100.0%")
        and len(rows) == len(breakdown.PHASES) + 1
    )
    assert breakdown.rows(breakdown.phases([], 0.0), 0.0)[-1] == ("total (wall time)", "0.0", "-")
    rendered = breakdown.render(split, 100.0)
    assert rendered.columns[0].header == "phase" and rendered.row_count == len(rows)
    assert "left out" not in str(rendered.title)
    # on the console, the phases of 0.0 s are left out, and the title says so
    eager = {**split, "compile": 0.04, "timing_compile": 0.0}
    compact = breakdown.render(eager, 100.0)
    assert compact.row_count == len(rows) - 2 and str(compact.title).endswith(
        "(phases of 0.0 s left out)"
    )
    assert breakdown.PHASES["compile"] not in [c for c in compact.columns[0].cells]


def test_the_breakdown_record():
    rec = breakdown.record(
        _events(), 100.0, commit="c" * 40, machine="m", run_id="r", date="2026-01-01T00:00:00+00:00"
    )
    assert rec["key"] == "__breakdown__" and rec["run"] == "r" and rec["wall_seconds"] == 100.0
    assert rec["processes"] == 2 and rec["cases"] == 6 and rec["phases"]["overhead"] == 38.0
    assert "status" not in rec and "metrics" not in rec and "benchmark" not in rec


def test_optbenchs_readers_leave_the_breakdown_record_out(tmp_path):
    """A run file with ``__breakdown__``: compare, the report's data, the noise check and the typed
    reader see the cases alone, and the run's date stays its start."""
    from optbench.gate.compare import NoiseModel, compare_runs, run_medians
    from optbench.gate.noisecheck import planted
    from optbench.reporting import data
    from optbench.store.records import Record

    def step(ms: float) -> dict:
        timing = {"median_ms": ms, "q25_ms": ms, "q75_ms": ms, "samples_ms": [ms] * 5, "n": 5}
        return {
            "key": "bench_step.StepTiny|variant=eager",
            "benchmark": "bench_step.StepTiny",
            "params": {"variant": "eager"},
            "status": "ok",
            "date": "2026-01-01T00:00:05+00:00",
            "metrics": {"step": {"wall": timing, "device": None}},
            "info": {"primary_clock": "wall"},
        }

    store = ResultStore(tmp_path)
    for commit, ms in (("a" * 40, 10.0), ("b" * 40, 10.0)):
        run_id = f"run-{commit[0]}"
        machine = {
            "key": MACHINE_KEY,
            "info": {"gpu_name": None},
            "date": "2026-01-01T00:00:05+00:00",
        }
        store.save("m", commit, [machine, step(ms)], run_id=run_id)
        store.save(
            "m",
            commit,
            [
                breakdown.record(
                    _events(),
                    100.0,
                    commit=commit,
                    machine="m",
                    run_id=run_id,
                    date="2026-01-01T00:00:00+00:00",
                )
            ],
            run_id=run_id,
        )
    run = store.runs("m", "a" * 40)[0]
    assert breakdown.KEY in run.records and set(run.results()) == {
        "bench_step.StepTiny|variant=eager"
    }
    assert run.date == "2026-01-01T00:00:00+00:00"
    assert set(run_medians(run)) == {("bench_step.StepTiny|variant=eager", "step", "wall")}
    changes = compare_runs(store.runs("m", "a" * 40), store.runs("m", "b" * 40), NoiseModel({}))
    assert {c.key for c in changes} == {"bench_step.StepTiny|variant=eager"}
    assert planted(run, 1.1).records[breakdown.KEY] == run.records[breakdown.KEY]
    assert not Record.of(run.records[breakdown.KEY]).ok
    runs = data.runs(store)
    assert [sorted(data.steps(r)) for r in runs["m"]] == [["tiny"], ["tiny"]]
    assert data.kernels(runs["m"][0]) == {}
    assert isinstance(run, StoredRun)


def test_optbench_run_follows_its_asv_run_and_stores_the_breakdown(tmp_path, monkeypatch, capsys):
    """``optbench run`` gives asv's processes the progress file and run id, follows the events, and
    at the end prints the breakdown and stores it in the run's file (a run that stored nothing gets
    none)."""
    from optbench import cli

    seen = {}

    def fake_asv(command, env, follower, cwd, log, echo):
        seen.update(command=command, env=env, log=log)
        settings = Settings.from_env(env)
        store = ResultStore(settings.results)
        store.save(
            settings.machine,
            "f" * 40,
            [{"key": MACHINE_KEY, "info": {}, "date": "2026-01-01T00:00:09+00:00"}],
            run_id=settings.run_id,
        )
        with follower:
            _write(settings.progress, *_events())
        return 0

    monkeypatch.setattr(cli, "ROOT", tmp_path)
    monkeypatch.setattr(cli, "git_commit", lambda ref: "f" * 40)
    monkeypatch.setattr(cli, "register_machine", lambda machine: None)
    monkeypatch.setattr("optbench.measure.machine.machine_name", lambda emulate=None: "cpu-test")
    monkeypatch.setattr(progress, "run_followed", fake_asv)
    monkeypatch.delenv("OPTBENCH_RUN_ID", raising=False)
    assert cli.run(["--suite", "cpu", "--no-html"]) == 0
    env = seen["env"]
    run_id, path = env["OPTBENCH_RUN_ID"], Path(env["OPTBENCH_PROGRESS"])
    assert path == tmp_path / "results" / "cpu-test" / "progress" / f"{run_id}.jsonl"
    assert "--set-commit-hash" in seen["command"] and "f" * 40 in seen["command"]
    stored = ResultStore(tmp_path / "results").runs("cpu-test", "f" * 40)
    assert [r.run_id for r in stored] == [run_id]
    rec = stored[0].records[breakdown.KEY]
    assert rec["cases"] == 6 and rec["processes"] == 2 and rec["phases"]["startup"] == 8.0
    assert sum(rec["phases"].values()) == pytest.approx(rec["wall_seconds"], abs=0.01)
    out = capsys.readouterr().out
    assert "9 grid cases and bench_cpu.MLP, bench_cpu.GradStats (timed by asv" in out
    assert seen["log"] == path.with_suffix(".asv.log") and str(seen["log"].name) in out
    assert "optbench: [1/9] a: ok, took 30.0 s" in out
    # the result first: what ended how (each status once, failures first), what failed
    assert (
        "optbench: 1 of 9 cases ok, 1 wrong, 1 aborted, 3 skipped, 3 never ended in " in out
        and "optbench: not ok: d (wrong), e (aborted)\n" in out
    )
    assert (
        "where the" in out
        and breakdown.PHASES["compile"] in out
        and "asv and other overhead" in out
    )
