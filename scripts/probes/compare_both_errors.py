"""The stored-history compare's two errors on data it was not tuned on (no GPU): every pair of runs
of one commit on two GPUs (must exit 0: the same code), a commit that changes only docs against its
parent (same code, exit 0), and an identical copy of a run against the run (no alarm).

    python3 -m scripts.probes.compare_both_errors [DOCS_COMMIT]
"""

from __future__ import annotations

import contextlib
import io
import itertools
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from optbench.gate import compare as cmp
from optbench.store.store import REPO_ROOT, ResultStore


def quiet(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cmp.main(argv)
    return code, out.getvalue()


def main(docs_commit: str) -> int:
    store = ResultStore(REPO_ROOT / "results")
    codes: Counter[int] = Counter()
    for machine in store.machines():
        for commit in store.commits(machine):
            first = {}
            for run in store.runs(machine, commit):
                first.setdefault(cmp.gpu_of(run), run)
            first.pop(None, None)
            for (_, a), (_, b) in itertools.combinations(sorted(first.items()), 2):
                code, _ = quiet(
                    [
                        commit,
                        commit,
                        "--machine",
                        machine,
                        "--base-run",
                        a.run_id,
                        "--head-run",
                        b.run_id,
                    ]
                )
                codes[code] += 1
    print(f"same-code pairs across GPUs: exit codes {dict(codes)}")
    code, out = quiet([docs_commit, f"{docs_commit}~1"])
    print(f"{docs_commit} against its parent: exit {code}: {out.strip()[:100]}")
    commit = max(store.commits("h100-sxm"), key=lambda c: len(store.runs("h100-sxm", c)))
    run = store.runs("h100-sxm", commit)[-1]
    root = Path(tempfile.mkdtemp()) / "results"
    folder = root / "h100-sxm" / "optbench" / commit
    folder.mkdir(parents=True)
    source = store.path("h100-sxm", commit, run.run_id)
    shutil.copy(source, folder / source.name)
    shutil.copy(source, folder / source.name.replace(run.run_id, "99991231T000000Z-copy00"))
    copy_code, _ = quiet(
        [
            commit,
            commit,
            "--results",
            str(root),
            "--base-run",
            run.run_id,
            "--head-run",
            "99991231T000000Z-copy00",
        ]
    )
    print(f"an identical copy of run {run.run_id} of {commit[:12]}: exit {copy_code}")
    return int(codes[1] > 0 or code == 1 or copy_code == 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "HEAD"))
