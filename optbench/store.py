"""The result store: one JSON-lines file of measurement records per machine and commit.

Layout (beside asv's own files, which asv writes into the same machine folders)::

    results/<machine>/machine.json                   asv's machine file
    results/<machine>/<commit[:8]>-<env>.json        asv's results (medians, for asv's HTML and history)
    results/<machine>/optbench/<commit>.jsonl        optbench's records: every sample, spread, checks,
                                                     errors and the full machine info (this module)

A record is a JSON object with a unique ``key`` (``"<benchmark>|<param>=<value>|..."``); the
record with key ``"__machine__"`` holds the machine info of that run. Files are rewritten
atomically (temporary file + ``os.replace``), so a run that dies leaves every file whole.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

MACHINE_KEY = "__machine__"
RECORDS_DIR = "optbench"


def results_dir() -> Path:
    """Root of the results tree: ``$OPTBENCH_RESULTS`` or ``results/`` at the repository root."""
    env = os.environ.get("OPTBENCH_RESULTS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "results"


def record_key(benchmark: str, params: Mapping[str, Any]) -> str:
    """Stable key of one benchmark and parameter combination."""
    return "|".join([benchmark, *(f"{k}={v}" for k, v in params.items())])


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the file it replaces was an ordinary one
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """Atomic JSON write (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


class ResultStore:
    """Reads and writes optbench records under a results root."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else results_dir()

    def path(self, machine: str, commit: str) -> Path:
        return self.root / machine / RECORDS_DIR / f"{commit}.jsonl"

    def machines(self) -> list[str]:
        """Machine folders that hold optbench records."""
        return sorted(p.parent.name for p in self.root.glob(f"*/{RECORDS_DIR}") if p.is_dir())

    def commits(self, machine: str) -> list[str]:
        """Commits with records on ``machine``, oldest file first."""
        files = sorted((self.root / machine / RECORDS_DIR).glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
        return [p.stem for p in files]

    def resolve(self, machine: str, commit: str) -> str:
        """Full stored hash for a commit prefix on ``machine`` (KeyError if none or ambiguous)."""
        found = [c for c in self.commits(machine) if c.startswith(commit)]
        if len(found) != 1:
            raise KeyError(f"{commit!r} matches {len(found)} stored commits on {machine}")
        return found[0]

    def load(self, machine: str, commit: str) -> dict[str, dict]:
        """All records of one machine and commit, by key ({} if none)."""
        path = self.path(machine, commit)
        if not path.exists():
            return {}
        records = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                records[rec["key"]] = rec
        return records

    def save(self, machine: str, commit: str, records: Iterable[Mapping[str, Any]]) -> None:
        """Merge ``records`` into the file of (machine, commit), replacing records with the same key."""
        merged = self.load(machine, commit)
        for rec in records:
            merged[rec["key"]] = dict(rec)
        self._write(machine, commit, merged)

    def drop(self, machine: str, commit: str, keys: Iterable[str]) -> None:
        """Remove the records with ``keys`` from the file of (machine, commit); keys not there are ignored."""
        records, dropped = self.load(machine, commit), set(keys)
        kept = {key: rec for key, rec in records.items() if key not in dropped}
        if len(kept) < len(records):
            self._write(machine, commit, kept)

    def _write(self, machine: str, commit: str, records: dict[str, dict]) -> None:
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records.values())
        write_text_atomic(self.path(machine, commit), text)
