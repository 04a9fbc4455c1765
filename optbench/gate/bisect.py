"""``optbench bisect GOOD BAD [--select KEY]``: the first commit of GOOD..BAD that slowed the
selected cases down.

The cases are ``--select``'s (default: those ``optbench ab`` measures); a narrow selection (the one
case that slowed down) keeps each step short. A binary search over the commits after GOOD up to BAD
(oldest first, as ``git rev-list --reverse`` lists them), each step an ``optbench ab GOOD <commit>``
of the selected cases on this machine (:mod:`optbench.gate.ab`: interleaved rounds, every metric
against its threshold): a commit whose A/B finds a regression is bad, one whose A/B finds none is
good, and the search narrows to the first bad commit. BAD is taken as bad without an A/B of its own;
every step compares with GOOD, so that small steps of several commits cannot each hide under the
threshold. A commit that holds GOOD's code (results or docs alone) is good without being measured.

Exit codes: 0 the first bad commit is named, 2 nothing to search (an empty range, a ref git cannot
resolve, or a step with nothing to compare), 3 a step was inconclusive (its commit is named: run
again with a larger ``--time-budget``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from optbench.gate.ab import (
    EXIT_INCONCLUSIVE,
    EXIT_NOTHING,
    EXIT_OK,
    EXIT_REGRESSION,
    ab,
    add_options,
    options_of,
)
from optbench.store.store import REPO_ROOT


def commits_between(good: str, bad: str) -> list[str]:
    """The commits after ``good`` up to ``bad``, oldest first; ValueError where git cannot list
    them."""
    out = subprocess.run(
        ["git", "rev-list", "--reverse", f"{good}..{bad}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise ValueError(f"git cannot list {good}..{bad}: {out.stderr.strip()}")
    return out.stdout.split()


def first_bad(commits: list[str], is_bad) -> tuple[int, int | None]:
    """Binary search of ``commits`` (the last one bad) with ``is_bad(commit) -> bool | None`` (None:
    undecided). Returns (index of the first bad commit, None), or (index, index) of the commit whose
    step was undecided."""
    good, bad = -1, len(commits) - 1
    while bad - good > 1:
        mid = (good + bad) // 2
        verdict = is_bad(commits[mid])
        if verdict is None:
            return bad, mid
        good, bad = (good, mid) if verdict else (mid, bad)
    return bad, None


def _subject(commit: str) -> str:
    return subprocess.run(
        ["git", "log", "-1", "--format=%h %s", commit],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="optbench bisect",
        description=__doc__.split("\n\n")[0],
        epilog="Exit codes: 0 the first bad commit is named, 2 nothing to search, "
        "3 a step was inconclusive.",
    )
    p.add_argument("good", help="a commit-ish without the slowdown")
    p.add_argument("bad", help="a later commit-ish with it")
    add_options(p)
    args = p.parse_args(argv)
    options = options_of(p, args)
    try:
        commits = commits_between(args.good, args.bad)
    except ValueError as exc:
        print(f"optbench bisect: {exc}", file=sys.stderr)
        return EXIT_NOTHING
    if not commits:
        print(f"optbench bisect: no commit after {args.good} up to {args.bad}", file=sys.stderr)
        return EXIT_NOTHING
    failure: list[int] = []

    def is_bad(commit: str) -> bool | None:
        print(
            f"optbench bisect: {len(commits)} commits; A/B of {args.good} against "
            f"{_subject(commit)}",
            flush=True,
        )
        code = ab(args.good, commit, options)
        if code in (EXIT_OK, EXIT_REGRESSION):
            return code == EXIT_REGRESSION
        failure.append(code)
        return None

    index, undecided = first_bad(commits, is_bad)
    if undecided is not None:
        print(
            f"optbench bisect: the A/B of {_subject(commits[undecided])} was "
            f"{'inconclusive' if failure[-1] == EXIT_INCONCLUSIVE else 'not comparable'}: stopped",
            file=sys.stderr,
        )
        return failure[-1]
    print(f"optbench bisect: the first bad commit is {_subject(commits[index])}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
