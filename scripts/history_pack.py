"""The git history a copied work tree lacks, carried without the blobs the tree itself holds.

A lent GPU machine takes a copied work tree of at most 64 MiB, and its ``.git`` arrives without
commits. A bundle of every branch is most of that limit (29 MB on 2026-11-29, beside 35 MB of
tracked files), since it repeats every blob of the tree. ``pack`` writes ``.bundle/history.pack``:
every object reachable from a branch or HEAD but the blobs of HEAD's tree and those found only
under ``results/`` (2.6 MB, where the old results alone were 6.6 MB), and ``.bundle/refs``: HEAD's
commit and each branch. Nothing in a copy reads an old commit's results: optbench's worktrees check
out code alone (``optbench.run.worktree``). ``restore`` (in the copy, from its root) indexes
the pack, makes each blob of HEAD's tree that is missing from the files at their paths, checking
each id against the tree's, and moves each branch to the pack's where the branch is absent or an
ancestor of it (a checkout ahead of the pack keeps its own). Exit 2 where a file differs from
HEAD's tree (the copy is not of the commit the pack was made at).

    python3 scripts/history_pack.py pack|restore
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACK, REFS = Path(".bundle/history.pack"), Path(".bundle/refs")
BLOB_MODES = ("100644", "100755")  # a file's blob; a link's (120000) is its target, made apart
# Sparse-checkout patterns of the blobs the pack holds: every path but results/. A blob found at
# another path too is kept (git's sparse filter leaves out only what such a checkout never needs).
CODE_ONLY = "/*\n!/results/\n"


def git(*args: str, stdin: str | bytes | None = None) -> str:
    """git's standard output for ``args`` (an error ends the program with git's message)."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    done = subprocess.run(["git", *args], input=data, capture_output=True)
    if done.returncode:
        sys.exit(f"git {' '.join(args)}: {done.stderr.decode().strip()}")
    return done.stdout.decode()


def tree_blobs(commit: str) -> list[tuple[str, str, str]]:
    """(mode, blob id, path) of every blob of ``commit``'s tree."""
    entries = git("ls-tree", "-r", "-z", commit).split("\0")
    found = []
    for entry in filter(None, entries):
        meta, path = entry.split("\t", 1)
        mode, kind, oid = meta.split()
        if kind == "blob":
            found.append((mode, oid, path))
    return found


def pack() -> None:
    """Write PACK and REFS for HEAD and every branch."""
    head = git("rev-parse", "HEAD").strip()
    carried = {oid for _, oid, _ in tree_blobs(head)}
    code_only = git("hash-object", "-w", "--stdin", stdin=CODE_ONLY).strip()
    listed = git(
        "rev-list", "--objects", f"--filter=sparse:oid={code_only}", "--branches", "HEAD"
    ).splitlines()
    objects = [line.split()[0] for line in listed]
    wanted = "\n".join(dict.fromkeys(o for o in objects if o not in carried)) + "\n"
    PACK.parent.mkdir(exist_ok=True)
    packed = subprocess.run(
        ["git", "pack-objects", "--stdout", "-q"], input=wanted.encode(), capture_output=True
    )
    if packed.returncode:
        sys.exit(f"git pack-objects: {packed.stderr.decode().strip()}")
    PACK.write_bytes(packed.stdout)
    branches = git("for-each-ref", "--format=%(objectname) %(refname)", "refs/heads")
    REFS.write_text(f"{head} HEAD\n{branches}")
    print(f"{PACK}: {PACK.stat().st_size / 1e6:.1f} MB, {len(wanted.split())} objects; {REFS}")


def _missing(oids: list[str]) -> set[str]:
    """The objects of ``oids`` this repository lacks."""
    out = git("cat-file", "--batch-check", stdin="\n".join(oids) + "\n")
    return {line.split()[0] for line in out.splitlines() if line.endswith(" missing")}


def restore() -> None:
    """Index PACK, make HEAD's missing blobs from the work tree, move the branches (module doc)."""
    git("index-pack", "--stdin", stdin=PACK.read_bytes())
    refs = [line.split() for line in REFS.read_text().splitlines() if line.strip()]
    head = next(oid for oid, name in refs if name == "HEAD")
    blobs = tree_blobs(head)
    lacking = _missing([oid for _, oid, _ in blobs])
    files = [(oid, path) for mode, oid, path in blobs if oid in lacking and mode in BLOB_MODES]
    paths = "".join(f"{path}\n" for _, path in files)
    made = git("hash-object", "-w", "--no-filters", "--stdin-paths", stdin=paths).split()
    links = [(oid, path) for mode, oid, path in blobs if oid in lacking and mode not in BLOB_MODES]
    made += [  # a link's blob is its target ('' where the copy did not keep it a link)
        git("hash-object", "-w", "--stdin", stdin=str(Path(path).readlink())).strip()
        if Path(path).is_symlink()
        else ""
        for _, path in links
    ]
    for (oid, path), got in zip(files + links, made):
        if got != oid:
            print(f"{path} differs from {head[:12]}'s: not a copy of that commit", file=sys.stderr)
            sys.exit(2)
    before = _resolve("HEAD")
    for oid, name in refs:
        if name != "HEAD" and (not (old := _resolve(name)) or _is_ancestor(old, oid)):
            git("update-ref", name, oid)
    if _resolve("HEAD") != before:
        git("reset", "-q")  # the index := the new HEAD; the work tree stays as it came
        git("config", "core.fileMode", "false")  # a copy may not keep executable bits


def _resolve(name: str) -> str:
    """The object ``name`` names, '' where it names none (no such branch, no commit yet)."""
    done = subprocess.run(["git", "rev-parse", "-q", "--verify", name], capture_output=True)
    return done.stdout.decode().strip() if done.returncode == 0 else ""


def _is_ancestor(old: str, new: str) -> bool:
    return subprocess.run(["git", "merge-base", "--is-ancestor", old, new]).returncode == 0


def main(argv: list[str] | None = None) -> None:
    (command,) = argv if argv is not None else sys.argv[1:]
    {"pack": pack, "restore": restore}[command]()


if __name__ == "__main__":
    main()
