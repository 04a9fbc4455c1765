"""Interrupts of a run: the case an interrupt stops is recorded as 'interrupted' and its run as
partial, never as a crash; optbench compare reports such records and never gates them; the
processes of a run end with the process that started them, in real process trees on this machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from synthetic_results import GPU, commit, record, samples, save

from optbench.gate import compare as cmp
from optbench.measure.signals import Interrupted, interruptible
from optbench.run import progress
from optbench.run.runner import Case, Work, run_grid
from optbench.store.records import INTERRUPTED
from optbench.store.store import IN_PROGRESS, REPO_ROOT, RUN_KEY, ResultStore, record_key

MACHINE, SHA = "test-machine", "c" * 40
GRID = "bench_test.Grid"


@pytest.fixture
def grid_env(tmp_path, monkeypatch) -> Path:
    """The settings of a grid process of one run; returns its progress file."""
    monkeypatch.setenv("OPTBENCH_MACHINE", MACHINE)
    monkeypatch.setenv("ASV_COMMIT", SHA)
    monkeypatch.setenv("OPTBENCH_RUN_ID", "20261126T000000Z-aaaaaa")
    monkeypatch.setenv("OPTBENCH_PROGRESS", str(tmp_path / "progress.jsonl"))
    return tmp_path / "progress.jsonl"


def _quick() -> Work:
    return Work(timed={"call": lambda: sum(range(100))})


def _signalled(signum: int):
    """A case whose build gets ``signum`` from outside (as from asv or a terminal) and then
    waits."""

    def build() -> Work:
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the interrupt lands here
        raise AssertionError("not interrupted")

    return build


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_a_case_records_it_interrupted_and_the_run_partial(grid_env, tmp_path, signum):
    """SIGINT or SIGTERM inside a case: that case's record says 'interrupted' and which signal
    (never 'crashed', its placeholder's status), the run gets a ``__run__`` record with partial, the
    cases after it none; the interrupt goes on up and the previous handlers are back."""
    store = ResultStore(tmp_path / "results")
    before = signal.getsignal(signal.SIGTERM)
    cases = [
        Case({"case": "a"}, _quick),
        Case({"case": "b"}, _signalled(signum)),
        Case({"case": "c"}, _quick),
    ]
    with pytest.raises(KeyboardInterrupt) as raised:
        run_grid(GRID, cases, device="cpu", store=store, log=lambda _: None)
    name = signal.Signals(signum).name
    assert isinstance(raised.value, Interrupted) and raised.value.signal == name
    assert signal.getsignal(signal.SIGTERM) is before
    [run] = store.runs(MACHINE, SHA)
    stopped = run.records[record_key(GRID, {"case": "b"})]
    assert run.records[record_key(GRID, {"case": "a"})]["status"] == "ok"
    assert stopped["status"] == INTERRUPTED and IN_PROGRESS not in stopped["reason"]
    assert stopped["reason"].startswith(f"interrupted by {name} ")
    assert record_key(GRID, {"case": "c"}) not in run.records
    assert run.records[RUN_KEY]["partial"] is True
    assert run.date == run.records[record_key(GRID, {"case": "a"})]["date"]  # __run__: the run's
    ends = [e for e in _events(grid_env) if e["event"] == "end"]
    assert [(e["key"][-1], e["status"]) for e in ends] == [("a", "ok"), ("b", INTERRUPTED)]
    assert store.measured_keys(MACHINE, SHA) == {record_key(GRID, {"case": "a"})}  # b: run again


def test_an_interrupt_between_cases_marks_the_run_partial_and_keeps_every_record(
    grid_env, tmp_path
):
    store = ResultStore(tmp_path / "results")

    def log(line: str) -> None:
        if "case=a" in line:  # after a's record is stored, before b starts
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_grid(
            GRID,
            [Case({"case": "a"}, _quick), Case({"case": "b"}, _quick)],
            device="cpu",
            store=store,
            log=log,
        )
    [run] = store.runs(MACHINE, SHA)
    assert run.records[record_key(GRID, {"case": "a"})]["status"] == "ok"
    assert run.records[RUN_KEY]["partial"] and "between cases" in run.records[RUN_KEY]["reason"]
    assert not any(r.get("status") == INTERRUPTED for r in run.results().values())


def test_a_second_signal_while_the_first_is_handled_is_ignored():
    # the handler the process started with: Python's, or SIG_IGN where a shell started the tests in
    # the background with no job control
    before = signal.getsignal(signal.SIGINT)
    with interruptible():
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        os.kill(os.getpid(), signal.SIGINT)  # while the interrupt is recorded: ignored
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is before


def test_mark_partial_turns_only_placeholders_into_interrupted(tmp_path):
    store = ResultStore(tmp_path)
    placeholder = {
        "key": "g|case=a",
        "status": "crashed",
        "reason": f"{IN_PROGRESS}; ...",
        "date": "2026-01-02",
    }
    done = {"key": "g|case=b", "status": "ok", "date": "2026-01-02"}
    store.save(MACHINE, SHA, [placeholder, done], run_id="r1")
    marked = store.mark_partial(
        MACHINE, SHA, "interrupted by SIGINT", ["g|case=a", "g|case=b"], run_id="r1"
    )
    assert marked == ["g|case=a"]
    [run] = store.runs(MACHINE, SHA)
    assert run.records["g|case=a"]["status"] == INTERRUPTED
    assert run.records["g|case=b"]["status"] == "ok"
    assert run.records[RUN_KEY] == {
        "key": RUN_KEY,
        "date": "2026-01-02",
        "partial": True,
        "reason": "interrupted by SIGINT",
    }
    assert store.mark_partial(MACHINE, SHA, "x", run_id="none") == []  # no file: none made
    assert not store.path(MACHINE, SHA, "none").exists()


def test_load_keeps_a_verdict_over_a_later_interrupted_record(tmp_path):
    store = ResultStore(tmp_path)
    store.save(
        MACHINE,
        SHA,
        [
            {"key": "g|case=a", "status": "ok", "date": "2026-01-01"},
            {"key": "g|case=b", "status": "ok", "date": "2026-01-01"},
        ],
        run_id="r1",
    )
    store.save(
        MACHINE,
        SHA,
        [
            {"key": "g|case=a", "status": INTERRUPTED, "date": "2026-01-02"},
            {"key": "g|case=c", "status": INTERRUPTED, "date": "2026-01-02"},
        ],
        run_id="r2",
    )
    loaded = store.load(MACHINE, SHA)
    assert {k: r["status"] for k, r in loaded.items()} == {
        "g|case=a": "ok",
        "g|case=b": "ok",
        "g|case=c": INTERRUPTED,
    }


# -- optbench compare ----------------------------------------------------------------------------

BASE, HEAD = commit(1), commit(2)
KEYS = [{"variant": v} for v in ("eager", "compiled", "fused")]


def _steps(seed: int, statuses: dict[str, str] | None = None) -> list[dict]:
    statuses = statuses or {}
    return [
        record(
            "bench_step.StepTiny",
            p,
            status=statuses.get(p["variant"], "ok"),
            times={"step": (samples(50.0 + i, seed + i), samples(51.0 + i, seed - i))},
        )
        for i, p in enumerate(KEYS)
        if statuses.get(p["variant"]) != "absent"
    ]


def _compare(store: ResultStore, capsys) -> tuple[int, str]:
    code = cmp.main([BASE[:10], HEAD[:10], "--results", str(store.root)])
    return code, capsys.readouterr().out


def test_compare_reports_an_interrupted_record_and_never_gates_it(tmp_path, capsys):
    """Head: a run interrupted in its second case (the third never ran) against a complete base on
    the same GPU: no regression, exit 0; the interrupted case is listed as such."""
    store = ResultStore(tmp_path)
    save(store, "h100-sxm", BASE, "2025-01-01T00:00:00+00:00", _steps(1), gpu_uuid=GPU)
    save(
        store,
        "h100-sxm",
        HEAD,
        "2025-01-02T00:00:00+00:00",
        _steps(2, {"compiled": INTERRUPTED, "fused": "absent"}),
        gpu_uuid=GPU,
    )
    changes = cmp.compare(store, BASE, HEAD)
    stopped = [c for c in changes if c.head_status == INTERRUPTED]
    assert len(stopped) == 1 and not stopped[0].gated and not stopped[0].regression
    assert cmp.verdict(stopped[0]) == cmp.INTERRUPTED_RUN and cmp.shown(stopped[0])
    assert not any(c.regression for c in changes)
    code, out = _compare(store, capsys)
    assert code == 0 and "REGRESSION" not in out and cmp.INTERRUPTED_RUN in out
    assert "interrupted (partial runs)" in out


def test_a_crash_is_still_a_regression_and_an_earlier_complete_run_wins_over_an_interrupted_one(
    tmp_path, capsys
):
    store = ResultStore(tmp_path)
    save(store, "h100-sxm", BASE, "2025-01-01T00:00:00+00:00", _steps(1), gpu_uuid=GPU)
    save(
        store,
        "h100-sxm",
        HEAD,
        "2025-01-02T00:00:00+00:00",
        _steps(2, {"fused": "crashed"}),
        gpu_uuid=GPU,
        run_id="complete",
    )
    save(
        store,
        "h100-sxm",
        HEAD,
        "2025-01-03T00:00:00+00:00",
        _steps(3, {"eager": INTERRUPTED, "compiled": "absent", "fused": "absent"}),
        gpu_uuid=GPU,
        run_id="partial",
    )
    changes = cmp.compare(store, BASE, HEAD)
    assert {c.key.split("=")[-1] for c in changes if c.regression} == {"fused"}  # a real crash
    assert not any(c.head_status == INTERRUPTED for c in changes)  # eager: the complete run's
    assert _compare(store, capsys)[0] == 1


def test_a_head_with_only_interrupted_records_is_nothing_comparable(tmp_path, capsys):
    store = ResultStore(tmp_path)
    save(store, "h100-sxm", BASE, "2025-01-01T00:00:00+00:00", _steps(1), gpu_uuid=GPU)
    save(
        store,
        "h100-sxm",
        HEAD,
        "2025-01-02T00:00:00+00:00",
        _steps(2, {"eager": INTERRUPTED, "compiled": "absent", "fused": "absent"}),
        gpu_uuid=GPU,
    )
    code, out = _compare(store, capsys)
    assert code == 2 and "REGRESSION" not in out


# -- process trees ------------------------------------------------------------------------------

# A grid process's stand-in: bound to its parent as measure_suite binds one, in a process group of
# its own as asv starts one; it reports a running case, and records an interrupt to a file as
# run_grid does.
GRID_PROCESS = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from optbench.run import progress
    from optbench.measure.signals import die_with_parent, interruptible
    die_with_parent()
    Path(sys.argv[1]).write_text(str(os.getpid()))
    try:
        with interruptible():
            progress.case_started("bench_test.Grid|case=a", "bench_test.Grid")
            time.sleep(600)
    except KeyboardInterrupt as exc:
        Path(sys.argv[1] + ".interrupted").write_text(exc.signal)
""")
# asv's stand-in: starts the grid process in a process group of its own and waits.
ASV = textwrap.dedent("""
    import os, subprocess, sys, time
    grid = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], process_group=0)
    Path = __import__("pathlib").Path
    Path(sys.argv[2] + ".asv").write_text(str(os.getpid()))
    grid.wait()
    time.sleep(600)
""")
# optbench run's stand-in: follows the run's progress while the asv stand-in runs.
PARENT = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from optbench.run import progress
    follower = progress.Follower(Path(sys.argv[3]), 1, live=False)
    try:
        command = [sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[4]]
        log = Path(sys.argv[3]).with_suffix(".asv.log")
        progress.run_followed(command, os.environ, follower, Path.cwd(), log, grace_s=30)
    except progress.RunInterrupted as exc:
        said = {"signal": exc.signal, "stopped": exc.stopped}
        Path(sys.argv[4] + ".parent").write_text(json.dumps(said))
        sys.exit(130)
