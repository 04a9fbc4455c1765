"""asv's ``worktree`` environment (optbench.asv.asv_worktree): commits checked out into git
worktrees and run on this interpreter, so that ``asv continuous BASE HEAD`` measures both and gates
on them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from asv.config import Config
from asv.runner import BENCHMARK_RUN_SCRIPT
from asv_repo import (
    MACHINE,
    PLANT,
    SHARED_CPU_FACTOR,
    asv,
    asv_env,
    commit,
    copy_checkout,
    git,
    head,
    planted_commit,
    same_code_commit,
)

from optbench.asv.asv_worktree import KEEP_WORKTREES, WorktreeEnvironment, python_path
from optbench.store.records import Record
from optbench.store.store import ResultStore, record_key

STEP_KEY = record_key("bench_step.StepTiny", {"variant": "eager"})


def new_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    return path


def test_python_path_puts_the_worktree_first_and_drops_the_repository(tmp_path):
    repo, tree, site = tmp_path / "repo", tmp_path / "tree", tmp_path / "site"
    inherited = os.pathsep.join([str(repo), str(site), ""])
    assert python_path(tree, inherited, repo) == os.pathsep.join([str(tree), str(site)])
    assert python_path(tree, None, repo) == str(tree)


def _conf(repo: Path) -> Config:
    conf = Config()
    conf.repo, conf.project, conf.dvcs = str(repo), "probe", "git"
    conf.env_dir, conf.results_dir = str(repo / ".asv" / "env"), str(repo / "results" / "asv")
    return conf


def test_each_commit_runs_from_its_worktree_which_is_reused_and_pruned(tmp_path):
    repo = new_repo(tmp_path / "repo")
    hashes = []
    for i in range(KEEP_WORKTREES + 2):
        (repo / "probe.py").write_text(f"VALUE = {i}\n")
        hashes.append(head(commit(repo, f"value {i}")))
    conf = _conf(repo)
    env = WorktreeEnvironment(conf, "same", {}, {})
    env.create()
    out = tmp_path / "probe.txt"
    # through asv's benchmark script, which takes its sys.path from ASV_PYTHONPATH, not PYTHONPATH
    setup = (
        f"import os, pathlib, probe; pathlib.Path({str(out)!r}).write_text(f'{{probe.VALUE}} "
        '{os.environ["ASV_COMMIT"]} {os.environ["OPTBENCH_RESULTS"]}\')'
    )
    probe = ["timing", "--number", "1", "--repeat", "1", "--setup", setup, "pass"]
    for i, h in enumerate(hashes):
        env.install_project(conf, None, h)
        assert env.installed_commit_hash == h
        env.run([BENCHMARK_RUN_SCRIPT, *probe], env={"PYTHONPATH": str(repo)}, dots=False)
        assert out.read_text().split() == [str(i), h, str(repo / "results")]
    trees = sorted(p.name for p in (repo / ".asv" / "env" / "worktrees").iterdir())
    assert trees == sorted(hashes[-KEEP_WORKTREES:])  # the least recently used went
    listed = subprocess.run(
        ["git", "worktree", "list"], cwd=repo, capture_output=True, text=True
    ).stdout
    assert hashes[0] not in listed and hashes[-1] in listed

    tree = repo / ".asv" / "env" / "worktrees" / hashes[-2]
    (tree / "probe.py").write_text("VALUE = 'edited'\n")
    (tree / "untracked").touch()
    env.install_project(conf, None, hashes[-2])
    assert (tree / "untracked").exists()  # reused, and reset to its commit:
    assert (tree / "probe.py").read_text() == f"VALUE = {len(hashes) - 2}\n"


@pytest.mark.slow
def test_plain_asv_continuous_passes_same_code_and_reports_a_planted_slower_step(tmp_path):
    """``asv continuous BASE HEAD`` as typed (the configured worktree environment) with the docs'
    factor for a shared CPU: two commits of the same code pass, a training step that spends PLANT
    times its CPU time (every variant of the tiny grid) is reported. Each commit's asv results and
    optbench records are stored under its hash."""
    repo = copy_checkout(tmp_path / "repo")
    base = head(repo)
    neutral = same_code_commit(repo, "neutral")
    planted = planted_commit(repo, "models/step.py", "TrainStep.__call__", PLANT)
    env = asv_env(tmp_path / "home", OPTBENCH_SUITE="cpu")
    gate = [
        "continuous",
        "--machine",
        MACHINE,
        "-f",
        SHARED_CPU_FACTOR,
        "--bench",
        "StepTiny.track_step_ms",
    ]

    same = asv(repo, env, *gate, base, neutral)
    assert same.returncode == 0, same.stdout + same.stderr
    slower = asv(repo, env, *gate, neutral, planted)
    assert slower.returncode == 1, slower.stdout + slower.stderr
    assert "PERFORMANCE DECREASED" in slower.stdout

    for h in (base, neutral, planted):  # asv's results, and optbench's records, under each commit
        assert list((repo / "results" / "asv" / MACHINE).glob(f"{h[:8]}-worktree-*.json")), h
        record = ResultStore(repo / "results").load(MACHINE, h)[STEP_KEY]
        assert record["commit"] == h
        assert Record.of(record).timing("step", "wall").method == "thread-time"
