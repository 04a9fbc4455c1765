"""What a pooled seed spread would make of the convergence check's stored verdicts: for each stored
convergence record of a GPU machine, its deviation against the tolerance its run had (4 x that run's
own eager seeds' spread) and against 4 x the spread pooled over the stored runs' seeds of the same
GPU model, software and protocol (a rule tried and taken back, NOTES.md): those stored before the
record's run (``live``) and all of them (``now``). CPU only, from the store; one JSON line per
record. ``python3 -m scripts.probes.convergence_pooled_spread`` (output of session 27:
``results/cpu-amd-epyc/probes-2026-11-29/``).
"""

from __future__ import annotations

import json
import math

import torch

from optbench.store.store import ResultStore
from optbench.suite import convergence as C

MACHINES = ("h200", "h100-sxm")
SIZE = "100M"


def seed_variance(seeds: C.EagerSeeds) -> float:
    """The mean over the compared points of the seeds' sample variance, nats squared."""
    losses = torch.tensor([c.loss for c in seeds.curves], dtype=torch.float64)[:, seeds.first :]
    return float(losses.var(0).mean())


def pooled_tolerance(seeds: C.EagerSeeds, others: list[float]) -> float:
    """FACTOR x the root of the mean of the seeds' variance and ``others`` (other runs')."""
    variances = [seed_variance(seeds), *others]
    return C.FACTOR * max(math.sqrt(sum(variances) / len(variances)), C.SPREAD_FLOOR)


def _seeds(info: dict) -> C.EagerSeeds:
    eager = info["eager"]
    curves = tuple(C.Curve(tuple(c["steps"]), tuple(c["loss"])) for c in eager["curves"])
    return C.EagerSeeds(curves, curves[0].steps.index(eager["compared_from_step"]))


def main() -> None:
    store = ResultStore()
    for machine in MACHINES:
        variances: dict[tuple, dict[str, float]] = {}
        verdicts = []
        for commit in store.commits(machine):
            for run in store.runs(machine, commit):
                software = tuple(run.info.get(k) for k in C.SAME_SOFTWARE)
                for key, rec in run.results().items():
                    info = rec.get("info") or {}
                    if not key.startswith(f"bench_convergence.Convergence{SIZE}|") or not info.get(
                        "eager"
                    ):
                        continue
                    group = (*software, json.dumps(info["protocol"], sort_keys=True))
                    source = info["eager"].get("from_run") or run.run_id
                    variances.setdefault(group, {})[source] = seed_variance(_seeds(info))
                    verdicts.append((run.run_id, commit, rec, group, source))
        for run_id, commit, rec, group, source in verdicts:
            own = _seeds(rec["info"])
            deviation = rec["info"]["rms_deviation"]
            line = {
                "machine": machine,
                "run": run_id,
                "commit": commit[:7],
                "variant": rec["params"]["variant"],
                "status": rec["status"],
                "deviation": round(deviation, 5),
                "tolerance_own": round(rec["info"]["tolerance"], 5),
            }
            for when, before in (("live", run_id), ("now", None)):
                pooled = [
                    v
                    for r, v in variances[group].items()
                    if r != source and (before is None or r < before)
                ]
                tolerance = pooled_tolerance(own, pooled)
                line[f"tolerance_{when}"] = round(tolerance, 5)
                line[f"runs_{when}"] = 1 + len(pooled)
                line[f"ratio_{when}"] = round(deviation / tolerance, 3)
            print(json.dumps(line))


if __name__ == "__main__":
    main()
