"""The console of ``optbench run``: a header, a line per case, the result first and the breakdown,
within a line budget; asv's own output in a log file beside the run's progress file (``--verbose``
shows it too); a combination the run leaves out never printed, by asv either."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optbench import cli
from optbench.asv import asv_timed
from optbench.run import progress
from optbench.store.store import REPO_ROOT
from optbench.suite import catalog, grids

# The done-when of the issue: the CPU run of the tiny eager step prints at most this many lines.
LINE_BUDGET = 25
SELECT = r"StepTiny\|variant=eager$"
KEY = "bench_step.StepTiny|variant=eager"
UNSELECTED = "asv: skipped: NotImplementedError('not selected in this run (OPTBENCH_SELECT=...)')"

# asv's stand-in: 120 lines of output (on stdout and stderr, a skip of an unselected combination
# among them), the tiny step's events, and the exit code it is given.
FAKE_ASV = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from optbench.run import progress
    for i in range(60):
        print(f"[{i:5.2f}%] ··· asv's line {i}", flush=True)
        print(f"              {sys.argv[3]}", file=sys.stderr, flush=True)
    if sys.argv[2] != "0":
        raise SystemExit(int(sys.argv[2]))
    progress.case_started(sys.argv[4], "bench_step.StepTiny")
    timing = {"median_ms": 555.24, "q25_ms": 550.0, "q75_ms": 560.0}
    rec = {"status": "ok", "seconds": 3.0, "info": {"primary_clock": "wall"},
           "metrics": {"step": {"device": None, "wall": timing}}}
    progress.case_ended(sys.argv[4], "bench_step.StepTiny", rec)
""")


def _run(tmp_path, monkeypatch, capsys, *options: str, exit_code: int = 0) -> tuple[int, str, Path]:
    """``optbench run --suite cpu --select SELECT --no-html`` through the CLI's own path, with
    asv's stand-in for asv (exiting ``exit_code``) in a results tree under ``tmp_path``; its exit
    code, what it printed (stdout and stderr) and its asv log."""
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    monkeypatch.setattr(cli, "git_commit", lambda ref: "f" * 40)
    monkeypatch.setattr(cli, "register_machine", lambda machine: None)
    monkeypatch.setattr("optbench.measure.machine.machine_name", lambda emulate=None: "cpu-test")
    monkeypatch.setattr(
        cli,
        "asv_run_command",
        lambda commit, machine, bench: [
            sys.executable,
            "-c",
            FAKE_ASV,
            str(REPO_ROOT),
            str(exit_code),
            UNSELECTED,
            KEY,
        ],
    )
    monkeypatch.setenv("OPTBENCH_RUN_ID", "20261128T000000Z-test00")
    code = cli.run(["--suite", "cpu", "--select", SELECT, "--no-html", *options])
    out = capsys.readouterr()
    logs = list((tmp_path / "results" / "cpu-test" / "progress").glob("*.asv.log"))
    assert [p.name for p in logs] == ["20261128T000000Z-test00.asv.log"]
    return code, out.out + out.err, logs[0]


def test_a_run_prints_a_header_its_cases_and_the_result_first_and_logs_asvs_output(
    tmp_path, monkeypatch, capsys
):
    code, out, log = _run(tmp_path, monkeypatch, capsys)
    lines = out.splitlines()
    assert code == 0 and len(lines) <= LINE_BUDGET, out
    assert lines[0].startswith("optbench run: suite 'cpu' on cpu-test, commit ffffffffffff, run ")
    assert f"optbench: asv's output goes to {log.relative_to(tmp_path)} (--verbose" in out
    assert f"optbench: [1/1] {KEY}: ok, step 555 ms (wall), took 3.0 s; elapsed " in out
    result = next(i for i, line in enumerate(lines) if "cases ok" in line)
    assert lines[result].startswith("optbench: 1 of 1 cases ok in ")
    assert "where the time of asv's run went" in "\n".join(lines[result + 1 :])
    assert "asv's line" not in out and "not selected" not in out
    logged = log.read_text().splitlines()
    assert len(logged) == 120 and logged.count(f"              {UNSELECTED}") == 60


def test_verbose_shows_asvs_output_as_well(tmp_path, monkeypatch, capsys):
    code, out, log = _run(tmp_path, monkeypatch, capsys, "--verbose")
    assert code == 0 and "(--verbose" not in out
    shown = out.splitlines()
    assert all(line in shown for line in log.read_text().splitlines()) and "asv's line 59" in out