""")


@pytest.fixture
def parents() -> list[subprocess.Popen]:
    """The parent stand-ins a test starts: killed at its end where still running (their children
    follow)."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _tree(
    tmp_path: Path, parents: list[subprocess.Popen]
) -> tuple[subprocess.Popen, Path, int, int]:
    """optbench run -> asv -> grid process stand-ins; returns the parent, the grid's pid file, and
    the pids of asv and the grid once the grid's case runs."""
    pid_file, events = tmp_path / "grid.pid", tmp_path / "progress.jsonl"
    events.touch()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OPTBENCH_PROGRESS": str(events)}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, ASV, GRID_PROCESS, str(events), str(pid_file)],
        cwd=REPO_ROOT,
        env=env,
    )
    parents.append(parent)
    deadline = time.monotonic() + 60
    while (
        not (
            pid_file.with_name("grid.pid.asv").exists()
            and progress.running_cases(progress.read_events(events))
        )
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert progress.running_cases(progress.read_events(events)), "the grid stand-in never started"
    asv = int(pid_file.with_name("grid.pid.asv").read_text())
    return parent, pid_file, asv, int(pid_file.read_text())


def _gone(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while any(progress.alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(progress.alive(pid) for pid in pids)


def test_killing_the_parent_ends_its_children(tmp_path, parents):
    """SIGKILL to optbench run's stand-in: asv's gets SIGINT from the kernel, the grid process
    SIGTERM when asv's ends, which it records as an interrupt; all are gone within seconds."""
    parent, pid_file, asv, grid = _tree(tmp_path, parents)
    parent.kill()
    parent.wait()
    assert _gone([asv, grid], within_s=30), "children outlived their parent"
    assert Path(f"{pid_file}.interrupted").read_text() == "SIGTERM"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_parent_is_passed_on_and_it_waits_for_its_children(
    tmp_path, parents, signum
):
    """SIGTERM (a cancel) or SIGINT (Ctrl-C) to optbench run's stand-in only: the grid process is
    told first, by the same signal, and records it; then asv's ends; the parent ends last, naming
    the running case."""
    parent, pid_file, asv, grid = _tree(tmp_path, parents)
    parent.send_signal(signum)
    assert parent.wait(timeout=60) == 130
    assert not progress.alive(asv) and not progress.alive(grid)
    assert Path(f"{pid_file}.interrupted").read_text() == signal.Signals(signum).name
    said = json.loads(Path(f"{pid_file}.parent").read_text())
    assert said == {"signal": signal.Signals(signum).name, "stopped": {f"{GRID}|case=a": grid}}


# -- a real run -----------------------------------------------------------------------------------

CPU_BASE = "26c843170d685b63b91a96fe1c24b32a0dbd9ea1"  # a commit with committed CPU results
BASE_FILE = ResultStore(REPO_ROOT / "results").legacy_path("cpu-amd-epyc", CPU_BASE)
RUN_ID = "20261126T000000Z-sigint"


def _project_copy(path: Path, machine: str) -> Path:
    """This checkout's files (tracked and untracked, not ignored; no results) in a new repository at
    ``path``, with the committed CPU results of :data:`CPU_BASE` as ``machine``'s."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    for name in files:
        if not name.startswith("results/") and (REPO_ROOT / name).is_file():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_bytes((REPO_ROOT / name).read_bytes())
    base = path / "results" / machine / "optbench" / BASE_FILE.name
    base.parent.mkdir(parents=True)
    base.write_bytes(BASE_FILE.read_bytes())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run([*git, *args], cwd=path, check=True)
    return path


@pytest.mark.slow
@pytest.mark.skipif(not BASE_FILE.exists(), reason="no committed CPU results")
def test_ctrl_c_in_a_real_cpu_run_records_the_case_interrupted_and_compare_invents_nothing(
    tmp_path,
):
    """``optbench run`` of the CPU suite's eager tiny step, SIGINT to its process group (a
    terminal's Ctrl-C) once the case runs: exit 130, the grid process gone within seconds, the case
    'interrupted' and the run partial, both by SIGINT; compare against committed CPU results
    reports it as such, with no regression."""
    from optbench.measure.machine import machine_name
    from optbench.run.runner import measured_commit

    machine = machine_name()
    repo = _project_copy(tmp_path / "repo", machine)
    env = {**os.environ, "PYTHONPATH": str(repo), "OPTBENCH_RUN_ID": RUN_ID}
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "optbench",
            "run",
            "--suite",
            "cpu",
            "--select",
            r"StepTiny\|variant=eager$",
            "--no-html",
        ],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    events = repo / "results" / machine / "progress" / f"{RUN_ID}.jsonl"
    try:
        deadline = time.monotonic() + 400
        while not (events.exists() and progress.running_cases(progress.read_events(events))):
            assert run.poll() is None and time.monotonic() < deadline, "the case never started"
            time.sleep(0.05)
        [grid] = progress.running_cases(progress.read_events(events)).values()
        os.killpg(run.pid, signal.SIGINT)
        assert run.wait(timeout=120) == 130
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert _gone([grid], within_s=30)
    [partial] = ResultStore(repo / "results").runs(machine, measured_commit("HEAD", cwd=repo))
    stopped, run = partial.records["bench_step.StepTiny|variant=eager"], partial.records[RUN_KEY]
    assert stopped["status"] == INTERRUPTED and run["partial"]
    # the signal that stopped the run, not the one it was passed on with
    assert stopped["reason"].startswith("interrupted by SIGINT ")
    assert run["reason"].startswith("interrupted by SIGINT "), run
    out = subprocess.run(
        [sys.executable, "-m", "optbench", "compare", CPU_BASE[:8], "HEAD", "--machine", machine],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "REGRESSION" not in out.stdout and cmp.INTERRUPTED_RUN in out.stdout
    assert out.returncode in (0, 2), out.stdout + out.stderr  # 2: a CPU has no GPU to gate on
