"""Probe: judge the stored rounds of ``optbench ab`` calls again with this checkout's verdict code
(the runs each pairing record names, read from the store), and print each memory verdict. Run
from the repository root, no GPU:

    python3 -m scripts.probes.rejudge_ab results/h200/ab/*.json
"""

from __future__ import annotations

import json
import sys

from optbench.gate import ab
from optbench.store.store import ResultStore


def main(paths: list[str]) -> None:
    store = ResultStore()
    for path in paths:
        pairing = json.load(open(path))
        sides = []
        for side in ("base", "head"):
            commit = pairing[side]["commit"]
            runs = [ab.find_run(store, commit, run)[1] for run in pairing[side]["runs"]]
            sides.append([ab.values(records)[0] for records in runs])
        verdicts = ab.judge(*sides, pairing["confidence"])
        memory = [v for v in verdicts if v.series.quantity == "peak memory"]
        print(
            f"{path}: {pairing['base']['ref']} -> {pairing['head']['ref']}, "
            f"{len(sides[0])} against {len(sides[1])} runs (stored exit {pairing['exit']})"
        )
        for v in memory:
            print(
                f"  {v.series.key} {v.series.metric}: {v.ratio.estimate:.4f}x "
                f"[{v.ratio.low:.6f}, {v.ratio.high:.6f}] {v.verdict}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
