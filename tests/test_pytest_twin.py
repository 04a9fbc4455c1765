"""The pytest-benchmark twin's saved runs (benchmarks/conftest.py): optbench's machine record, and
the name and commit_info of the code they measure.

The twin's kernels need a GPU; a trivial benchmark under the same plugin shows what a saved run
holds. It runs in a scratch git work tree holding a copy of the plugin, whose history is a code
commit followed by a results and notes commit: HEAD is not the measured commit there.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optbench.store.store import REPO_ROOT

ROOT = REPO_ROOT
Run = tuple[str, dict]  # a saved run's file name and content


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def make_repo(path: Path) -> str:
    """A work tree at path: the plugin and a trivial benchmark committed, then results and notes;
    returns the code commit."""
    (path / "benchmarks").mkdir()
    for name in ("__init__.py", "conftest.py"):
        shutil.copy(ROOT / "benchmarks" / name, path / "benchmarks" / name)
    (path / "test_trivial.py").write_text(
        "def test_sum(benchmark):\n    benchmark(sum, range(10))\n"
    )
    _git(path, "init", "-q")
    _git(path, "add", ".")
    _git(path, "commit", "-q", "-m", "code")
    code = _git(path, "rev-parse", "HEAD")
    (path / "results").mkdir()
    (path / "results" / "r.json").write_text("{}\n")
    (path / "NOTES.md").write_text("notes\n")
    _git(path, "add", ".")
    _git(path, "commit", "-q", "-m", "results")
    return code


def autosave(repo: Path) -> Run:
    """Runs the trivial benchmark under the plugin in repo with ``--benchmark-autosave``."""
    storage = repo / ".storage"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "test_trivial.py",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "benchmarks.conftest",
        f"--benchmark-storage=file://{storage}",
        "--benchmark-autosave",
    ]
    # the plugin copy, optbench
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(ROOT)])}
    done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [saved] = storage.rglob("*.json")
    return saved.name, json.loads(saved.read_text())


@pytest.fixture(scope="module")
def results_changed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, str, str]:
    """(the run, the code commit, HEAD) where only results and notes differ from HEAD."""
    repo = tmp_path_factory.mktemp("twin")
    code = make_repo(repo)
    (repo / "results" / "r.json").write_text('{"new": 1}\n')
    (repo / "NOTES.md").write_text("more notes\n")
    return autosave(repo), code, _git(repo, "rev-parse", "HEAD")


def test_saved_runs_carry_the_machine(results_changed: tuple[Run, str, str]) -> None:
    machine = results_changed[0][1]["machine_info"]["optbench"]
    assert {
        "gpu_name",
        "gpu_count",
        "driver",
        "cuda",
        "torch",
        "triton",
        "profile",
        "date",
    } <= machine.keys()
    assert machine["torch"] and machine["profile"]


def test_runs_are_named_after_the_measured_commit_and_clean_when_only_results_differ(
    results_changed: tuple[Run, str, str],
) -> None:
    (name, content), code, head = results_changed
    assert head != code
    assert name.startswith(f"0001_{code}_") and "uncommited-changes" not in name
    assert {k: content["commit_info"][k] for k in ("id", "dirty", "head")} == {
        "id": code,
        "dirty": False,
        "head": head,
    }


def test_changed_code_marks_a_run_dirty(tmp_path: Path) -> None:
    """The counterpart of the clean case: a code change is dirty in the name and in commit_info."""
    code = make_repo(tmp_path)
    (tmp_path / "test_trivial.py").write_text(
        "def test_sum(benchmark):\n    benchmark(sum, range(20))\n"
    )
    name, content = autosave(tmp_path)
    assert name.startswith(f"0001_{code}_") and name.endswith("_uncommited-changes.json")
    assert content["commit_info"]["dirty"] is True
