"""scripts/restore-history.sh: a copied tree gets its history from the bundle; a checkout ahead of
the bundle keeps its branches where they are."""

import shutil
import subprocess
from pathlib import Path

from optbench.store.store import REPO_ROOT

ROOT = REPO_ROOT


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def _repo(path: Path) -> Path:
    path.mkdir()
    _git(path, "init", "-q", "-b", "main")
    _git(path, "config", "user.email", "t@example.invalid")
    _git(path, "config", "user.name", "t")
    (path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "restore-history.sh", path / "scripts")
    (path / "a.txt").write_text("1\n")
    _git(path, "add", ".")
    _git(path, "commit", "-q", "-m", "one")
    (path / ".bundle").mkdir()
    _git(path, "bundle", "create", "-q", ".bundle/optbench.bundle", "--all")
    return path


def _restore(path: Path) -> None:
    subprocess.run(
        ["bash", "scripts/restore-history.sh"], cwd=path, check=True, capture_output=True, text=True
    )


def test_a_copy_without_history_gets_the_bundles(tmp_path: Path) -> None:
    origin = _repo(tmp_path / "origin")
    copy = tmp_path / "copy"
    shutil.copytree(origin, copy, ignore=shutil.ignore_patterns(".git"))
    _git(copy, "init", "-q", "-b", "main")  # what a lent machine gets: a .git without commits
    _restore(copy)
    assert _git(copy, "rev-parse", "HEAD") == _git(origin, "rev-parse", "HEAD")
    assert _git(copy, "status", "--porcelain", "--untracked-files=no") == ""


def test_a_checkout_ahead_of_the_bundle_stays(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    (repo / "a.txt").write_text("2\n")
    _git(repo, "commit", "-q", "-am", "two")  # newer than the bundle
    head = _git(repo, "rev-parse", "HEAD")
    _restore(repo)
    assert _git(repo, "rev-parse", "main") == head
    assert _git(repo, "status", "--porcelain", "--untracked-files=no") == ""
