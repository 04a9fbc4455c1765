"""Probe (CPU): which verdicts of the stored ``optbench ab`` calls the ``not slower`` verdict
(optbench.gate.ratio, 346ffad) changes, counted by head: a planted slowdown
(``scripts/gate-plants.sh``' plant/slow), a neutral change or the same code (A/A), other. Each
pairing record's runs are judged again from the store with ``ab.judge`` (every round, none set
apart for its check), and each verdict is printed beside what it was before that rule
(``inconclusive`` for ``not slower``). Output of its run in session 29:
results/cpu-amd-epyc/probes-2026-11-29/not-slower-rejudge-session29.txt.

    python3 -m scripts.probes.not_slower_rejudge
"""

import collections
import glob
import json

from optbench.gate import ab
from optbench.gate.ratio import INCONCLUSIVE, NOT_SLOWER
from optbench.store.store import ResultStore


def head_kind(pairing: dict) -> str:
    ref = pairing["head"].get("ref", "")
    if "slow" in ref:
        return "planted slowdown"
    if "neutral" in ref or pairing["base"]["commit"] == pairing["head"]["commit"]:
        return "neutral or A/A"
    return "other"


def main() -> None:
    store = ResultStore()
    counts: collections.Counter = collections.Counter()
    for path in sorted(glob.glob("results/*/ab/*.json")):
        pairing = json.load(open(path))
        sides = [
            [
                ab.values(ab.find_run(store, pairing[s]["commit"], run)[1])[0]
                for run in pairing[s]["runs"]
            ]
            for s in ("base", "head")
        ]
        kind = head_kind(pairing)
        for v in ab.judge(*sides, pairing["confidence"]):
            before = INCONCLUSIVE if v.verdict == NOT_SLOWER else v.verdict
            counts[kind, before, v.verdict] += 1
            if v.verdict == NOT_SLOWER:
                s = v.series
                print(
                    f"{path}: {kind}, {s.key} {s.metric} {s.clock} ({v.klass}): "
                    f"[{v.ratio.low:.3f}, {v.ratio.high:.3f}] not slower, was inconclusive"
                )
    for (kind, before, after), n in sorted(counts.items()):
        print(f"{kind}: {before} -> {after}: {n}")


if __name__ == "__main__":
    main()
