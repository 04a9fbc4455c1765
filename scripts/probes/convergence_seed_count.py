"""How many eager seeds the convergence check needs, predicted from the stored GPU runs' eager
curves before a run with more seeds measures it. CPU only, from the store; one JSON line per machine
and seed count. ``python3 -m scripts.probes.convergence_seed_count`` (output of session 28:
``results/cpu-amd-epyc/probes-2026-11-29/``).

The stored runs before session 28 trained seeds 0-3, and eager's training is not deterministic on
a GPU: the same seed's curves differ from run to run. The probe first measures how much
(``same_seed_rms`` against ``other_seed_rms``, the RMS over the compared points of the difference
of two curves of one seed in two runs, and of two seeds of one run). Then, drawing ``n`` of a
machine's stored curves (of one protocol) as the eager seeds and one more as a variant of unchanged
code (``DRAWS`` times, seeded), it counts the check's two errors at ``n`` = 4 and 8: false alarms
on the unchanged curve, and misses of the same curve shifted up by ``SHIFTS`` nats over the
compared points (a planted regression).

Caveats: a pool of 12 or 16 curves holds few distinct draws of 8 + 1 (so a rate of 0 bounds little),
a draw mixes runs and repeats seed indices where a real check has one run's distinct seeds, and the
drawn variant does not share seed 0's init as a real one does. It predicts; a run measures.
"""

from __future__ import annotations

import itertools
import json
import random

from optbench.store.store import ResultStore
from optbench.suite import convergence as C
from scripts.probes.convergence_errors import MACHINES, SHIFTS, _runs

DRAWS = 4000
SEED_COUNTS = (4, 8)


def _pair_rms(pairs: list[tuple[C.Curve, C.Curve]], first: int) -> float:
    """The RMS over ``pairs`` and the compared points of the difference of two curves, nats."""
    squares = [C.rms_deviation(a, b.loss, first) ** 2 for a, b in pairs]
    return (sum(squares) / len(squares)) ** 0.5


def main() -> None:
    rng = random.Random(0)
    for machine in MACHINES:
        runs = [r for r in _runs(ResultStore(), machine).values() if len(r.curves) == 4]
        if not runs:
            continue
        first = runs[0].first
        # (run index, seed index, curve)
        curves = [(r, s, c) for r, seeds in enumerate(runs) for s, c in enumerate(seeds.curves)]
        same, other = [], []
        for (r1, s1, c1), (r2, s2, c2) in itertools.combinations(curves, 2):
            if r1 != r2 and s1 == s2:
                same.append((c1, c2))
            elif r1 == r2:
                other.append((c1, c2))
        print(
            json.dumps(
                {
                    "machine": machine,
                    "runs": len(runs),
                    "curves": len(curves),
                    "same_seed_rms": _pair_rms(same, first),
                    "other_seed_rms": _pair_rms(other, first),
                }
            )
        )
        pool = [c for _, _, c in curves]
        for n in SEED_COUNTS:
            if n + 1 > len(pool):
                continue
            alarms, misses = 0, dict.fromkeys(SHIFTS, 0)
            tolerances = []
            for _ in range(DRAWS):
                *drawn, variant = rng.sample(pool, n + 1)
                eager = C.EagerSeeds(tuple(drawn), first)
                verdict = C.judge(variant, eager)
                tolerances.append(verdict.tolerance)
                alarms += not verdict.ok
                for shift in SHIFTS:
                    moved = tuple(
                        x + shift if j >= first else x for j, x in enumerate(variant.loss)
                    )
                    misses[shift] += C.judge(C.Curve(variant.steps, moved), eager).ok
            tolerances.sort()
            print(
                json.dumps(
                    {
                        "machine": machine,
                        "seeds": n,
                        "draws": DRAWS,
                        "false_alarm_rate": alarms / DRAWS,
                        "miss_rate": {str(k): v / DRAWS for k, v in misses.items()},
                        "tolerance_p5_p50_p95": [
                            tolerances[int(q * (DRAWS - 1))] for q in (0.05, 0.5, 0.95)
                        ],
                    }
                )
            )


if __name__ == "__main__":
    main()