def test_asv_failing_with_no_failed_case_shows_the_last_lines_of_its_log(
    tmp_path, monkeypatch, capsys
):
    code, out, log = _run(tmp_path, monkeypatch, capsys, exit_code=3)
    tail = log.read_text().splitlines()[-cli.LOG_TAIL_LINES :]
    lines = out.splitlines()
    said = lines.index(
        f"optbench: asv failed (exit 3) with no failed case to explain it; the last "
        f"{cli.LOG_TAIL_LINES} lines of {log.relative_to(tmp_path)}:"
    )
    assert code == 3 and lines[said - 1].startswith("optbench: 0 of 1 cases ok, 1 never ended")
    assert lines[said + 1 : said + 1 + len(tail)] == [f"  {line}" for line in tail]


def test_a_selection_of_nothing_is_one_line_and_runs_no_asv(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    monkeypatch.setattr(cli, "git_commit", lambda ref: "f" * 40)
    monkeypatch.setattr("optbench.measure.machine.machine_name", lambda emulate=None: "cpu-test")
    monkeypatch.setattr(progress, "run_followed", lambda *a, **k: pytest.fail("asv ran"))
    assert cli.run(["--suite", "cpu", "--select", "nosuchcase", "--no-html"]) == 0
    assert capsys.readouterr().out == "optbench: nothing to measure in suite 'cpu'\n"


def test_asv_runs_only_the_benchmarks_with_a_selected_case():
    cpu = catalog.SUITES["cpu"]
    assert catalog.selected_benchmarks("cpu") == cpu
    assert catalog.selected_benchmarks("cpu", SELECT) == ["bench_step.StepTiny"]
    assert catalog.selected_benchmarks("cpu", "impl=compile") == ["bench_cpu.MLP"]
    pattern = re.compile(catalog.asv_pattern("cpu", SELECT))
    named = {
        f"{n}.track_step_ms({', '.join(map(repr, combo))})"
        for n in cpu
        for combo in itertools.product(*catalog.BENCHMARKS[n].asv_params())
    }
    # the selected case alone, of every method: asv starts no process for another
    assert sorted(filter(pattern.search, named)) == ["bench_step.StepTiny.track_step_ms('eager')"]
    assert progress.asv_timed(catalog.BENCHMARKS.values(), "cpu", SELECT) == []


def test_asv_skips_without_a_word_the_combinations_a_run_leaves_out(monkeypatch):
    """The grid classes' skip_params: every combination of asv's grid outside the run's suite or
    selection, none that it measures."""
    monkeypatch.setenv("OPTBENCH_SUITE", "cpu")
    monkeypatch.setenv("OPTBENCH_SELECT", SELECT)
    entry = catalog.benchmark("bench_step.StepTiny")
    every = entry.asv_params()[0]
    assert grids.unmeasured("bench_step.StepTiny") == [(v,) for v in every if v != "eager"]
    monkeypatch.delenv("OPTBENCH_SELECT")
    assert grids.unmeasured("bench_step.StepTiny") == [
        (v,) for v in every if v not in entry.grid("cpu")[0]
    ]
    outside = [(v,) for v in catalog.benchmark("bench_step.Step100M").asv_params()[0]]
    assert grids.unmeasured("bench_step.Step100M") == outside  # not in the cpu suite
    # the asv classes carry them, computed as asv imports them
    code = (
        "import json; from benchmarks import bench_step; "
        "print(json.dumps([bench_step.StepTiny.skip_params, bench_step.Step100M.skip_params]))"
    )
    env = {**os.environ, "OPTBENCH_SUITE": "cpu", "OPTBENCH_SELECT": SELECT}
    tiny, step100m = json.loads(
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert tiny == [[v] for v in every if v != "eager"]
    assert step100m == [list(combo) for combo in outside]


def test_the_benchmarks_asv_times_itself_get_a_line_per_combination_of_this_run(tmp_path):
    """asv's results of the run (methods started at or after its start): asv's figure per
    combination, 'failed' where asv stored none; an earlier run's and other benchmarks' left out."""
    columns = ["result", "params", "version", "started_at", "duration"]
    grid = [["'eager'", "'compile'"]]
    results = {
        "bench_cpu.MLP.time_fwdbwd": [[0.15124, None], grid, "1", 2_000_000, 20.0],
        "bench_cpu.GradStats.time_grad_stats": [[0.007, 0.001], [["'loop'", "'foreach'"]], "1"]
        + [999_000, 1.0],
        "bench_step.StepTiny.track_step_ms": [[555.0], [["'eager'"]], "2", 2_000_000, 1.0],
    }
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "machine.json").write_text(json.dumps({"machine": "m", "version": 1}))
    (folder / "ffffffff-existing-py.json").write_text(
        json.dumps(
            {
                "commit_hash": "f" * 40,
                "env_name": "existing-py",
                "date": 1_000_000,
                "params": {"machine": "m"},
                "python": "3.11",
                "requirements": {},
                "env_vars": {},
                "result_columns": columns,
                "results": results,
                "durations": {},
                "version": 2,
            }
        )
    )
    found = asv_timed.outcomes(
        tmp_path,
        "m",
        "f" * 40,
        {"bench_cpu.MLP": ("impl",), "bench_cpu.GradStats": ("impl",)},
        since=1_000.0,
    )
    assert [o.line() for o in found] == [
        "optbench: bench_cpu.MLP.time_fwdbwd|impl=eager: ok, 151 ms (asv's timer)",
        "optbench: bench_cpu.MLP.time_fwdbwd|impl=compile: failed (asv's log says why)",
    ]
    selected = asv_timed.outcomes(
        tmp_path, "m", "f" * 40, {"bench_cpu.MLP": ("impl",)}, since=1_000.0, select="MLP\\|impl=e"
    )
    assert [o.key for o in selected] == ["bench_cpu.MLP.time_fwdbwd|impl=eager"]


@pytest.mark.slow
def test_the_real_cpu_run_of_the_tiny_eager_step_is_quiet(tmp_path):
    """The issue's done-when, in a copy of this checkout (its own results and asv machine file):
    ``optbench run --suite cpu --select 'StepTiny\\|variant=eager$' --no-html`` prints at most
    LINE_BUDGET lines, its case ok with its figure and no unselected combination; asv's output is
    in the run's log, which lists no unselected combination either (what --verbose would show)."""
    from test_interrupts import _project_copy

    from optbench.measure.machine import machine_name

    machine = machine_name()
    repo = _project_copy(tmp_path / "repo", machine)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": str(repo), "HOME": str(home)}
    env.pop("OPTBENCH_RUN_ID", None)
    run = subprocess.run(
        [sys.executable, "-m", "optbench", "run", "--suite", "cpu", "--select", SELECT]
        + ["--no-html"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and len(lines) <= LINE_BUDGET, run.stdout
    # progress.milliseconds: whole ms from 100 up, else three significant digits (9.64)
    assert re.search(rf"\[1/1\] {re.escape(KEY)}: ok, .*step \d+(\.\d+)? ms.* \(wall\)", run.stdout)
    assert "optbench: 1 of 1 cases ok in " in run.stdout and "not selected" not in run.stdout
    [log] = (repo / "results" / machine / "progress").glob("*.asv.log")
    logged = log.read_text()
    assert "Discovering benchmarks" in logged and "bench_step.StepTiny.track_step_ms" in logged
    assert "not selected" not in logged and "bench_cpu" not in logged


def test_the_result_leads_with_what_failed_and_names_the_first_failures(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    path = tmp_path / "p.jsonl"
    path.touch()
    follower = progress.Follower(path, total=15, live=False)
    ends = [
        {"event": "end", "key": "ok", "status": "ok"},
        {"event": "end", "key": "gpu", "status": "skipped", "reason": "no GPU"},
        *({"event": "end", "key": f"k{i}", "status": "oom", "reason": "big"} for i in range(12)),
    ]
    path.write_text("".join(json.dumps(e) + "\n" for e in ends))
    follower.poll()
    lines = cli._summary(follower, [], 2, 65.0, tmp_path / "none.jsonl.gz", tmp_path / "asv.log")
    named = ", ".join(f"k{i} (oom)" for i in range(cli.NAMED_FAILURES))
    assert lines == [
        "optbench: 1 of 15 cases ok, 12 oom, 1 skipped, 1 never ended in 1:05 (asv exit 2); "
        "no record stored",
        f"optbench: not ok: {named} and 2 more (their lines above)",
    ]
