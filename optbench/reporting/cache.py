"""The report's cache: what a publish computed or drew, kept by a hash of its inputs, so that the
next publish redoes only what changed.

An entry is bytes under a key, the SHA-256 of what made it: the entry's name, its inputs (pickled;
equal inputs give the same bytes within one Python version) and :func:`code_digest` (the source of
optbench and models, the versions of the libraries that draw and detect, matplotlib's settings), so
a change to any of them is a miss, never a stale figure. Inputs that pickle to other bytes are only
a miss: an entry is never reused for inputs it was not made from.

Entries live in one folder (``<html>/.cache/report/``, gitignored with ``html/``), a file per entry,
written atomically; :meth:`ReportCache.prune` keeps only those the last publish used, so the folder
holds one site's worth. Two publishes at once may remove each other's entries: a missing entry is a
miss.
"""

from __future__ import annotations

import hashlib
import pickle
import platform
from collections.abc import Callable
from functools import cache
from importlib.metadata import version
from pathlib import Path

from optbench.store.store import REPO_ROOT, write_atomic

# The packages whose code makes a figure: the report's, and the libraries that draw or detect.
SOURCES = ("optbench", "models")
LIBRARIES = ("matplotlib", "numpy", "scipy", "asv")


@cache
def code_digest() -> str:
    """SHA-256 of the code that makes a report: every ``.py`` file of :data:`SOURCES`, the versions
    of :data:`LIBRARIES` and Python, and matplotlib's settings (fonts, sizes; not the interactive
    backend, whose lookup imports pyplot, nor its fallback, which ``matplotlib.use`` switches off:
    the figures are drawn by Agg whatever they are)."""
    from matplotlib import rcParams

    h = hashlib.sha256()
    for package in SOURCES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            h.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes())
    h.update(repr([(name, version(name)) for name in LIBRARIES]).encode())
    h.update(platform.python_version().encode())
    settings = sorted(
        (k, rcParams[k]) for k in rcParams if k not in ("backend", "backend_fallback")
    )
    h.update(repr(settings).encode())
    return h.hexdigest()


def files_digest(folder: Path) -> str:
    """SHA-256 of every file under ``folder``, by path relative to it and content ('' where there is
    no such folder)."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


class ReportCache:
    """Entries of one folder (None: no cache; every entry is made), and the keys this publish used
    (looked up or stored)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.used: set[str] = set()
        self.made = 0  # entries made here: misses

    @staticmethod
    def key(name: str, inputs: object) -> str:
        """The key of the entry ``name`` made from ``inputs`` by this code (:func:`code_digest`)."""
        data = pickle.dumps((code_digest(), name, inputs), protocol=5)
        return hashlib.sha256(data).hexdigest()

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / key

    def get(self, key: str) -> bytes | None:
        """The entry ``key``; None where there is none."""
        if self.folder is None:
            return None
        try:
            data = self._path(key).read_bytes()
        except OSError:
            return None
        self.used.add(key)
        return data

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` as the entry ``key``."""
        self.used.add(key)
        if self.folder is not None:
            write_atomic(self._path(key), data)

    def make(self, key: str, make: Callable[[], bytes]) -> bytes:
        """The entry ``key``: the stored one, else ``make()``'s, stored."""
        data = self.get(key)
        if data is None:
            data = make()
            self.made += 1
            self.put(key, data)
        return data

    def prune(self) -> None:
        """Remove every entry this publish did not use."""
        if self.folder is None:
            return
        for path in self.folder.glob("*/*"):
            if len(path.name) == 64 and path.name not in self.used:  # not another's temporary file
                path.unlink(missing_ok=True)
