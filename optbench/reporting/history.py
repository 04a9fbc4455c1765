"""``optbench history A..B``: benchmark every commit of a range, one git worktree per commit.

asv's own commit ranges need environments it builds itself; on an offline runner with an existing
environment each commit is checked out into a temporary worktree and that worktree's
``optbench run`` records it under its own hash. All worktrees share this checkout's ``results/``
and compile caches.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from optbench.run import worktree
from optbench.store.store import REPO_ROOT as ROOT


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def commits_in(rev_range: str) -> list[str]:
    """Commits of ``A..B`` oldest first (a single commit-ish means just that commit)."""
    if ".." not in rev_range:
        return [git("rev-parse", rev_range)]
    return git("rev-list", "--reverse", rev_range).split()


def run_commit(commit: str, run_args: list[str]) -> int:
    """Benchmarks ``commit`` from its own worktree; returns the exit code of its run."""
    tree = worktree.add(ROOT / ".cache" / "worktrees" / commit[:12], commit, ROOT)
    try:
        if not (tree / "optbench" / "cli.py").exists():
            print(f"history: {commit[:12]} predates `optbench run`; skipped", flush=True)
            return 0
        for shared in ("results", ".cache"):  # neither is in a fresh worktree of the code
            (tree / shared).symlink_to(ROOT / shared, target_is_directory=True)
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
        )
        cmd = [
            sys.executable,
            "-m",
            "optbench.cli",
            "run",
            "--commit",
            commit,
            "--no-html",
            *run_args,
        ]
        return subprocess.run(cmd, cwd=tree, env=env).returncode
    finally:
        worktree.remove(tree, ROOT)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="optbench history", description=__doc__.splitlines()[0])
    p.add_argument("range", help="A..B (commits after A up to B) or one commit")
    p.add_argument(
        "run_args",
        nargs=argparse.REMAINDER,
        help="passed to `optbench run` (e.g. --suite quick); --no-html: publish no HTML at the end",
    )
    args = p.parse_args(argv)
    try:
        commits = commits_in(args.range)
    except subprocess.CalledProcessError as exc:
        p.error(f"{args.range!r} is not a commit or range git knows: {exc.stderr.strip()}")
    codes = [run_commit(c, args.run_args) for c in commits]
    if "--no-html" not in args.run_args:
        from optbench.reporting.site import publish

        publish()
    return max(codes, default=0)
