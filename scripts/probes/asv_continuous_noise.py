"""How far apart does plain ``asv continuous`` read two commits of the same code on this CPU, and
does it report a planted 1.5x slowdown of the training step? In a new repository holding this
checkout's files (``tests/asv_repo.py``: the committed asv.conf.json, the CPU suite): a base
commit, a head that adds a comment (same code), and a head whose training step spends 1.5x its CPU
time (``TrainStep.__call__`` planted). ``asv continuous BASE HEAD --bench BENCH`` at asv's default
factor, ROUNDS times on the same-code pair, then PLANTED times on the planted one, one call at a
time. One JSON line per call: the pair, asv's exit code, seconds, the load average, and per
benchmark and parameter head / base of the values asv stored.

    python3 -m scripts.probes.asv_continuous_noise [ROUNDS] [PLANTED] [BENCH] > out.jsonl

Output of 2026-11-28 (the 2-core VM, other sessions' work on it):
results/cpu-amd-epyc/probes-2026-11-28/.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from tests.asv_repo import (
    MACHINE,
    asv,
    asv_env,
    copy_checkout,
    head,
    planted_commit,
    same_code_commit,
)


def stored(repo: Path, commit: str) -> dict[str, float]:
    """asv's stored values of ``commit``, by ``benchmark(params)``."""
    (path,) = (repo / "results" / "asv" / MACHINE).glob(f"{commit[:8]}-*.json")
    data = json.loads(path.read_text())
    columns = data["result_columns"]
    values = {}
    for name, row in data["results"].items():
        entry = dict(zip(columns, row))
        for combo, value in zip(itertools.product(*entry["params"]), entry["result"] or []):
            values[f"{name}({', '.join(combo)})"] = value
    return values


def ratios(repo: Path, base: str, head: str) -> dict[str, float]:
    """head / base of every value both commits have (not NaN, not zero)."""
    before, after = stored(repo, base), stored(repo, head)
    return {
        key: round(after[key] / value, 4)
        for key, value in before.items()
        if value and value == value and after.get(key) is not None and after[key] == after[key]
    }


def main(rounds: int, planted: int, bench: str) -> None:
    repo = copy_checkout(Path(tempfile.mkdtemp()) / "repo")
    env = asv_env(repo.parent / "home", OPTBENCH_SUITE="cpu")
    base = head(repo)
    same = same_code_commit(repo, "head")
    slow = planted_commit(repo, "models/step.py", "TrainStep.__call__", 1.5)
    for pair, (a, b), n in (("same", (base, same), rounds), ("planted", (same, slow), planted)):
        for i in range(n):
            start = time.monotonic()
            done = asv(repo, env, "continuous", "--machine", MACHINE, "--bench", bench, a, b)
            line = {
                "pair": pair,
                "call": i + 1,
                "exit": done.returncode,
                "seconds": round(time.monotonic() - start, 1),
                "load": os.getloadavg()[0],
                "ratios": ratios(repo, a, b),
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 8,
        int(sys.argv[2]) if len(sys.argv) > 2 else 4,
        sys.argv[3] if len(sys.argv) > 3 else r"StepTiny.track_(step|forward)_ms",
    )
