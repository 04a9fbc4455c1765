"""Runs asv's command line with an atomic JSON writer.

asv writes its results files in place (open, dump), so a run killed mid-write would leave a
half-written file; this entry point swaps asv's writer for one that writes a temporary file and
renames it. Use it as ``python -m optbench.core.asv_atomic <asv arguments>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from optbench.core.store import write_text_atomic


def _write_json(path, data, api_version=None, compact=False) -> None:
    if api_version is not None:
        data = dict(data, version=api_version)
    text = json.dumps(data) if compact else json.dumps(data, indent=4, sort_keys=True)
    write_text_atomic(Path(path).absolute(), text)


def asv(args: list[str], env: dict[str, str] | None = None) -> int:
    """Runs asv (through this module, so its JSON writer is atomic) in the repository root; its exit code."""
    import subprocess

    from optbench.core.store import REPO_ROOT

    return subprocess.run([sys.executable, "-m", "optbench.core.asv_atomic", *args], cwd=REPO_ROOT,
                          env=env).returncode


def main(argv: list[str] | None = None) -> int:
    import asv.util
    from asv.main import main as asv_main

    asv.util.write_json = _write_json
    sys.argv = ["asv", *(sys.argv[1:] if argv is None else argv)]
    return asv_main() or 0


if __name__ == "__main__":
    sys.exit(main())
