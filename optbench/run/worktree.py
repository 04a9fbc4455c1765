"""A commit's code in a git worktree of its own, without the commit's ``results/``.

Every worktree optbench makes (``optbench ab``'s sides, ``optbench history``'s commits, asv's
``worktree`` environment) holds the commit's code and nothing under ``results/``: a run's records
go to the repository's store, never to a worktree's. The worktree is a sparse checkout: git's
``core.sparseCheckout``, given on each command line (the repository's config stays as it is), with
the patterns in the worktree's own git folder. Git then never reads a blob under ``results/``, so
a copy whose history lacks old results (``scripts/history_pack.py`` leaves them out) checks out
any commit, and a worktree costs the code's bytes alone.

``add`` and ``switch`` raise :class:`subprocess.CalledProcessError` (git's message in
``stderr``) where git fails.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

LEFT_OUT = "results"  # the folder no worktree checks out
SPARSE_PATTERNS = f"/*\n!/{LEFT_OUT}/\n"  # git's non-cone sparse-checkout syntax


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def switch(tree: Path, commit: str) -> None:
    """Check ``commit``'s code out in the worktree ``tree``, detached; local changes are dropped.
    A worktree made without the patterns (an older optbench's) gets them first, so its
    ``results/`` goes."""
    patterns = tree / _git("rev-parse", "--git-path", "info/sparse-checkout", cwd=tree)
    if not patterns.exists() or patterns.read_text() != SPARSE_PATTERNS:
        patterns.parent.mkdir(parents=True, exist_ok=True)
        patterns.write_text(SPARSE_PATTERNS)
    sparse = ("-c", "core.sparseCheckout=true")
    _git(*sparse, "checkout", "--quiet", "--force", "--detach", commit, cwd=tree)


def add(tree: Path, commit: str, root: Path) -> Path:
    """A new detached worktree of ``commit``'s code at ``tree``, of the repository at ``root``
    (``commit`` is resolved there: ``HEAD~1`` is ``root``'s), in place of whatever was at ``tree``
    (an earlier job's worktree, a stray folder); returns ``tree``. Where the checkout fails, the
    worktree is removed before the error is raised."""
    resolved = _git("rev-parse", "--verify", f"{commit}^{{commit}}", cwd=root)
    remove(tree, root)
    _git("worktree", "add", "--no-checkout", "--detach", str(tree), resolved, cwd=root)
    try:
        switch(tree, resolved)
    except subprocess.CalledProcessError:
        remove(tree, root)
        raise
    return tree


def remove(tree: Path, root: Path) -> None:
    """Remove the worktree ``tree``, its folder and git's record of it, whatever its state (a
    folder git does not know as a worktree goes too); never raises for a missing one."""
    subprocess.run(
        ["git", "worktree", "remove", "--force", str(tree)], cwd=root, capture_output=True
    )
    shutil.rmtree(tree, ignore_errors=True)
    subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)
