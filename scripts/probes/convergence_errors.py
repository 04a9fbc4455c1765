"""Both errors of the convergence check on the stored eager seeds of the GPU machines, with its own
spread and with one pooled over the stored runs (``convergence_pooled_spread.pooled_tolerance``):
each eager seed of each stored run judged as a variant against its run's other seeds' mean
(unchanged code: an alarm is a false one), then the same seed with its curve shifted up by
``SHIFTS`` nats over the compared points (a planted regression: a pass is a miss). CPU only, from
the store; one JSON line per machine and way. ``python3 -m scripts.probes.convergence_errors``
(output of session 27: ``results/cpu-amd-epyc/probes-2026-11-29/``).
"""

from __future__ import annotations

import json

from optbench.store.store import ResultStore
from optbench.suite import convergence as C
from scripts.probes.convergence_pooled_spread import pooled_tolerance, seed_variance

MACHINES = ("h200", "h100-sxm")
SIZE = "100M"
SHIFTS = (0.01, 0.02, 0.04)  # nats added to every compared point


def _runs(store: ResultStore, machine: str) -> dict[str, C.EagerSeeds]:
    """Each stored run's own eager seeds (by the run that trained them), the software ignored:
    every run here has one GPU model and software per machine."""
    found: dict[str, C.EagerSeeds] = {}
    for commit in store.commits(machine):
        for run in store.runs(machine, commit):
            for key, rec in run.results().items():
                eager = (rec.get("info") or {}).get("eager")
                if key.startswith(f"bench_convergence.Convergence{SIZE}|") and eager:
                    curves = tuple(
                        C.Curve(tuple(c["steps"]), tuple(c["loss"])) for c in eager["curves"]
                    )
                    first = curves[0].steps.index(eager["compared_from_step"])
                    found.setdefault(
                        eager.get("from_run") or run.run_id, C.EagerSeeds(curves, first)
                    )
    return found


def main() -> None:
    store = ResultStore()
    for machine in MACHINES:
        runs = _runs(store, machine)
        for way in ("own", "pooled"):
            alarms, misses, trials = 0, dict.fromkeys(SHIFTS, 0), 0
            for source, seeds in runs.items():
                others = [seed_variance(s) for r, s in runs.items() if r != source]
                for i, curve in enumerate(seeds.curves):
                    rest = C.EagerSeeds(seeds.curves[:i] + seeds.curves[i + 1 :], seeds.first)
                    tolerance = C.judge(curve, rest).tolerance
                    if way == "pooled":
                        tolerance = pooled_tolerance(rest, others)
                    trials += 1
                    alarms += C.judge(curve, rest).deviation > tolerance
                    for shift in SHIFTS:
                        moved = tuple(
                            x + shift if j >= seeds.first else x for j, x in enumerate(curve.loss)
                        )
                        misses[shift] += (
                            C.judge(C.Curve(curve.steps, moved), rest).deviation <= tolerance
                        )
            line = {
                "machine": machine,
                "way": way,
                "runs": len(runs),
                "trials": trials,
                "false_alarms": alarms,
                "missed_shifts": {str(k): v for k, v in misses.items()},
            }
            print(json.dumps(line))


if __name__ == "__main__":
    main()
