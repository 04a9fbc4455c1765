"""The result store: optbench's measurement records, one JSON-lines file per run, never replaced.

Records files are gzip-compressed JSON lines (``.jsonl.gz``: a third of a plain file's size, and
the records are most of what a copied work tree carries); a plain ``.jsonl`` file of a store
written before reads the same and is rewritten in its own form.

Layout (asv's files in a tree of their own, :func:`asv_results_dir`, which holds only what asv can
load: asv reads every folder of its results_dir that holds a .json file as a machine's)::

    results/asv/<machine>/machine.json                    asv's machine file
    results/asv/<machine>/<commit[:8]>-<env>.json         asv's results (medians, for asv's HTML
                                                          and history)
    results/asv/benchmarks.json                           asv's list of benchmarks
    results/<machine>/optbench/<commit>/<run id>.jsonl.gz optbench's records of one run: every
                                                          sample, spread, check, error and the
                                                          full machine info (this module)
    results/<machine>/optbench/<commit>.jsonl.gz          records of runs stored before run ids
                                                          (read-only)
    results/<machine>/<other>/                            profiles, anchors, pytest-benchmark
                                                          runs, probe outputs

A run is one ``optbench run`` (or one process where nothing set a run id): its records go to its own
file, so a rerun, a merge or an interrupt of a later run never changes an earlier run's records;
runs of one commit add up. Inside its own file a run replaces its records by ``key``
(``"<benchmark>|<param>=<value>|..."``: the placeholder a case leaves while it runs becomes its
record); the record with key ``"__machine__"`` holds the machine info of that run. A run that an
interrupt (SIGINT, SIGTERM) stopped is *partial*: the case it stopped has status ``interrupted`` and
the record ``"__run__"`` says ``"partial": true`` with the reason
(:meth:`ResultStore.mark_partial`); the cases it never reached have no record. Files are rewritten
atomically (temporary file + ``os.replace``), so a run that dies leaves every file whole. A file of
the old layout holds the runs of one commit merged by key; its records are read back as one run per
process (records that share their ``date``).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import re
import sys
import tempfile
import uuid
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any

from optbench.store.records import INTERRUPTED, ab_design

# the work tree: results/, benchmarks/, asv.conf.json
REPO_ROOT = Path(__file__).resolve().parents[2]
MACHINE_KEY = "__machine__"
RUN_KEY = "__run__"  # a run as a whole: ``partial`` (and why) once an interrupt stopped it
RECORDS_DIR = "optbench"
ASV_DIR = "asv"  # asv's tree in the results root (asv.conf.json "results_dir": "results/asv")
# run ids of the records of an old-layout file: "legacy-<date, digits and T>"
LEGACY_RUN = "legacy-"
# What a kernel record's ``device`` clock measures (``info.device_clock``): graph replays over input
# sets rotated through more than the L2. Kernel records without it hold warm-L2 replays of one set
# there.
DEVICE_CLOCK = "cold-l2"
# A records file's name: its run id (or, in the old layout, its commit) and one of these, the
# first for what is written now
RECORDS_SUFFIXES = (".jsonl.gz", ".jsonl")
# What a case's record says while the case runs; a later write of the same run replaces it
# (runner.run_grid).
IN_PROGRESS = "the process died while measuring this case"


def results_dir() -> Path:
    """Root of the results tree: ``$OPTBENCH_RESULTS`` or ``results/`` at the repository root."""
    from optbench.store.settings import current

    return current().results or REPO_ROOT / "results"


class CannotWrite(OSError):
    """A path optbench cannot write (a read-only folder, a file where a folder goes, a full disk):
    its message, one line, names the path and why. ``optbench`` prints it as ``optbench: cannot
    write <path> (<why>)`` and exits 2 (:func:`optbench.cli.main`)."""

    def __init__(self, path: Path, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), str(path))

    def __str__(self) -> str:
        return f"cannot write {self.filename} ({self.strerror})"


def require_writable(folder: Path) -> None:
    """Check, leaving nothing behind, that files can be written in ``folder`` (made with its parents
    by whoever writes there, where missing): the nearest part of it that exists must be a folder
    that takes a file. :class:`CannotWrite` naming ``folder`` where not."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    try:
        if not existing.is_dir():
            where = "" if existing == folder else f"{existing} is "
            raise NotADirectoryError(errno.ENOTDIR, f"{where}not a folder")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise CannotWrite(folder, exc) from exc


def asv_results_dir(root: Path | str | None = None) -> Path:
    """asv's own tree inside the results root ``root`` (machine files, results,
    ``benchmarks.json``). By default the repository's, which asv.conf.json's ``results_dir`` names:
    asv writes there whatever the settings say."""
    return (Path(root) if root is not None else REPO_ROOT / "results") / ASV_DIR


