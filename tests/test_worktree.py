"""optbench.run.worktree: a commit's code in a worktree of its own, without its results/, also
where the repository lacks the blobs of old results (a copy restored from the history pack)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from optbench.run import worktree


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def _repo(path: Path) -> tuple[Path, str, str]:
    """A repository of two commits, each with its code and results, where the first commit's
    results blob is gone (as in a copy restored from scripts/history_pack.py's pack)."""
    path.mkdir()
    _git(path, "init", "-q", "-b", "main")
    _git(path, "config", "user.email", "t@example.invalid")
    _git(path, "config", "user.name", "t")
    (path / "results").mkdir()
    commits = []
    for i in (1, 2):
        (path / "code.py").write_text(f"VALUE = {i}\n")
        (path / "results" / "run.json").write_text(f'{{"ms": {i}}}\n')
        _git(path, "add", ".")
        _git(path, "commit", "-q", "-m", f"{i}")
        commits.append(_git(path, "rev-parse", "HEAD"))
    old = _git(path, "rev-parse", f"{commits[0]}:results/run.json")
    (path / ".git" / "objects" / old[:2] / old[2:]).unlink()
    return path, commits[0], commits[1]


def test_a_worktree_holds_the_code_alone_and_checks_out_any_commit(tmp_path: Path) -> None:
    repo, first, second = _repo(tmp_path / "repo")
    tree = worktree.add(tmp_path / "tree", first, repo)
    assert (tree / "code.py").read_text() == "VALUE = 1\n"
    assert not (tree / "results").exists()
    assert _git(tree, "status", "--porcelain") == ""
    worktree.switch(tree, second)
    assert (tree / "code.py").read_text() == "VALUE = 2\n"
    (tree / "code.py").write_text("changed\n")
    worktree.switch(tree, first)  # local changes are dropped, the missing blob is never read
    assert (tree / "code.py").read_text() == "VALUE = 1\n" and not (tree / "results").exists()
    assert _git(repo, "config", "--default", "unset", "--get", "core.sparseCheckout") == "unset"
    worktree.remove(tree, repo)
    assert not tree.exists() and str(tree) not in _git(repo, "worktree", "list")


def test_a_full_checkout_of_the_old_commit_fails_there(tmp_path: Path) -> None:
    """Mutation: a plain ``git worktree add`` needs the missing blob, so the repository above is
    one where leaving results/ out is what lets the worktree be made."""
    repo, first, _ = _repo(tmp_path / "repo")
    with pytest.raises(subprocess.CalledProcessError):
        _git(repo, "worktree", "add", "--detach", str(tmp_path / "full"), first)


def test_a_relative_ref_is_the_repository_s_and_an_older_worktree_loses_its_results(
    tmp_path: Path,
) -> None:
    repo, first, second = _repo(tmp_path / "repo")
    tree = worktree.add(tmp_path / "tree", "HEAD~1", repo)  # HEAD~1 of repo, not of the new tree
    assert _git(tree, "rev-parse", "HEAD") == first
    worktree.remove(tree, repo)
    full = tmp_path / "full"  # as an optbench before this module made its worktrees
    _git(repo, "worktree", "add", "--detach", str(full), second)
    assert (full / "results" / "run.json").exists()
    worktree.switch(full, second)
    assert not (full / "results").exists() and _git(full, "status", "--porcelain") == ""


def test_remove_takes_any_folder_and_a_failed_add_leaves_nothing(tmp_path: Path) -> None:
    repo, first, _ = _repo(tmp_path / "repo")
    stray = tmp_path / "stray"
    (stray / "sub").mkdir(parents=True)  # a folder left by a killed job, no worktree git knows
    worktree.remove(stray, repo)
    assert not stray.exists()
    assert worktree.add(stray, first, repo).exists()  # the same path is free again
    listed = _git(repo, "worktree", "list")
    code = _git(repo, "rev-parse", f"{first}:code.py")
    (repo / ".git" / "objects" / code[:2] / code[2:]).unlink()  # the checkout itself fails
    with pytest.raises(subprocess.CalledProcessError):
        worktree.add(tmp_path / "bad", first, repo)
    assert not (tmp_path / "bad").exists() and _git(repo, "worktree", "list") == listed


def test_worktrees_leave_out_what_the_history_pack_leaves_out():
    """scripts/history_pack.py's pack lacks old blobs under results/ exactly where no worktree
    checks them out: both name the same sparse-checkout patterns."""
    import importlib.util

    from optbench.store.store import REPO_ROOT

    spec = importlib.util.spec_from_file_location(
        "history_pack", REPO_ROOT / "scripts" / "history_pack.py"
    )
    history_pack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(history_pack)
    assert history_pack.CODE_ONLY == worktree.SPARSE_PATTERNS
