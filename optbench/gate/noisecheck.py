"""``optbench noisecheck``: does the stored-history comparison stay quiet on noise and catch a real
slowdown, on runs its noise estimate has not seen?

On each machine, every pair of runs of one commit on one GPU (an A/A pair) is held out in turn:
the noise (:class:`optbench.gate.compare.NoiseModel`) is fitted on every other stored run of the
machine, and the pair is compared, the earlier run as base and the later as head, by
:func:`optbench.gate.compare.compare_runs`:

- A/A: the pair as it is. Every gated verdict (a regression or an improvement) is a false alarm.
  Beside their count, the number the noise model expects (:func:`alarm_probability` of each gated
  verdict, summed) and the chance of at least the count seen: a small chance says the model
  understates the noise; a chance near 1 says the alarms are the ones its ALPHA allows.
- Planted: the later run with every time, peak memory (each call's, and the case's own peak and
  resident bytes) and compile seconds multiplied by a factor (:func:`planted`): 1.15, and 1.05 for
  the device-bound times. Each metric's verdict is counted per metric class
  (:func:`optbench.suite.catalog.metric_class`, the class whose threshold the gate applies): the
  power. Planting every metric of a run at once gives each metric its own verdict, as if it alone
  were planted.

The target, per machine (:attr:`Audit.ok`):

- false alarms: at most max(3, 2 x the number the noise model expects);
- required catches (:data:`REQUIRED`): 1.15x in every judged device-bound time and every peak
  memory, 1.05x in every judged device-bound time.

Host-bound times and compile seconds are planted too and their catches reported as a trend, not
required: a host-bound time moves by several to tens of percent between processes, and the gate's
lockstep A/B (``optbench ab``) decides host-bound changes (on a GPU machine the comparison reports
host-bound times and does not gate them, :data:`optbench.gate.compare.HOST_BOUND`: neither their
alarms nor their plants are judged there); compile seconds' class threshold, 15%, is what the plant
adds. A metric without a noise estimate on its GPU
(:data:`optbench.gate.compare.NO_NOISE`) is counted apart: the comparison does not judge it.

Exit codes: 0 every machine meets the target; 1 one does not; 2 nothing checked (an unknown
machine, no A/A pair of runs of one commit on one GPU).
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path

from optbench.gate.compare import (
    NO_NOISE,
    Change,
    NoiseModel,
    compare_runs,
    compared,
    gpu_of,
)
from optbench.store.records import metric_label
from optbench.store.store import ResultStore, StoredRun
from optbench.suite.catalog import metric_class

PLANTS = {1.15: ("device-bound", "host-bound", "memory", "compile"), 1.05: ("device-bound",)}
#: The classes whose every judged plant must be caught, per factor; the other planted classes are
#: reported as a trend.
REQUIRED = {1.15: ("device-bound", "memory"), 1.05: ("device-bound",)}
#: False alarms a machine may raise: max(ALARMS_ALLOWED, ALARM_EXCESS x the number expected).
ALARMS_ALLOWED, ALARM_EXCESS = 3, 2
#: The case memory (:class:`optbench.store.records.CaseMemory`) that ``Record.peaks()`` judges, as
#: CASE_PEAK and CASE_RESIDENT.
CASE_MEMORY = ("peak_bytes", "resident_bytes")


def planted(run: StoredRun, factor: float) -> StoredRun:
    """A copy of ``run`` with every time (samples, median, quartiles), peak memory (each call's,
    and the case's :data:`CASE_MEMORY`) and compile seconds multiplied by ``factor``."""
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
        peaks = rec.get("peak_mem_bytes") or {}
        for metric, value in peaks.items():
            if value is not None:
                peaks[metric] = value * factor
        memory = rec.get("memory") or {}
        for name in CASE_MEMORY:
            if memory.get(name) is not None:
                memory[name] *= factor
        if rec.get("compile_seconds") is not None:
            rec["compile_seconds"] *= factor
    return replace(run, commit=f"planted-{run.commit}", records=records)


def aa_pairs(runs: Sequence[StoredRun]) -> list[tuple[StoredRun, StoredRun]]:
    """Every pair of ``runs`` (oldest first) of one commit on one GPU, the earlier run first."""
    return [
        (a, b)
        for a, b in combinations(runs, 2)
        if a.commit == b.commit and gpu_of(a) is not None and gpu_of(a) == gpu_of(b)
    ]


def alarm_probability(c: Change) -> float:
    """The chance, under the noise model, that an A/A comparison of ``c``'s runs reads a change
    beyond its detectable one, slower or faster: 2 P(T > log(1 + detectable) / (sigma sqrt(1/n_base
    + 1/n_head))), T Student's t with sigma's degrees of freedom. 0 for a verdict the model does not
    judge (peak memory, a deterministic value against its threshold; a status)."""
    from scipy import stats

    if c.noise is None or c.detectable is None or not c.gated:
        return 0.0
    n_base, n_head = c.runs
    scale = c.noise.sigma * math.sqrt(1 / n_base + 1 / n_head)
    if scale == 0:
        return 0.0
    return float(2 * stats.t.sf(math.log1p(c.detectable) / scale, c.noise.df))


def _class(c: Change) -> str | None:
    return metric_class(c.benchmark, c.params, c.quantity, c.clock, c.metric)


def _label(c: Change) -> str:
    what = metric_label(c.metric, c.quantity)
    ratio = "" if c.ratio is None else f" {c.ratio:.3f}x"
    spread = f", A/A spread {c.noise.aa_spread():.1%}" if c.noise is not None else ""
    detectable = "" if c.detectable is None else f" (detectable {c.detectable:.1%}{spread})"
    status = f" {c.base_status} -> {c.head_status}" if c.quantity == "status" else ""
    return f"{c.base_commit[:8]} {c.gpu} {c.key} {what} {c.clock or ''}{status}{ratio}{detectable}"


@dataclass
class Audit:
    """What the comparison did on one machine's held-out A/A pairs."""

    machine: str
    pairs: int = 0
    gpus: set[str] = field(default_factory=set)
    aa_judged: int = 0  # gated verdicts of the A/A comparisons
    expected: float = 0.0  # false alarms the noise model expects of them (alarm_probability)
    false_alarms: list[str] = field(default_factory=list)
    blind: Counter[str] = field(default_factory=Counter)  # time metrics without noise, per class
    planted: dict[float, Counter[str]] = field(default_factory=dict)  # factor -> class -> judged
    caught: dict[float, Counter[str]] = field(default_factory=dict)  # factor -> class -> flagged
    missed: list[str] = field(default_factory=list)  # required plants not caught

    @property
    def alarms_allowed(self) -> float:
        """The most false alarms the target allows: max(ALARMS_ALLOWED, ALARM_EXCESS x
        expected)."""
        return max(ALARMS_ALLOWED, ALARM_EXCESS * self.expected)

    @property
    def ok(self) -> bool:
        """Whether the machine meets the target: false alarms within :attr:`alarms_allowed`, no
        required plant missed."""
        return len(self.false_alarms) <= self.alarms_allowed and not self.missed


def audit(store: ResultStore, machine: str) -> Audit:
    """The held-out A/A pairs of ``machine`` and their plants (see the module docstring)."""
    result = Audit(
        machine, planted={f: Counter() for f in PLANTS}, caught={f: Counter() for f in PLANTS}
    )
    everything = store.machine_runs(machine)
    for base, head in aa_pairs(everything):
        held = {base.run_id, head.run_id}
        noise = NoiseModel.of(r for r in everything if r.run_id not in held)
        aa = [c for c in compare_runs([base], [head], noise) if compared(c)]
        if not aa:
            continue
        result.pairs += 1
        result.gpus.add(gpu_of(base))
        result.aa_judged += sum(c.gated for c in aa)
        result.expected += sum(alarm_probability(c) for c in aa)
        result.false_alarms += [_label(c) for c in aa if c.regression or c.improvement]
        result.blind.update(_class(c) for c in aa if c.reason == NO_NOISE)
        for factor, classes in PLANTS.items():
            for c in compare_runs([base], [planted(head, factor)], noise):
                if not (c.gated and c.base and c.base.median > 0 and _class(c) in classes):
                    continue  # a status, a class not planted at this factor, or nothing to scale
                result.planted[factor][_class(c)] += 1
                result.caught[factor][_class(c)] += c.regression
                if not c.regression and _class(c) in REQUIRED[factor]:
                    result.missed.append(f"{factor:g}x: {_label(c)}")
    return result


def _fraction(part: int, whole: int) -> str:
    return f"{part} of {whole}" + (f" ({part / whole:.0%})" if whole else "")


def _calibration(seen: int, expected: float) -> str:
    """How ``seen`` false alarms compare with the ``expected`` number under the noise model: the
    chance of at least that many, alarms counted as Poisson with that mean. A small chance says
    the model understates the noise."""
    from scipy import stats

    chance = float(stats.poisson.sf(seen - 1, expected)) if seen else 1.0
    return f"the noise model expects {expected:.2f} (P(at least {seen}) = {chance:.2g})"


def _caught(a: Audit, factor: float, classes: Sequence[str]) -> str:
    return ", ".join(
        f"{cls} {_fraction(a.caught[factor][cls], a.planted[factor][cls])}" for cls in classes
    )


def report(a: Audit) -> list[str]:
    """The lines ``optbench noisecheck`` prints for one machine: the verdict on the target first."""
    if not a.pairs:
        return [f"{a.machine}: nothing checked: no two runs of one commit on one GPU"]
    alarms = len(a.false_alarms)
    required = sum(a.planted[f][cls] for f in REQUIRED for cls in REQUIRED[f])
    verdict = (
        f"target {'met' if a.ok else 'missed'}: {alarms} false alarms, "
        f"{'over' if alarms > a.alarms_allowed else 'at most'} {a.alarms_allowed:.2f} allowed; "
        f"{len(a.missed)} of {required} required plants missed"
    )
    # the classes planted but not required that the comparison judged (on a GPU machine it never
    # gates host-bound times: compare.HOST_BOUND)
    trend = {f: [c for c in PLANTS[f] if c not in REQUIRED[f] and a.planted[f][c]] for f in PLANTS}
    lines = [
        f"{a.machine}: {verdict}",
        f"  {a.pairs} held-out A/A pairs of runs of one commit on one GPU ({len(a.gpus)} GPUs)",
        f"  A/A: {alarms} false alarms in {a.aa_judged} gated verdicts, at most "
        f"max({ALARMS_ALLOWED}, {ALARM_EXCESS} x expected) = {a.alarms_allowed:.2f} allowed; "
        f"{_calibration(alarms, a.expected)}",
        "  not judged, no noise estimate on the GPU without the pair: "
        + (", ".join(f"{cls} {n}" for cls, n in sorted(a.blind.items())) or "none"),
        "  required, caught: "
        + "; ".join(f"{f:g}x {_caught(a, f, REQUIRED[f])}" for f in PLANTS)
        + f"; missed: {len(a.missed)}",
        "  trend, not required (ab's lockstep rounds decide host-bound changes): "
        + (
            "; ".join(f"{f:g}x {_caught(a, f, trend[f])}" for f in PLANTS if trend[f])
            or "none judged"
        ),
    ]
    lines += [f"  false alarm: {x}" for x in a.false_alarms]
    lines += [f"  missed {x}" for x in a.missed]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``optbench noisecheck``: exit 0 every machine meets the target, 1 one does not, 2 nothing
    checked."""
    p = argparse.ArgumentParser(
        prog="optbench noisecheck",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--machine", action="append", help="machine folder (repeatable; default all)")
    p.add_argument(
        "--results", type=Path, help="results root (default $OPTBENCH_RESULTS or results/)"
    )
    args = p.parse_args(argv)
    store = ResultStore(args.results)
    unknown = [m for m in args.machine or () if m not in store.machines()]
    if unknown:
        print(
            f"optbench noisecheck: no stored runs of machine {', '.join(unknown)} in {store.root}",
            file=sys.stderr,
        )
        return 2
    audits = [audit(store, machine) for machine in args.machine or store.machines()]
    for a in audits:
        print("\n".join(report(a)))
    if not any(a.pairs for a in audits):
        print(
            f"optbench noisecheck: nothing checked: no machine in {store.root} holds two runs of "
            "one commit on one GPU",
            file=sys.stderr,
        )
        return 2
    return 0 if all(a.ok for a in audits) else 1


if __name__ == "__main__":
    sys.exit(main())
