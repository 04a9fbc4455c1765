"""asv's ``worktree`` environment (optbench.asv.asv_worktree): commits checked out into git
worktrees and run on this interpreter, so that ``asv continuous BASE HEAD`` measures both and gates
on them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from asv.config import Config
from asv.runner import BENCHMARK_RUN_SCRIPT

from optbench.asv.asv_worktree import KEEP_WORKTREES, WorktreeEnvironment, python_path
from optbench.store.records import Record
from optbench.store.store import REPO_ROOT, ResultStore, record_key

GIT = ["git", "-c", "user.name=optbench", "-c", "user.email=optbench@example.invalid"]
MACHINE = "optbench-test"
STEP_KEY = record_key("bench_step.StepTiny", {"variant": "eager"})
# The plant, per optimizer step: 10-20x the tiny step (25-45 ms on one thread, also under load).
PLANT_S = 0.5
FACTOR = "3"  # asv's -f: the plant clears it by far; load swings between two runs stay below it


def commit(repo: Path, message: str) -> str:
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", message], cwd=repo, check=True)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def new_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True)
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
        hashes.append(commit(repo, f"value {i}"))
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


def _project_copy(path: Path) -> Path:
    """This checkout's files (tracked and untracked; ignored ones and results/ left out) in a new
    repository at ``path``."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    repo = new_repo(path)
    for name in files:
        if name.startswith("results/") or not (REPO_ROOT / name).is_file():
            continue
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, repo / name)
    return repo


def _asv(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "asv", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _step_ms(repo: Path, commit_hash: str) -> float:
    """The wall ms per step that optbench stored for ``commit_hash`` in ``repo``'s results."""
    record = ResultStore(repo / "results").load(MACHINE, commit_hash)[STEP_KEY]
    assert record["commit"] == commit_hash
    return Record.of(record).timing("step", "wall").median_ms


@pytest.mark.slow
def test_asv_continuous_measures_both_commits_and_fails_on_a_planted_slowdown(tmp_path):
    repo = _project_copy(tmp_path / "repo")
    base = commit(repo, "base")
    step_py = repo / "models" / "step.py"
    step_py.write_text(step_py.read_text() + "# a comment: no change in what runs\n")
    neutral = commit(repo, "neutral")
    anchor = "    def _step(self) -> Tensor:\n"
    assert anchor in step_py.read_text()
    step_py.write_text(
        step_py.read_text().replace(
            anchor, f"{anchor}        __import__('time').sleep({PLANT_S})  # planted slowdown\n"
        )
    )
    planted = commit(repo, "planted")

    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPTBENCH_", "ASV", "PYTHONPATH"))
    }
    # One thread: two threads on a loaded 2-core machine make a tiny step 10-70x slower, at random.
    env.update(
        HOME=str(tmp_path / "home"),
        OMP_NUM_THREADS="1",
        OPTBENCH_SUITE="cpu",
        OPTBENCH_SELECT=r"StepTiny\|variant=eager$",
    )
    assert _asv(repo, env, "machine", "--yes", "--machine", MACHINE).returncode == 0
    gate = [
        "continuous",
        "-E",
        "worktree:same",
        "--machine",
        MACHINE,
        "-f",
        FACTOR,
        "--bench",
        "StepTiny.track_step_ms",
    ]

    same = _asv(repo, env, *gate, base, neutral)
    assert same.returncode == 0, same.stdout + same.stderr
    slower = _asv(repo, env, *gate, neutral, planted)
    assert slower.returncode == 1, slower.stdout + slower.stderr
    assert "PERFORMANCE DECREASED" in slower.stdout
    assert "bench_step.StepTiny.track_step_ms('eager')" in slower.stdout

    for h in (base, neutral, planted):  # asv's results, and optbench's records, under each commit
        assert list((repo / "results" / "asv" / MACHINE).glob(f"{h[:8]}-worktree-*.json")), h
    unplanted = max(_step_ms(repo, base), _step_ms(repo, neutral))
    assert unplanted < PLANT_S * 1000 <= _step_ms(repo, planted)
