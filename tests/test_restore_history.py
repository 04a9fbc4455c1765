"""scripts/restore-history.sh: a copied tree gets its history from the pack
(scripts/history_pack.py: every object but the blobs the tree holds, which it makes from the
files, and old results, which no worktree checks out); a checkout ahead of the pack keeps its
branches where they are; a copy that differs from the pack's commit is refused."""

import shutil
import subprocess
import sys
from pathlib import Path

from optbench.run import worktree
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
    for script in ("restore-history.sh", "history_pack.py"):
        shutil.copy(ROOT / "scripts" / script, path / "scripts")
    (path / ".gitignore").write_text(".bundle/\n")
    (path / "a.txt").write_text("1\n")
    (path / "results").mkdir()
    (path / "results" / "run.json").write_text("run 1\n")
    _git(path, "add", ".")
    _git(path, "commit", "-q", "-m", "one")
    (path / "a.txt").write_text("2\n")
    (path / "results" / "run.json").write_text("run 2\n")
    (path / "results" / "a-copy.txt").write_text("1\n")  # a.txt's old blob, now under results/
    (path / "b.txt").write_text("b\n")
    (path / "link").symlink_to("b.txt")
    _git(path, "add", ".")
    _git(path, "commit", "-q", "-m", "two")
    _git(path, "rm", "-q", "results/a-copy.txt")
    _git(path, "commit", "-q", "-m", "three")  # a.txt's first blob is history's alone
    _git(path, "branch", "side", "HEAD~1")
    pack = [sys.executable, "scripts/history_pack.py", "pack"]
    subprocess.run(pack, cwd=path, check=True, capture_output=True)
    return path


def _restore(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/restore-history.sh"], cwd=path, capture_output=True, text=True
    )


def test_a_copy_without_history_gets_the_bundles(tmp_path: Path) -> None:
    origin = _repo(tmp_path / "origin")
    copy = tmp_path / "copy"
    shutil.copytree(origin, copy, ignore=shutil.ignore_patterns(".git"), symlinks=True)
    _git(copy, "init", "-q", "-b", "main")  # what a lent machine gets: a .git without commits
    assert _restore(copy).returncode == 0
    assert _git(copy, "rev-parse", "HEAD") == _git(origin, "rev-parse", "HEAD")
    assert _git(copy, "rev-parse", "side") == _git(origin, "rev-parse", "side")
    assert _git(copy, "status", "--porcelain", "--untracked-files=no") == ""
    # from the pack, though a newer commit held it under results/ (where rev-list finds it first)
    assert _git(copy, "show", "HEAD~2:a.txt") == "1"
    listed = _git(copy, "rev-list", "--objects", "--missing=print", "--branches", "HEAD")
    missing = [line[1:] for line in listed.splitlines() if line.startswith("?")]
    assert missing == [_git(origin, "rev-parse", "HEAD~2:results/run.json")]  # old results alone
    tree = worktree.add(tmp_path / "one", "HEAD~2", copy)  # the code of a commit of the pack
    assert (tree / "a.txt").read_text() == "1\n"


def test_the_pack_leaves_out_the_blobs_the_tree_holds(tmp_path: Path) -> None:
    origin = _repo(tmp_path / "origin")
    packed = (origin / ".bundle" / "history.pack").stat().st_size
    _git(origin, "bundle", "create", "-q", str(tmp_path / "all.bundle"), "--all")
    assert packed < (tmp_path / "all.bundle").stat().st_size


def test_a_copy_of_another_commit_is_refused(tmp_path: Path) -> None:
    """Mutation: a file that differs from the pack's commit made into its blob unchecked."""
    origin = _repo(tmp_path / "origin")
    copy = tmp_path / "copy"
    shutil.copytree(origin, copy, ignore=shutil.ignore_patterns(".git"), symlinks=True)
    (copy / "b.txt").write_text("changed\n")
    _git(copy, "init", "-q", "-b", "main")
    done = _restore(copy)
    assert done.returncode == 2 and "b.txt differs" in done.stderr
    assert _git(copy, "branch", "--list") == ""


def test_a_checkout_ahead_of_the_bundle_stays(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    (repo / "a.txt").write_text("3\n")
    _git(repo, "commit", "-q", "-am", "three")  # newer than the pack
    head = _git(repo, "rev-parse", "HEAD")
    assert _restore(repo).returncode == 0
    assert _git(repo, "rev-parse", "main") == head
    assert _git(repo, "status", "--porcelain", "--untracked-files=no") == ""
