"""``optbench merge SRC...``: fold results trees from other runs into ``results/``.

A runner that starts from a clean copy of the repository (a lent GPU, a CI job) hands back its own
``results/`` tree, or a tar of it; several such runs of one commit each hold part of the suite.
Merging copies every file the destination lacks and, for the files that several runs share:

- optbench's records: every run is kept (``ResultStore.add_run``): a run the destination lacks is
  added as it is, two snapshots of one run are joined, and no stored record is replaced; a record
  that differs from the stored one of its run is kept as a run of its own. Old-layout files
  (``<machine>/optbench/<commit>.jsonl.gz``, or ``.jsonl``) are read as their runs and added the
  same way.
- asv's results (``asv/<machine>/<commit>-<env>.json``): merged benchmark by benchmark and parameter
  combination; a measured value replaces an unmeasured one (asv's null for a case skipped or not
  selected), and where two runs measured the same case, the later source wins: asv keeps one median
  per commit, and optbench's records keep every run's samples.

``asv/benchmarks.json`` (asv's list of benchmarks) is taken from the last source that has one. A
tree of the old layout, with asv's files beside optbench's (``<machine>/machine.json``,
``<machine>/<commit>-<env>.json``, ``benchmarks.json`` at its root), has them merged into asv's tree
(``asv/``) all the same.

A source that is neither an optbench or asv results tree (a file outside that layout, or none in
it) nor a tar of one is refused, as is a destination folder that cannot be written: one line on
stderr, exit 2, nothing merged from any source.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from optbench.store.store import (
    ASV_DIR,
    RECORDS_DIR,
    ResultStore,
    StoredRun,
    read_records,
    records_stem,
    require_writable,
    results_dir,
    write_atomic,
    write_json_atomic,
)

ASV_VALUE_COLUMNS = (
    "result",
    "stats_ci_99_a",
    "stats_ci_99_b",
    "stats_q_25",
    "stats_q_75",
    "stats_number",
    "stats_repeat",
    "samples",
    "profile",
)


def _unmeasured(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def merge_asv_results(dest: dict[str, Any], src: dict[str, Any]) -> dict[str, Any]:
    """asv results of one machine, commit and environment: ``src``'s measured values over
    ``dest``'s, parameter combination by combination on ``src``'s grid (a combination only
    ``dest`` has is dropped, as asv drops it); a benchmark whose version changed is ``src``'s
    alone."""
    columns = dest["result_columns"]
    if src["result_columns"] != columns:
        raise ValueError(f"asv result columns differ: {columns} vs {src['result_columns']}")
    merged = dict(
        dest,
        results=dict(dest["results"]),
        durations={**dest.get("durations", {}), **src.get("durations", {})},
    )
    for name, row in src["results"].items():
        old = merged["results"].get(name)
        if old is None:
            merged["results"][name] = row
            continue
        a, b = dict(zip(columns, old)), dict(zip(columns, row))
        if a.get("version") != b.get("version"):  # the benchmark changed: the newer stands alone
            merged["results"][name] = row
            continue
        combos = list(itertools.product(*b.get("params") or []))
        earlier = list(itertools.product(*a.get("params") or []))
        for column in ASV_VALUE_COLUMNS:
            # asv writes a column with nothing measured as null, and drops trailing nulls
            if b.get(column) is not None and not isinstance(b[column], list):
                continue
            new = b.get(column) or []
            kept = dict(zip(earlier, a[column])) if isinstance(a.get(column), list) else {}
            values = [
                kept.get(combo) if i >= len(new) or _unmeasured(new[i]) else new[i]
                for i, combo in enumerate(combos)
            ]
            b[column] = values if any(v is not None for v in values) else b.get(column)
        merged["results"][name] = [b.get(c) for c in columns][: max(len(old), len(row))]
    return merged


def _records_file(rel: Path) -> tuple[str, str, str | None] | None:
    """(machine, commit, run id or None for an old-layout file) of a records file's relative path,
    else None."""
    stem = records_stem(rel)
    if stem is None or len(rel.parts) < 3 or rel.parts[1] != RECORDS_DIR:
        return None
    if len(rel.parts) == 3:
        return rel.parts[0], stem, None
    return (rel.parts[0], rel.parts[2], stem) if len(rel.parts) == 4 else None


def _asv_file(rel: Path) -> Path | None:
    """Where an asv file of a results tree (path relative to its root) belongs in a results root,
    else None: asv's tree (``asv/``) as it is; asv's files of the old layout (the JSON files
    directly in a machine folder, ``benchmarks.json`` at the root) moved into it."""
    if rel.parts[0] == ASV_DIR:
        return rel
    if rel.suffix == ".json" and (len(rel.parts) == 2 or rel.parts == ("benchmarks.json",)):
        return Path(ASV_DIR, *rel.parts)
    return None


def merge_tree(src: Path, dest: Path) -> list[str]:
    """Merge the results root ``src`` into ``dest``; returns what changed (relative paths in
    ``dest``)."""
    changed = []
    store = ResultStore(dest)
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src)
        asv_file = _asv_file(rel)
        rel = asv_file or rel
        target = dest / rel
        if target.exists() and target.read_bytes() == path.read_bytes():
            continue
        where = _records_file(rel)
        if where is not None:
            machine, commit, run_id = where
            runs = (
                [StoredRun(machine, commit, run_id, read_records(path))]
                if run_id
                else ResultStore(src).runs(machine, commit)
            )
            # an old-layout file the destination lacks: as it is
            if run_id is None and not store.legacy_path(machine, commit).exists():
                write_atomic(target, path.read_bytes())
                changed.append(str(rel))
                continue
            known = {r.run_id: r.records for r in store.runs(machine, commit)}
            for run in runs:
                if known.get(run.run_id) != run.records:
                    changed += [
                        str(store.path(machine, commit, i).relative_to(dest))
                        for i in store.add_run(run)
                    ]
        elif asv_file and target.exists() and len(rel.parts) == 3 and rel.name != "machine.json":
            # asv's results of one commit and environment on one machine
            merged = merge_asv_results(json.loads(target.read_text()), json.loads(path.read_text()))
            write_json_atomic(target, merged)
            changed.append(str(rel))
        else:  # new here, or newer: the later source wins
            write_atomic(target, path.read_bytes())
            changed.append(str(rel))
    return changed


def _misplaced(rel: Path) -> bool:
    """Whether a file of a tree (path relative to its root) has no place in a results tree: at its
    root any file but asv's ``benchmarks.json`` of the old layout; directly in a machine folder any
    but asv's ``.json`` files of the old layout; in a machine's ``optbench/`` any but a records
    file at its place; in ``asv/`` any but ``benchmarks.json`` and a machine's ``.json`` files. A
    file in a machine's other folders (profiles, probes' outputs, ...) has its place."""
    if rel.parts[0] == ASV_DIR:
        return rel.parts[1:] != ("benchmarks.json",) and not (
            len(rel.parts) == 3 and rel.suffix == ".json"
        )
    if len(rel.parts) <= 2:
        return _asv_file(rel) is None
    return rel.parts[1] == RECORDS_DIR and _records_file(rel) is None


def tree_problem(root: Path) -> str | None:
    """Why the folder ``root`` is not an optbench or asv results tree (the layout of
    ``optbench.store.store``, asv's tree included, or the old one), in words; None where it is: it
    holds files, each at its place (:func:`_misplaced`), and asv's files are JSON objects, its
    results files with the columns a merge reads."""
    files = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    if not files:
        return "it holds no file"
    misplaced = [rel for rel in files if _misplaced(rel)]
    if misplaced:
        return (
            f"{len(misplaced)} of its {len(files)} files "
            f"{'lies' if len(misplaced) == 1 else 'lie'} outside its layout "
            f"(<machine>/{RECORDS_DIR}/<commit>/<run id>.jsonl.gz, {ASV_DIR}/<machine>/*.json, "
            f"<machine>/<folder>/...), e.g. {misplaced[0]}"
        )
    for rel in files:
        asv = _asv_file(rel)
        if asv is None:
            continue
        try:
            data = json.loads((root / rel).read_bytes())
        except (OSError, ValueError) as exc:
            return f"{rel} is not asv's: no JSON ({exc})"
        if not isinstance(data, dict):
            return f"{rel} is not asv's: no JSON object"
        results = len(asv.parts) == 3 and asv.name != "machine.json"
        lacks = sorted({"results", "result_columns"} - data.keys()) if results else []
        if lacks:
            return f"{rel} is not asv's results: no {' or '.join(lacks)}"
    return None


def folders_written(src: Path, dest: Path) -> set[Path]:
    """The folders of the results root ``dest`` that merging the results root ``src`` into it may
    write in: those of each file ``dest`` lacks as it is, and of a records file its run's."""
    folders = set()
    for path in (p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src)
        target = dest / (_asv_file(rel) or rel)
        if target.is_file() and target.read_bytes() == path.read_bytes():
            continue
        folders.add(target.parent)
        where = _records_file(rel)
        if where is not None:
            folders.add(dest / where[0] / RECORDS_DIR / where[1])
    return folders


def _results_root(path: Path, scratch: Path) -> Path:
    """A results root from a folder (the root itself, or a folder holding ``results/``) or a tar of
    one (unpacked into ``scratch``; ``tarfile.TarError`` or ``OSError`` where it is none)."""
    if path.is_file():
        with tarfile.open(path) as tar:
            tar.extractall(scratch, filter="data")
        path = scratch
    return path / "results" if (path / "results").is_dir() else path


def main(argv: list[str] | None = None) -> int:
    """``optbench merge SRC... [--into DEST]``: 0 once every source is merged; 2, with one line on
    stderr and nothing merged, where a source is not a results tree nor a tar of one
    (:func:`tree_problem`), or a folder of DEST cannot be written
    (``optbench.store.store.CannotWrite``, checked before anything is)."""
    p = argparse.ArgumentParser(
        prog="optbench merge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "sources", nargs="+", type=Path, help="results roots, or tars of them (e.g. results.tgz)"
    )
    p.add_argument(
        "--into",
        type=Path,
        default=None,
        help="destination root (default $OPTBENCH_RESULTS or results/)",
    )
    args = p.parse_args(argv)
    dest = args.into or results_dir()
    missing = [str(s) for s in args.sources if not s.exists()]
    if missing:
        p.error(f"no such results root or tar: {', '.join(missing)}")
    require_writable(dest)
    with tempfile.TemporaryDirectory() as scratch:
        roots = []
        for n, source in enumerate(args.sources):
            try:
                root = _results_root(source, Path(scratch, str(n)))
                problem = tree_problem(root)
            except tarfile.TarError as exc:
                problem = f"no folder, and no tar archive ({str(exc).splitlines()[0].rstrip(':')})"
            except OSError as exc:
                problem = f"it cannot be read ({exc})"
            if problem:
                print(
                    f"optbench merge: {source} is not an optbench or asv results tree, nor a "
                    f"tar of one: {problem}; nothing merged",
                    file=sys.stderr,
                )
                return 2
            roots.append(root)
        for folder in sorted({f for root in roots for f in folders_written(root, dest)}):
            require_writable(folder)
        for source, root in zip(args.sources, roots):
            changed = merge_tree(root, dest)
            print(f"optbench merge: {source}: {len(changed)} files merged into {dest}")
            for rel in changed:
                print(f"  {rel}")
            for folder in ignored_folders(dest, changed):
                print(
                    f"optbench merge: {folder} is ignored by git (a machine with no committed "
                    f"results): commit it on purpose with `git add -f {folder}`",
                    file=sys.stderr,
                )
    return 0


def ignored_folders(dest: Path, changed: list[str]) -> list[str]:
    """The machine folders of ``changed`` (paths relative to ``dest``) that git ignores in
    ``dest``'s repository, as git names them; none outside a repository."""
    import subprocess

    folders = sorted(
        {
            "/".join(Path(rel).parts[:2] if Path(rel).parts[0] == "asv" else Path(rel).parts[:1])
            for rel in changed
        }
    )
    if not folders:
        return []
    out = subprocess.run(
        ["git", "check-ignore", *[str(dest / f) for f in folders]],
        cwd=dest,
        capture_output=True,
        text=True,
    )
    return [
        str(Path(line).relative_to(dest.resolve().parent)) if Path(line).is_absolute() else line
        for line in out.stdout.split()
    ]