def record_key(benchmark: str, params: Mapping[str, Any]) -> str:
    """Stable key of one benchmark and parameter combination."""
    return "|".join([benchmark, *(f"{k}={v}" for k, v in params.items())])


def split_key(key: str) -> tuple[str, dict[str, str]]:
    """The benchmark and parameters of a :func:`record_key`, the parameters in the key's order."""
    benchmark, *parts = key.split("|")
    return benchmark, dict(part.split("=", 1) for part in parts)


def new_run_id() -> str:
    """A fresh run id: UTC start time (sortable) and a random suffix, e.g.
    ``20261124T190512Z-3fa1c2``."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"


@cache
def _process_run_id() -> str:
    return new_run_id()


def current_run_id() -> str:
    """The run this process belongs to: ``$OPTBENCH_RUN_ID`` (one ``optbench run``), else one per
    process."""
    from optbench.store.settings import current

    return current().run_id or _process_run_id()


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a part;
    :class:`CannotWrite` where it cannot (the file as it was)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        umask = os.umask(0)
        os.umask(umask)
        try:
            # mkstemp makes 0600; the file it replaces was an ordinary one
            os.chmod(tmp, 0o666 & ~umask)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise CannotWrite(path, exc) from exc


def write_text_atomic(path: Path, text: str) -> None:
    """Atomic write of ``text`` in UTF-8 (see :func:`write_atomic`)."""
    write_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Atomic JSON write (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def records_stem(path: Path) -> str | None:
    """The run id (or old-layout commit) a records file's name holds; None for any other file."""
    return next((path.name[: -len(x)] for x in RECORDS_SUFFIXES if path.name.endswith(x)), None)


def records_files(folder: Path) -> list[Path]:
    """The records files directly in ``folder``."""
    return sorted(p for p in folder.glob("*.jsonl*") if p.is_file() and records_stem(p))


def _records_file_text(path: Path) -> str:
    """The JSON-lines text of a records file, compressed or plain. Of a compressed file cut short
    or damaged, what it holds up to there, with a warning on stderr naming it; every gzip member
    of one with several."""
    data = path.read_bytes()
    if not path.name.endswith(".gz"):
        return data.decode("utf-8", errors="replace")
    out, rest = bytearray(), data
    while rest:  # a gzip member at a time
        unpack, used = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS), 0
        try:  # in pieces, so that what comes before a damaged byte is kept
            while used < len(rest) and not unpack.eof:
                out += unpack.decompress(rest[used : used + (1 << 16)])
                used += 1 << 16
        except zlib.error as exc:
            print(f"optbench: {path} is damaged ({exc}); reading what precedes", file=sys.stderr)
            break
        if not unpack.eof:
            print(f"optbench: {path} is cut short; reading what it holds", file=sys.stderr)
            break
        rest = unpack.unused_data + rest[used:]
    return out.decode("utf-8", errors="replace")


def read_records(path: Path) -> dict[str, dict]:
    """Records of one records file (JSON lines, gzip-compressed or plain) by key (a later line of
    a key wins). A line that is not a record (a file cut short by a full disk or a copy) is skipped
    with a warning on stderr naming the file and line, as asv skips a results file it cannot
    load."""
    records = {}
    for number, line in enumerate(_records_file_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            records[rec["key"]] = rec
        except (ValueError, KeyError, TypeError) as exc:
            print(
                f"optbench: skipping line {number} of {path}: not a record ({type(exc).__name__}: "
                f"{exc})",
                file=sys.stderr,
            )
    return records


def write_records_file(path: Path, text: str) -> None:
    """Write a records file's JSON-lines ``text`` atomically in the form its name says:
    gzip-compressed (with no time stamp: the same records give the same bytes) or plain."""
    data = text.encode("utf-8")
    write_atomic(path, gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)


def records_text(records: Iterable[Mapping[str, Any]]) -> str:
    """The JSON-lines text of ``records`` (sorted keys: the same records give the same text)."""
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)


@dataclass(frozen=True)
class StoredRun:
    """The records of one run of one commit on one machine."""

    machine: str
    commit: str
    run_id: str
    records: dict[str, dict]

    @property
    def info(self) -> dict[str, Any]:
        """Machine info of the run (``__machine__`` record); {} if none."""
        return self.records.get(MACHINE_KEY, {}).get("info", {})

    @property
    def date(self) -> str:
        """When the run started (ISO 8601, UTC): its earliest record date (the machine record's if
        it has no other)."""
        dates = [r.get("date") or "" for k, r in self.records.items() if k != MACHINE_KEY]
        return min(dates, default=self.records.get(MACHINE_KEY, {}).get("date") or "")

    def results(self) -> dict[str, dict]:
        """The benchmark records (without special records such as ``__machine__``)."""
        return {k: r for k, r in self.records.items() if not k.startswith("__")}


