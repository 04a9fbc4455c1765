"""Plain asv, as README's "asv by hand" lines and docs/runners.md type it, in a new clone with the
committed asv.conf.json (its environment: optbench's worktree one). After the quick start registered
the machine, ``asv run HEAD~2..HEAD`` stores asv's results and optbench's records under the same
machine and commits, ``asv compare`` pairs them (numbers, not n/a), ``asv publish`` writes the site
and ``asv preview`` serves it, and git sees nothing new. ``asv continuous HEAD~1 HEAD`` on two
commits of the same code exits 0 at the docs' factor for a shared CPU, and reports a planted
slowdown; ``asv run HEAD^!`` stores one commit and ``asv find`` names the planted one (the CPU
suite's own classes, timed by asv: benchmarks/bench_cpu.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from asv_repo import (
    MACHINE,
    PLANT,
    SHARED_CPU_FACTOR,
    asv,
    asv_env,
    copy_checkout,
    git,
    head,
    planted_commit,
    same_code_commit,
)
from free_port import free_port

from optbench.store.store import ResultStore

BENCH = "StepTiny.track_step_ms"
SELECT = r"StepTiny\|variant=eager$"  # one case: a short test
CPU_BENCH = r"GradStats.time_grad_stats"  # the smallest of the CPU suite's classes


def _run(repo: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_plain_asv_runs_compares_and_publishes_under_optbench_machine_and_commits(tmp_path):
    repo = copy_checkout(tmp_path / "repo")
    commits = [same_code_commit(repo, name) for name in ("base", "head")]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPTBENCH_", "ASV", "PYTHONPATH"))
    }
    env.update(
        HOME=str(tmp_path / "home"),
        OPTBENCH_SUITE="cpu",
        OPTBENCH_SELECT=SELECT,
        PYTHONPATH=str(repo),
    )
    (tmp_path / "home").mkdir()
    # a user's asv machine file often names other machines already: asv then needs --machine
    other = {"other-box": {"machine": "other-box", "os": "", "arch": "", "cpu": "", "num_cpu": "1"}}
    (tmp_path / "home" / ".asv-machine.json").write_text(json.dumps({**other, "version": 1}))
    # what `nox -s bench` (optbench run) does first: name this machine and tell asv
    machine = _run(
        repo,
        env,
        "-c",
        "from optbench.cli import register_machine; "
        "from optbench.measure.machine import machine_name; "
        "register_machine(machine_name()); print(machine_name())",
    ).strip()
    assert _run(repo, env, "-m", "optbench", "machine", "--name").strip() == machine
    del env["PYTHONPATH"]  # asv by hand: the worktree environment puts each commit's code first

    on = ("--machine", machine)  # README: M=$(python -m optbench machine --name)
    _run(repo, env, "-m", "asv", "run", *on, "--bench", BENCH, "HEAD~2..HEAD")
    for commit in commits:
        assert list((repo / "results" / "asv" / machine).glob(f"{commit[:8]}-worktree-py*.json"))
        assert ResultStore(repo / "results").load(machine, commit), commit  # optbench's, beside

    compared = _run(repo, env, "-m", "asv", "compare", *on, "HEAD~1", "HEAD")
    row = next(line for line in compared.splitlines() if f"{BENCH}('eager')" in line)
    # before, after, ratio
    assert re.search(r"\|\s*[\d.]+\s*\|\s*[\d.]+\s*\|\s*[\d.]+\s*\|", row), compared

    _run(repo, env, "-m", "asv", "publish")
    assert (repo / "html" / "asv" / "index.html").is_file()
    port = free_port()
    preview = subprocess.Popen(
        [sys.executable, "-m", "asv", "preview", "--port", str(port)],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.json", timeout=5) as r:
                    assert machine in r.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("asv preview served nothing")
    finally:
        preview.terminate()
        preview.wait(timeout=30)

    # The new machine's results and the HTML are ignored; asv's rewritten list of benchmarks
    # (results/asv/benchmarks.json) is the committed one: the same whatever the suite.
    changed = git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()
    assert changed == [], changed


def _results(repo: Path, commit: str) -> dict[str, list]:
    """asv's stored values of ``commit`` in ``repo`` (the worktree environment's file), by
    benchmark."""
    (path,) = (repo / "results" / "asv" / MACHINE).glob(f"{commit[:8]}-worktree-py*.json")
    data = json.loads(path.read_text())
    column = data["result_columns"].index("result")
    return {name: row[column] for name, row in data["results"].items()}


@pytest.mark.slow
def test_asv_continuous_run_and_find_as_typed_on_the_cpu_classes(tmp_path):
    """The committed config, no -E: ``asv continuous -f SHARED_CPU_FACTOR HEAD~1 HEAD`` of two
    same-code commits exits 0 with both measured; the same command reports a ``grad_stats_loop``
    PLANT times slower; ``asv run <commit>^!`` stores that commit; ``asv find`` names the planted
    commit. Commits: the clone's c0, c1 (same code), c2 (planted), c3 and c4 (same code as c2)."""
    repo = copy_checkout(tmp_path / "repo")
    c0 = head(repo)
    same_code_commit(repo, "c1")
    c2 = planted_commit(repo, "kernels/grad_stats.py", "grad_stats_loop", PLANT)
    c3, c4 = (same_code_commit(repo, name) for name in ("c3", "c4"))
    env = asv_env(tmp_path / "home")
    on = ("--machine", MACHINE, "--bench", CPU_BENCH)
    gate = ("continuous", "-f", SHARED_CPU_FACTOR, *on)

    same = asv(repo, env, *gate, "HEAD~1", "HEAD")
    assert same.returncode == 0, same.stdout + same.stderr
    for commit in (c3, c4):  # every parameter of each commit measured
        assert None not in _results(repo, commit)["bench_cpu.GradStats.time_grad_stats"], commit

    slower = asv(repo, env, *gate, "HEAD~3", "HEAD~2")
    assert slower.returncode == 1, slower.stdout + slower.stderr
    assert "PERFORMANCE DECREASED" in slower.stdout
    assert "time_grad_stats('loop')" in slower.stdout

    one = asv(repo, env, "run", *on, "HEAD~4^!")
    assert one.returncode == 0, one.stdout + one.stderr
    assert None not in _results(repo, c0)["bench_cpu.GradStats.time_grad_stats"]

    # the planted parameter alone (asv matches a regex against "name(params)"): find follows the
    # largest step of any parameter it times, each over its own size, so the foreach's noise would
    # compete with the loop's step
    loop = rf"bench_cpu\.{CPU_BENCH}\('loop'\)"
    found = asv(repo, env, "find", "--machine", MACHINE, "HEAD~4..HEAD", loop)
    assert found.returncode == 0, found.stdout + found.stderr
    assert f"Greatest regression found: {c2[:8]}" in found.stdout + found.stderr
