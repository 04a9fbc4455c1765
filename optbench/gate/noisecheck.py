"""``optbench noisecheck``: does the regression gate stay quiet on noise and catch a real slowdown?

Two checks of the gate of ``optbench compare``, on the stored runs of each machine (no GPU needed):

- A/A: every run of a commit that has other runs of the same metrics is compared, as head, with those other
  runs (the noise estimated without it): the gate may flag nothing.
- Planted slowdowns: every commit's runs, with every time multiplied by ``--plant`` (1.15), compared as a new
  commit with the commit itself; each metric whose A/A run-to-run spread (:meth:`optbench.gate.compare.Noise.aa_spread`)
  is under ``--spread`` (5%) must be flagged. Verdicts are per metric and the planted runs stay out of the
  noise estimate, so planting every metric at once gives each metric's verdict as if it alone were planted.

Exits 1 when an A/A comparison flags anything or a planted metric under the spread goes unflagged.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from optbench.core.store import ResultStore, StoredRun
from optbench.gate.compare import NoiseModel, compare_runs, history_runs, run_medians


def planted(run: StoredRun, factor: float) -> StoredRun:
    """A copy of ``run`` with every time (samples, median, quartiles) multiplied by ``factor``."""
    records = copy.deepcopy(run.records)
    for rec in records.values():
        for clocks in (rec.get("metrics") or {}).values():
            for t in (clocks or {}).values():
                if not t:
                    continue
                t["samples_ms"] = [v * factor for v in t.get("samples_ms", [])]
                for name in ("median_ms", "q25_ms", "q75_ms", "iqr_ms"):
                    if name in t:
                        t[name] *= factor
    return replace(run, commit=f"planted-{run.commit}", records=records)


@dataclass
class Audit:
    """What the gate did on one machine: A/A comparisons and planted slowdowns, counted per time metric."""

    machine: str
    aa_metrics: int = 0
    aa_flagged: list[str] | None = None
    planted_metrics: int = 0
    planted_flagged: int = 0
    quiet_metrics: int = 0  # planted metrics whose A/A spread is under the spread bound
    quiet_flagged: int = 0
    quiet_missed: list[str] | None = None


def _label(c) -> str:
    return f"{c.base_commit[:8]} {c.key} {c.metric} {c.clock} {c.ratio:.3f}x (detectable {c.detectable:.1%})"


def audit(store: ResultStore, machine: str, factor: float = 1.15, spread: float = 0.05,
          threshold: float = 0.05) -> Audit:
    """A/A comparisons and planted slowdowns over the stored runs of ``machine`` (see the module docstring)."""
    result = Audit(machine, aa_flagged=[], quiet_missed=[])
    everything = NoiseModel.of(history_runs(store, machine))
    for commit in store.commits(machine):
        runs = store.runs(machine, commit)
        for head in runs:
            others = [r for r in runs if r is not head and set(run_medians(r)) & set(run_medians(head))]
            if not others:
                continue
            noise = NoiseModel.of(history_runs(store, machine, leave_out=[head.run_id]))
            times = [c for c in compare_runs(others, [head], noise, threshold) if c.quantity == "time" and c.gated]
            result.aa_metrics += len(times)
            result.aa_flagged += [_label(c) for c in times if c.significant]
        changes = compare_runs(runs, [planted(r, factor) for r in runs], everything, threshold)
        for c in (c for c in changes if c.quantity == "time" and c.gated):
            result.planted_metrics += 1
            result.planted_flagged += c.regression
            if c.noise is not None and c.noise.aa_spread() < spread:
                result.quiet_metrics += 1
                result.quiet_flagged += c.regression
                if not c.regression:
                    result.quiet_missed.append(_label(c))
    return result


def _fraction(part: int, whole: int) -> str:
    return f"{part} of {whole}" + (f" ({part / whole:.0%})" if whole else "")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="optbench noisecheck", description=__doc__.splitlines()[0])
    p.add_argument("--machine", action="append", help="machine folder (repeatable; default all)")
    p.add_argument("--plant", type=float, default=1.15, help="factor every planted time is multiplied by")
    p.add_argument("--spread", type=float, default=0.05, help="A/A spread under which a plant must be flagged")
    p.add_argument("--threshold", type=float, default=0.05, help="the gate's threshold (as optbench compare)")
    p.add_argument("--results", type=Path, help="results root (default $OPTBENCH_RESULTS or results/)")
    args = p.parse_args(argv)
    store = ResultStore(args.results)
    ok = True
    for machine in args.machine or store.machines():
        a = audit(store, machine, args.plant, args.spread, args.threshold)
        print(f"{machine}: A/A: {len(a.aa_flagged)} of {a.aa_metrics} compared time metrics flagged; planted "
              f"{args.plant:g}x: {_fraction(a.planted_flagged, a.planted_metrics)} flagged, of those with an A/A "
              f"spread under {args.spread:.0%}: {_fraction(a.quiet_flagged, a.quiet_metrics)}")
        for line in [*(f"  A/A flagged: {x}" for x in a.aa_flagged), *(f"  missed: {x}" for x in a.quiet_missed)]:
            print(line)
        ok &= not a.aa_flagged and not a.quiet_missed
    return 0 if ok else 1
