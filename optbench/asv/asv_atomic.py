"""Runs asv's command line with an atomic JSON writer.

asv writes its results files in place (open, dump), so a run killed mid-write would leave a
half-written file; this entry point swaps asv's writer for one that writes a temporary file and
renames it. A results file (one commit and environment) is written over the one on disk under a
lock on its folder, merged case by case (``optbench.store.merge.merge_asv_results``: what this run
measured wins, its nulls keep what is there; a combination the run left out is null, never a value
asv loaded before the run: :func:`_measured_only`), so that runs of one commit at once
(``optbench run --gpus``: one shard per GPU) each keep the cases the others wrote since asv read
the file. Use it as ``python -m optbench.asv.asv_atomic <asv arguments>``.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optbench.store.store import write_text_atomic


def _write_json(path, data, api_version=None, compact=False) -> None:
    if api_version is not None:
        data = dict(data, version=api_version)
    path = Path(path).absolute()
    if "result_columns" not in data:
        write_text_atomic(path, _text(data, compact))
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        write_text_atomic(path, _text(_over_disk(path, data), compact))
    finally:
        os.close(folder)  # and the lock with it


def _text(data: Any, compact: bool) -> str:
    return json.dumps(data) if compact else json.dumps(data, indent=4, sort_keys=True)


def _over_disk(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """asv's results ``data`` merged over the file at ``path`` (``data`` as it is where that file
    is missing, not JSON or of other columns)."""
    from optbench.store.merge import merge_asv_results

    try:
        merged = merge_asv_results(json.loads(path.read_text()), data)
    except (OSError, ValueError, KeyError):
        return data
    return {**data, "results": merged["results"], "durations": merged["durations"]}


def asv(args: list[str], env: dict[str, str] | None = None, echo: bool = True) -> int:
    """Runs asv (through this module, so its JSON writer is atomic) in the repository root; its exit
    code. Without ``echo``, asv's output is held back and written to stderr only where it fails."""
    import subprocess

    from optbench.store.store import REPO_ROOT

    done = subprocess.run(
        [sys.executable, "-m", "optbench.asv.asv_atomic", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=not echo,
        text=True,
    )
    if not echo and done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
    return done.returncode


def _measured_only(add_result: Callable[..., Any]) -> Callable[..., Any]:
    """asv's ``Results.add_result`` without ``selected_idx``: a combination the run's ``--bench``
    regex leaves out (``optbench.suite.catalog.asv_pattern`` names the measured ones) goes in as
    null, not as the value asv loaded from the file before the run. The file on disk keeps its own
    values under nulls (:func:`_over_disk`), so a non-null value is one this run measured: a shard
    of ``--gpus`` cannot write back, over another's fresh value, what it loaded before that."""

    def add(self: Any, benchmark: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("selected_idx", None)
        return add_result(self, benchmark, result, *args, **kwargs)

    return add


def main(argv: list[str] | None = None) -> int:
    import asv.results
    import asv.util
    from asv.main import main as asv_main

    asv.util.write_json = _write_json
    asv.results.Results.add_result = _measured_only(asv.results.Results.add_result)
    sys.argv = ["asv", *(sys.argv[1:] if argv is None else argv)]
    return asv_main() or 0


if __name__ == "__main__":
    sys.exit(main())