class ResultStore:
    """Reads and writes optbench records under a results root."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else results_dir()
        # read once per store; a write here clears it
        self._runs: dict[tuple[str, str], list[StoredRun]] = {}

    def _dir(self, machine: str) -> Path:
        return self.root / machine / RECORDS_DIR

    def path(self, machine: str, commit: str, run_id: str | None = None) -> Path:
        """File of one run (default: this process's run): the stored one, else where a new one
        goes (compressed)."""
        return _stored_or_new(self._dir(machine) / commit, run_id or current_run_id())

    def legacy_path(self, machine: str, commit: str) -> Path:
        """The old layout's file of one commit (whether or not there is one)."""
        return _stored_or_new(self._dir(machine), commit)

    def machines(self) -> list[str]:
        """Machine folders that hold optbench records."""
        return sorted(p.parent.name for p in self.root.glob(f"*/{RECORDS_DIR}") if p.is_dir())

    def commits(self, machine: str) -> list[str]:
        """Commits with records on ``machine``, by the date of their first run."""
        found = {records_stem(p) for p in records_files(self._dir(machine))}
        found |= {p.name for p in self._dir(machine).glob("*/") if records_files(p)}
        first = {c: min((r.date for r in self.runs(machine, c)), default="") for c in found}
        return sorted(found, key=lambda c: (first[c], c))

    def resolve(self, machine: str, commit: str) -> str:
        """Full stored hash for a commit prefix on ``machine`` (KeyError if none or ambiguous)."""
        found = [c for c in self.commits(machine) if c.startswith(commit)]
        if len(found) != 1:
            raise KeyError(f"{commit!r} matches {len(found)} stored commits on {machine}")
        return found[0]

    def runs(self, machine: str, commit: str) -> list[StoredRun]:
        """Every run of ``commit`` on ``machine`` that holds a record, oldest first (read once per
        store object)."""
        if (machine, commit) not in self._runs:
            self._runs[(machine, commit)] = self._read_runs(machine, commit)
        return self._runs[(machine, commit)]

    def machine_runs(self, machine: str) -> list[StoredRun]:
        """Every stored run of ``machine``, commit by commit (:meth:`commits`' order), each
        commit's oldest first."""
        return [run for commit in self.commits(machine) for run in self.runs(machine, commit)]

    def _read_runs(self, machine: str, commit: str) -> list[StoredRun]:
        found = [
            StoredRun(machine, commit, records_stem(p), records)
            for p in records_files(self._dir(machine) / commit)
            if (records := read_records(p))
        ]
        legacy = self.legacy_path(machine, commit)
        if legacy.exists():
            found += _split_legacy(machine, commit, read_records(legacy))
        return sorted(found, key=lambda r: (r.date, r.run_id))

    def load(self, machine: str, commit: str) -> dict[str, dict]:
        """The latest record of each key over the runs of (machine, commit) ({} if none): one record
        per case for readers that show one figure (an interrupted record only where no run gave the
        case a verdict; none that ``optbench ab`` measured in a design of its own,
        :func:`optbench.store.records.ab_design`); :meth:`runs` gives every run."""
        merged: dict[str, dict] = {}
        for run in self.runs(machine, commit):
            merged.update(
                {
                    key: rec
                    for key, rec in run.records.items()
                    if (rec.get("status") != INTERRUPTED or key not in merged)
                    and not ab_design(rec)
                }
            )
        return merged

    def measured_keys(self, machine: str, commit: str) -> set[str]:
        """Keys of the cases that a stored run of ``commit`` on ``machine`` ended with a verdict
        (any status but 'crashed', the mark of a process that died inside a case, and
        'interrupted'): what ``optbench run --skip-existing`` leaves out. ``commit`` is a full hash;
        none stored gives the empty set."""
        if commit not in self.commits(machine):
            return set()
        return {
            key
            for run in self.runs(machine, commit)
            for key, rec in run.results().items()
            if rec.get("status") not in (None, "crashed", INTERRUPTED)
        }

    def save(
        self,
        machine: str,
        commit: str,
        records: Iterable[Mapping[str, Any]],
        run_id: str | None = None,
    ) -> None:
        """Add ``records`` to one run's file (default: this process's run), replacing that run's
        records with the same key. Other runs' files are never touched."""
        path = self.path(machine, commit, run_id)
        merged = read_records(path) if path.exists() else {}
        for rec in records:
            merged[rec["key"]] = dict(rec)
        self._write(path, records_text(merged.values()))

    def drop(
        self, machine: str, commit: str, keys: Iterable[str], run_id: str | None = None
    ) -> None:
        """Remove the records with ``keys`` from one run's file (default: this process's run)."""
        path = self.path(machine, commit, run_id)
        if not path.exists():
            return
        records, dropped = read_records(path), set(keys)
        kept = [rec for key, rec in records.items() if key not in dropped]
        if len(kept) < len(records):
            self._write(path, records_text(kept))

    def mark_partial(
        self,
        machine: str,
        commit: str,
        reason: str,
        stopped: Iterable[str] = (),
        run_id: str | None = None,
    ) -> list[str]:
        """Record that an interrupt (``reason``: which, and where) stopped one run (default: this
        process's): its ``__run__`` record says ``partial``, and each case of ``stopped`` whose
        record is still the in-progress placeholder (its process was ended before it could say so
        itself) becomes ``interrupted``. A run without a file gets none. Returns the keys it marked
        interrupted."""
        path = self.path(machine, commit, run_id)
        if not path.exists():
            return []
        records = read_records(path)
        marked = [key for key in stopped if key in records and _in_progress(records[key])]
        for key in marked:
            records[key] = {
                **records[key],
                "status": INTERRUPTED,
                "reason": f"{reason}; not measured",
            }
        started = min((r["date"] for r in records.values() if r.get("date")), default=None)
        # dated as the run's first record: StoredRun.date is the earliest
        run = records.get(RUN_KEY, {"key": RUN_KEY, "date": started})
        records[RUN_KEY] = {**run, "partial": True, "reason": run.get("reason") or reason}
        self._write(path, records_text(records.values()))
        return marked

    def _write(self, path: Path, text: str) -> None:
        self._runs.clear()
        write_records_file(path, text)

    def add_run(self, run: StoredRun) -> list[str]:
        """Store a run from elsewhere (``optbench merge``) without changing any stored record;
        returns the run ids whose files it wrote (none when every record was here already).

        A new run id is copied as it is. Where the run id is here already (two snapshots of one
        run), records of new keys join it and an in-progress placeholder gives way to the finished
        record (an older snapshot's placeholder is not stored beside a finished record); any other
        record that differs (or any record of a run read from an old-layout file, which is never
        rewritten) is stored as a run of its own, ``<run id>~<hash of its records>``."""
        known = next(
            (r for r in self.runs(run.machine, run.commit) if r.run_id == run.run_id), None
        )
        joinable = not run.run_id.startswith(LEGACY_RUN)
        if known is None and joinable:
            self._write(
                self.path(run.machine, run.commit, run.run_id), records_text(run.records.values())
            )
            return [run.run_id]
        have = known.records if known is not None else {}
        joined, apart = dict(have), {}
        for key, rec in run.records.items():
            old = have.get(key)
            # an older snapshot's placeholder
            if old == rec or (old is not None and _in_progress(rec)):
                continue
            if joinable and (old is None or _in_progress(old)):
                joined[key] = rec
            else:
                apart[key] = rec
        stored = []
        if joined != have:
            self._write(
                self.path(run.machine, run.commit, run.run_id), records_text(joined.values())
            )
            stored.append(run.run_id)
        if set(apart) - {MACHINE_KEY}:
            if MACHINE_KEY in run.records:
                apart[MACHINE_KEY] = run.records[MACHINE_KEY]
            text = records_text(apart.values())
            apart_id = f"{run.run_id}~{hashlib.sha256(text.encode()).hexdigest()[:8]}"
            target = self.path(run.machine, run.commit, apart_id)
            if not target.exists():
                self._write(target, text)
                stored.append(apart_id)
        return stored


def _stored_or_new(folder: Path, stem: str) -> Path:
    """The records file ``stem`` in ``folder`` in whichever form is stored, else the form written
    now."""
    paths = [folder / f"{stem}{suffix}" for suffix in RECORDS_SUFFIXES]
    return next((p for p in paths if p.exists()), paths[0])


def _in_progress(rec: Mapping[str, Any]) -> bool:
    """Whether ``rec`` is the placeholder a case leaves in its run's file while it is measured."""
    return rec.get("status") == "crashed" and IN_PROGRESS in str(rec.get("reason", ""))


def _split_legacy(machine: str, commit: str, records: dict[str, dict]) -> list[StoredRun]:
    """An old-layout file as runs: one per process (records sharing a ``date``), each with the
    file's machine record."""
    machine_rec = records.get(MACHINE_KEY)
    groups: dict[str, dict[str, dict]] = {}
    for key, rec in records.items():
        if key != MACHINE_KEY:
            groups.setdefault(rec.get("date") or "", {})[key] = rec
    if not groups and machine_rec is not None:
        groups[machine_rec.get("date") or ""] = {}
    runs = []
    for date, recs in groups.items():
        if machine_rec is not None:
            recs = {MACHINE_KEY: machine_rec, **recs}
        runs.append(
            StoredRun(machine, commit, LEGACY_RUN + re.sub(r"[^0-9T]", "", date[:19]), recs)
        )
    return runs
