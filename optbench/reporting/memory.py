"""Device memory of each training step as the report shows it: measured, with the estimate of
:mod:`optbench.suite.memory_estimate` beside it (memory.html's table and time-against-memory charts,
the index's headline column).

The measured figure of a step is its case's peak (:class:`optbench.store.records.CaseMemory`:
weights, gradients, optimizer state, activations and graph pools); where its record has none, the
extra memory of one step call above what the process held before it (``Record.peak_bytes('step')``:
gradients and activations, no weights or optimizer state), and only for a step not replayed from a
CUDA graph: a replay allocates nothing (its memory came at capture), so its per-call figure reads ~0
by how it is measured and is never shown as its memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.variants import VARIANTS, switches
from optbench.reporting.data import Run, step_ms
from optbench.store.records import CASE_METER, Record
from optbench.suite.catalog import graphed

GB = 1e9
CASE, PER_CALL = "case peak", "per call"  # what a measured figure is (StepMemory.kind)
PER_CALL_MARK = "†"
EARLIER_METER_MARK = "°"  # a case peak of a meter before records.CASE_METER
NOT_SHOWN = "–"  # a graphed step without a case peak
# The variants whose point is memory against time: activation checkpointing and the losses that
# never hold the full logits (each switches nothing else).
TRADES = tuple(v for v in VARIANTS if set(switches(v)) <= {"checkpoint_every", "loss"})
MEMORY_NOTE = (
    "GB = 10⁹ bytes (MB, 10⁶ bytes, where a cell names it: under 0.1 GB). Measured: the case's "
    "peak (weights, gradients, optimizer state, activations "
    f"and CUDA-graph pools); {PER_CALL_MARK} where the record has no case peak: the extra memory "
    "of one step call above what the process held before it (gradients and activations; weights "
    f"and optimizer state not counted); {EARLIER_METER_MARK}: a case peak measured before the case "
    "meter's version 2 (2026-11-29), which read a step measured after a CUDA-graph case of its "
    "process low (the 100M best-kernels step: 4.4 GB after 56 cases of a full suite, 5.5 GB first "
    f"in its process); {NOT_SHOWN}: a step replayed from a CUDA graph whose "
    "record has no case peak (a replay allocates nothing: its memory came at capture). Estimate: "
    "optbench.suite.memory_estimate's formula for the step's options on the run's hardware profile "
    "(what the plan skips a size by)."
)


@dataclass(frozen=True)
class StepMemory:
    """One step's memory: ``measured`` bytes of ``kind`` (:data:`CASE` or :data:`PER_CALL`; None
    and '' where there is none to show) and the ``estimate`` (None where unknown)."""

    measured: float | None
    kind: str
    estimate: float | None
    graphed: bool
    earlier_meter: bool = False  # a case peak of a meter before records.CASE_METER

    def cell(self) -> str:
        """The measured figure (:func:`gb_cell`), marked :data:`PER_CALL_MARK` where per call and
        :data:`EARLIER_METER_MARK` where an earlier meter measured it; :data:`NOT_SHOWN` for a
        graphed step without one; 'n/a' otherwise."""
        if self.measured is None:
            return NOT_SHOWN if self.graphed else "n/a"
        per_call = PER_CALL_MARK if self.kind == PER_CALL else ""
        earlier = EARLIER_METER_MARK if self.earlier_meter else ""
        return f"{gb_cell(self.measured)}{per_call}{earlier}"

    def estimate_cell(self) -> str:
        return "n/a" if self.estimate is None else gb_cell(self.estimate)


def gb_cell(nbytes: float) -> str:
    """Bytes in GB to one decimal, or in MB, named, under 0.1 GB (a tiny step's few MB would read
    0.0 in a GB column)."""
    return f"{nbytes / GB:.1f}" if nbytes >= GB / 10 else f"{nbytes / 1e6:.0f} MB"


def estimate_bytes(run: Run, size: str, variant: str) -> float | None:
    """:func:`optbench.suite.memory_estimate.step_memory_bytes` of ``variant`` at ``size`` with the
    options the run's hardware profile gives it (``optbench.suite.baseline.step_pair``); None where
    the profile, the size or the variant is unknown."""
    from models.config import CONFIGS
    from optbench.suite.baseline import step_pair
    from optbench.suite.memory_estimate import step_memory_bytes

    profile = run.profile()
    if profile is None or size not in CONFIGS or (variant != "eager" and variant not in VARIANTS):
        return None
    return step_memory_bytes(CONFIGS[size], step_pair(profile, size, variant)[1])


def step_memory(run: Run, size: str, variant: str, rec: Record) -> StepMemory:
    """The memory of ``rec``, the step of ``variant`` at ``size`` in ``run`` (module docstring)."""
    is_graphed = graphed(variant)
    per_call = None if is_graphed else rec.peak_bytes("step")
    measured, kind = (
        (rec.memory.peak_bytes, CASE)
        if rec.memory.peak_bytes is not None
        else (per_call, PER_CALL)
        if per_call is not None
        else (None, "")
    )
    earlier = kind == CASE and rec.memory.meter != CASE_METER
    return StepMemory(measured, kind, estimate_bytes(run, size, variant), is_graphed, earlier)


def memory_columns(sizes: list[tuple[str, Run, dict[str, Record]]]) -> list[str]:
    """The header of :func:`memory_rows`: a measured and an estimate column per size."""
    return [
        "variant",
        *(
            column
            for size, run, _ in sizes
            for column in (f"{size} @ {run.commit[:8]}: measured GB", f"{size}: estimate GB")
        ),
    ]


def memory_rows(sizes: list[tuple[str, Run, dict[str, Record]]]) -> list[list[str]]:
    """A row per variant measured at some size of ``sizes`` ((size, run, records by variant), as
    :func:`optbench.reporting.data.by_size` gives them), eager first: per size the measured figure
    and the estimate (:meth:`StepMemory.cell`); blank where the variant was not measured there."""
    variants = sorted(
        dict.fromkeys(v for _, _, by_v in sizes for v in by_v), key=lambda v: v != "eager"
    )
    rows = []
    for variant in variants:
        row = [variant]
        for size, run, by_v in sizes:
            rec = by_v.get(variant)
            if rec is None:
                row += ["", ""]
            else:
                memory = step_memory(run, size, variant, rec)
                row += [memory.cell(), memory.estimate_cell()]
        rows.append(row)
    return rows


def time_against_memory(
    run: Run, size: str, by_variant: dict[str, Record]
) -> tuple[str, list[tuple[str, float, float]]]:
    """The points of one size's time-against-memory panel: (x label, [(variant, GB, ms per step)]).
    One kind of figure per panel: case peaks where any step of the size has one, else the per-call
    figures of the steps not replayed from a CUDA graph."""
    found = {v: step_memory(run, size, v, rec) for v, rec in by_variant.items()}
    kind = CASE if any(m.kind == CASE for m in found.values()) else PER_CALL
    label = (
        "peak memory of the case (GB)"
        if kind == CASE
        else "extra memory of one step call (GB; no case peaks recorded)"
    )
    points = [
        (v, m.measured / GB, step_ms(by_variant[v]))
        for v, m in found.items()
        if m.kind == kind and m.measured is not None
    ]
    return label, points
