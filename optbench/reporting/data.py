"""What the report shows, read from the store: each machine's runs and the figures derived from
them.

A :class:`Run` is the latest record of each case over one commit's runs on one machine. From it:
training-step speedups, each against the variant's own reference measured in the same run
(``models.variants.reference``), and the leave-one-out ablation of best-kernels; tokens/s and MFU;
peak memory; kernel speedups vs the op's baseline (device time, cold L2) and kernel times over their
roofline floor; x HF (the HF anchor's step over our fastest). A commit's run may hold part of the
suite only: :func:`fullest` picks, per size or kernel, the run that measured the most of it, the
newest of those. :func:`time_histories` gives every metric's run medians over commits with the
regression gate's verdicts (:mod:`optbench.gate.compare`) and its change points
(:mod:`optbench.gate.changepoints`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from models.variants import ABLATED, ABLATION, ADDED, VARIANTS, ablation_note, added_note, reference
from optbench.gate.changepoints import (
    MIN_COMMITS,
    ChangePoint,
    RunMedian,
    at_once,
    change_points,
    unit_of,
    unit_series,
)
from optbench.gate.compare import (
    CROSS_GPU,
    NoiseModel,
    compare_runs,
    series_clock,
    verdict,
)
from optbench.reporting.cache import ReportCache
from optbench.store.records import Record, ab_design
from optbench.store.store import (
    DEVICE_CLOCK,
    MACHINE_KEY,
    ResultStore,
    record_key,
    split_key,
)
from optbench.suite import catalog
from optbench.suite.catalog import ANCHOR_BENCHMARK

if TYPE_CHECKING:
    from optbench.measure.hardware import HardwareProfile

GiB = 2**30


@dataclass(frozen=True)
class Run:
    """The records of one machine at one commit: the latest of each case over the commit's optbench
    runs (``records``), and each run's own (``by_run``, by :func:`run_of`)."""

    machine: str
    commit: str
    records: dict[str, Record]
    by_run: Mapping[str, Mapping[str, Record]]

    def beside(self, rec: Record, **params: str) -> Record | None:
        """The record that the optbench run of ``rec`` stored for ``rec``'s benchmark with
        ``params`` in place of its own (a variant's reference, a kernel's baseline), if ok; None
        where that run has none. A figure set beside ``rec`` comes from its run, on its GPU: the
        shards of one commit run on several."""
        other = self.by_run.get(run_of(rec), {}).get(
            record_key(rec.benchmark, {**split_key(rec.key)[1], **params})
        )
        return other if other is not None and other.ok else None

    def pair(self, rec: Record, **params: str) -> tuple[Record, Record] | None:
        """(``rec``'s case, the case with ``params`` in place of its own), both ok and from one run
        of this commit: ``rec``'s own run, else the newest run that stored both (an ``optbench
        ab`` round measures a few cases after a full run of the commit: the latest record of a
        case can come from a run without its reference); None where no run has both."""
        others = sorted((r for r in self.by_run if r != run_of(rec)), reverse=True)
        for run in (run_of(rec), *others):
            mine = self.by_run.get(run, {}).get(rec.key)
            if mine is not None and mine.ok and (other := self.beside(mine, **params)):
                return mine, other
        return None

    @property
    def info(self) -> Mapping[str, Any]:
        return self.records[MACHINE_KEY].info if MACHINE_KEY in self.records else {}

    @property
    def date(self) -> str:
        return self.records[MACHINE_KEY].date if MACHINE_KEY in self.records else ""

    @property
    def emulated(self) -> bool:
        return bool(self.info.get("emulate"))

    @property
    def label(self) -> str:
        """Machine, GPU and '(emulated)' where the run emulated another profile."""
        gpu = self.info.get("gpu_name") or "CPU"
        return (
            f"{self.machine} — {self.info['emulate']} on {gpu} (emulated)"
            if self.emulated
            else f"{self.machine} — {gpu}"
        )

    def profile(self) -> HardwareProfile | None:
        """Hardware profile of the run (the emulated one where emulating); None if unknown."""
        from optbench.measure import hardware

        try:
            return hardware.lookup(self.info.get("emulate") or self.info.get("profile") or "cpu")
        except KeyError:
            return None


def runs(store: ResultStore) -> dict[str, list[Run]]:
    """Each machine's commits (the latest record of each case over the commit's runs), oldest first
    by the date of the commit's first run (a later rerun of an old commit does not make it the
    newest); real GPUs, then emulated, then CPUs."""
    found = {m: [_run(store, m, c) for c in store.commits(m)] for m in store.machines()}
    return dict(
        sorted(
            ((m, h) for m, h in found.items() if h),
            key=lambda mh: (not mh[1][-1].info.get("gpu_name"), mh[1][-1].emulated, mh[0]),
        )
    )


def _run(store: ResultStore, machine: str, commit: str) -> Run:
    """The :class:`Run` of ``commit`` on ``machine``; as in ``ResultStore.load``, no record of
    ``optbench ab``'s own designs (:func:`optbench.store.records.ab_design`) in either part."""
    by_run: dict[str, dict[str, Record]] = defaultdict(dict)
    made: dict[int, Record] = {}  # each stored dict's view, built once
    for stored in store.runs(machine, commit):
        for key, data in stored.records.items():
            if ab_design(data):
                continue
            rec = made[id(data)] = Record.of(data)
            mine = by_run[run_of(rec)]  # a merged run's parts share its id
            if not rec.interrupted or key not in mine:
                mine[key] = rec
    latest = store.load(machine, commit)  # the same dicts, its rule for which is latest
    records = {k: made.get(id(r)) or Record.of(r) for k, r in latest.items()}
    return Run(machine, commit, records, dict(by_run))


def size_order(size: str) -> float:
    """Sort key of a model size: its parameter count ('100M', '1B'), 0 for a named size ('tiny')."""
    m = re.fullmatch(r"([\d.]+)([MB])", size)
    return float(m[1]) * (1e6 if m[2] == "M" else 1e9) if m else 0.0


def grid_records(records: Iterable[Record], role: str) -> dict[str, dict[str, Record]]:
    """The ok records among ``records`` of the step grids of ``role``
    (``optbench.suite.catalog.Benchmark.role``) with a wall time, by size (smallest first), then
    variant."""
    found: dict[str, dict[str, Record]] = defaultdict(dict)
    for rec in records:
        entry = catalog.BENCHMARKS.get(rec.benchmark)
        if entry and entry.role == role and rec.ok and rec.timing("step", "wall"):
            found[entry.size][rec.params["variant"]] = rec
    return {size: found[size] for size in sorted(found, key=size_order)}


def steps(run: Run) -> dict[str, dict[str, Record]]:
    """ok training-step records of the variant grids with a wall time by size ('tiny', '100M', ...),
    variant."""
    return grid_records(run.records.values(), "variants")


def step_failures(run: Run) -> dict[str, dict[str, str]]:
    """The status of each variant-grid step of ``run`` that ran and did not end ok
    (``Record.failed``: 'wrong', 'oom', 'timeout', 'error', 'crashed'), by size, then variant: what
    a table shows in place of its figure. ``run.records`` holds the latest record of each case, so
    a variant is in this or in :func:`steps`, never both."""
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for rec in run.records.values():
        entry = catalog.BENCHMARKS.get(rec.benchmark)
        if entry and entry.role == "variants" and rec.failed:
            found[entry.size][rec.params["variant"]] = rec.status
    return dict(found)


def paired_steps(run: Run) -> dict[str, dict[str, Record]]:
    """:func:`steps` less the variants whose reference their run did not measure (speedup n/a), by
    size (a size whose variants are all such: none), so that a commit measured in shards, a
    variant's reference on another GPU, does not outweigh one whose runs measured the pairs
    (:func:`step_table`)."""
    speedups = step_speedups(run)
    return {
        size: {v: rec for v, rec in by_v.items() if speedups.get(size, {}).get(v, 1.0) is not None}
        for size, by_v in steps(run).items()
    }


def step_table(run: Run) -> dict[str, dict[str, Record]]:
    """:func:`paired_steps` with the HF anchor's record (under its benchmark's name) at each size
    where the run measured it: a step table's weight in :func:`fullest`, whose rows include the
    anchor's and x HF, so that a newer run without the anchor and with no more pairs does not hide
    a size's x HF (one with a pair more does: the newest of the fullest runs wins)."""
    found = paired_steps(run)
    for size, rec in anchor_steps(run).items():
        if size in found:
            found[size] = {**found[size], ANCHOR_BENCHMARK: rec}
    return found


def ablations(run: Run) -> dict[str, dict[str, Record]]:
    """ok records of the leave-one-out ablation grids (bench_step.Ablation*) by size, then
    variant."""
    return grid_records(run.records.values(), "ablation")


def distributed_steps(run: Run) -> dict[str, dict[str, Record]]:
    """ok multi-GPU step records (``optbench.suite.distributed``) with a wall time, by variant,
    then world size (ascending); each variant's from one optbench run of the commit, the one that
    measured it at the most world sizes (the newest of those), whose efficiencies are against its
    own 1-GPU figure: a later run of one world size (a probe, a gate's round) on another machine
    never stands beside them."""
    found: dict[str, dict[str, Record]] = {}
    for run_id in sorted(run.by_run):  # a run id starts with its UTC time
        measured: dict[str, dict[str, Record]] = defaultdict(dict)
        for rec in run.by_run[run_id].values():
            entry = catalog.BENCHMARKS.get(rec.benchmark)
            if entry and entry.kind == "distributed" and rec.ok and rec.timing("step", "wall"):
                measured[rec.params["variant"]][rec.params["world_size"]] = rec
        for variant, by_world in measured.items():
            if len(by_world) >= len(found.get(variant, {})):
                found[variant] = dict(sorted(by_world.items(), key=lambda kv: int(kv[0])))
    return found


def scaling_rows(by_variant: dict[str, tuple[Run, dict[str, Record]]]) -> list[list[str]]:
    """Rows of the scaling table: per variant and world size, ms per step (the slowest rank's
    median), the slowest rank's device busy ms per step, tokens/s per GPU, the scaling
    efficiency the run recorded (tokens/s per GPU over the variant's 1-GPU figure of the same run;
    n/a without one), the slowest rank's collectives per step, exposed / all
    (``optbench.measure.overlap``; n/a where not profiled, busy also where recorded before it was)
    and the commit."""
    rows = []
    for variant in sorted(by_variant, key=catalog.DISTRIBUTED.index):
        run, by_world = by_variant[variant]
        for world, rec in by_world.items():
            efficiency = rec.info.get("scaling_efficiency")
            ranks = rec.info.get("communication") or []
            comm = ranks[rec.info.get("slowest_rank") or 0] if ranks else None
            rows.append(
                [
                    variant,
                    world,
                    f"{step_ms(rec):.1f}",
                    f"{comm['busy_ms']:.1f}" if comm and "busy_ms" in comm else "n/a",
                    f"{tokens_per_s(rec):,.0f}",
                    "n/a" if efficiency is None else f"{efficiency:.1%}",
                    f"{comm['exposed_ms']:.1f} / {comm['communication_ms']:.1f}" if comm else "n/a",
                    f"`{run.commit[:8]}`",
                ]
            )
    return rows


def step_ms(rec: Record) -> float:
    """Median wall-clock ms per optimizer step."""
    return rec.timing("step", "wall").median_ms


def step_iqr_ms(rec: Record) -> float:
    """Interquartile range of the wall-clock ms per optimizer step within its run."""
    return rec.timing("step", "wall").iqr_ms


def step_reference(variant: str) -> str | None:
    """The variant a step variant is timed against (models.variants.reference); None where the
    variant is no longer defined (its reference unknown)."""
    return reference(variant) if variant == "eager" or variant in VARIANTS else None


def step_pairs(run: Run) -> dict[str, dict[str, tuple[Record, float | None]]]:
    """Each variant's step record and its speedup vs its own reference measured in the same run
    (reference median ms / variant median ms, wall clock; :meth:`Run.pair`: the variant's latest
    run, else the newest run of the commit that measured both) by size, then variant; the speedup
    None (n/a), beside the variant's latest record, where no run of the commit measured both or the
    reference is unknown. Variants that are their own reference (eager, qknorm) have no entry."""

    def paired(v: str, rec: Record) -> tuple[Record, float | None]:
        ref = step_reference(v)
        both = run.pair(rec, variant=ref) if ref is not None else None
        if both is None or not both[1].timing("step", "wall"):
            return rec, None
        mine, base = both
        return mine, step_ms(base) / step_ms(mine)

    found = {
        size: {v: paired(v, rec) for v, rec in by_v.items() if step_reference(v) != v}
        for size, by_v in steps(run).items()
    }
    return {size: pairs for size, pairs in found.items() if pairs}


def step_speedups(run: Run) -> dict[str, dict[str, float | None]]:
    """:func:`step_pairs`' speedups: by size, then variant, None (n/a) where no run of the commit
    measured the variant beside its reference."""
    return {size: {v: x for v, (_, x) in pairs.items()} for size, pairs in step_pairs(run).items()}


def vs_label(variant: str) -> str:
    """'<variant> vs <its reference>' ('vs ?' where the variant is no longer defined)."""
    return f"{variant} vs {step_reference(variant) or '?'}"


def named_speedups(run: Run) -> dict[str, dict[str, float]]:
    """step_speedups keyed '<variant> vs <reference>', NaN (no bar) for n/a."""
    return {
        size: {vs_label(v): math.nan if x is None else x for v, x in speedups.items()}
        for size, speedups in step_speedups(run).items()
    }


def ablation_rows(run: Run, by_variant: dict[str, Record]) -> list[list[str]]:
    """One size's leave-one-out table (ABLATION_HEADER): best-kernels, best-kernels without each
    switch (and what needs it), eager, then best-kernels with each switch of ADDED; ms per step as
    median [IQR]; worth = ms without / ms of best-kernels, and for an added switch ms of
    best-kernels / ms with it (either way >1: the switch helps), n/a where either was not measured
    or they come from different runs (``run``'s :meth:`Run.beside`)."""

    def row(variant: str, label: str, added: bool = False) -> list[str]:
        rec = by_variant.get(variant)
        if rec is None:
            return [label, "not measured", "n/a"]
        best = run.beside(rec, variant=ABLATED)
        ratio = (
            None
            if best is None or not best.timing("step", "wall")
            else step_ms(best) / step_ms(rec)
            if added
            else step_ms(rec) / step_ms(best)
        )
        worth = "—" if variant == ABLATED else f"{ratio:.2f}×" if ratio is not None else "n/a"
        return [label, f"{step_ms(rec):.1f} [{step_iqr_ms(rec):.1f}]", worth]

    return [
        row(ABLATED, f"{ABLATED} (every switch)"),
        *(row(v, ablation_note(v).removeprefix(f"{ABLATED} ")) for v in ABLATION),
        row("eager", "eager (no switch)"),
        *(row(v, added_note(v).removeprefix(f"{ABLATED} "), added=True) for v in ADDED),
    ]


ABLATION_HEADER = [
    "step",
    "ms per step [IQR]",
    f"worth inside {ABLATED} (ms without / ms of {ABLATED})",
]
ABLATION_CAPTION = (
    "wall clock, median ms per optimizer step [IQR], every row from one run; worth: the step "
    f"without the switch over {ABLATED}, >1× means the switch helps; eager's: all of them; a "
    f"'with' row: {ABLATED} over the step with that switch added (it changes the numerics on "
    "purpose: the convergence check judges it)"
)


def step_peaks(run: Run) -> dict[str, dict[str, float]]:
    """Peak extra device memory of one training step (above what was allocated before it), GiB, by
    size, then variant: 0 for a step that replays a CUDA graph, whose memory its capture
    allocated."""
    found = {
        size: {
            v: rec.peak_bytes("step") / GiB
            for v, rec in variants.items()
            if rec.peak_bytes("step") is not None
        }
        for size, variants in steps(run).items()
    }
    return {size: peaks for size, peaks in found.items() if peaks}


def peak_dtype(rec: Record) -> str:
    """Peak key of a record: info['precision'] ('bf16', ...), info['dtype'] ('torch.bfloat16'), else
    bf16."""
    from optbench.measure.hardware import DTYPES, dtype_name

    info = rec.info
    if info.get("precision") in DTYPES:
        return info["precision"]
    return dtype_name(info["dtype"]) if info.get("dtype") else "bf16"


def tokens_per_s(rec: Record) -> float | None:
    """Tokens per second of a training step (wall clock); None without info['tokens']."""
    tokens = rec.info.get("tokens")
    return tokens / (step_ms(rec) / 1e3) if tokens else None


def peak_profile(run: Run) -> HardwareProfile | None:
    """The profile whose peaks the run's times may be divided by (MFU, roofline): the run's own;
    None for an emulated run, whose times are the real GPU's and whose profile is the emulated
    card's."""
    return None if run.emulated else run.profile()


def mfu(rec: Record, profile: HardwareProfile | None) -> float | None:
    """Model FLOPs utilization of a step: flops['step'] / wall seconds / the profile's peak at its
    dtype."""
    from optbench.measure.roofline import Ceilings

    peak = Ceilings.from_profile(profile).peak(peak_dtype(rec)) if profile else None
    flops = rec.flops.get("step")
    return flops / (step_ms(rec) / 1e3) / (peak * 1e12) if peak and flops else None


def kernel_metric(rec: Record) -> str:
    """'fwdbwd' where the kernel has a backward, else 'fwd'."""
    return "fwdbwd" if "fwdbwd" in rec.metrics else "fwd"


def kernels(run: Run) -> dict[tuple[str, str], dict[str, Record]]:
    """ok kernel records with a device time measured with a cold L2 (``info.device_clock``; older
    records timed warm-L2 replays and, in full grids, a torch.compile baseline compiled for another
    shape), by (op, shape) and implementation."""
    found: dict[tuple[str, str], dict[str, Record]] = defaultdict(dict)
    for rec in run.records.values():
        if (
            catalog.kind(rec.benchmark) == "kernel"
            and rec.ok
            and rec.info.get("device_clock") == DEVICE_CLOCK
            and rec.timing(kernel_metric(rec), "device")
        ):
            op = rec.benchmark.split(".", 1)[1]
            found[op, rec.params["shape"]][rec.params["impl"]] = rec
    return dict(found)


def _device_ms(rec: Record, metric: str) -> float:
    return rec.timing(metric, "device").median_ms


def kernel_speedups(run: Run) -> dict[str, dict[str, list[float]]]:
    """Per op and implementation, speedups vs the op's baseline (eager, or loop) over shapes (device
    time)."""
    found: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (op, _), impls in kernels(run).items():
        baseline = catalog.KERNELS[
            catalog.benchmark(next(iter(impls.values())).benchmark).op
        ].impls[0]
        for impl, rec in impls.items():
            metric = kernel_metric(rec)
            base = run.beside(rec, impl=baseline)
            if impl != baseline and base is not None and base.timing(metric, "device"):
                found[op][impl].append(_device_ms(base, metric) / _device_ms(rec, metric))
    return {op: dict(impls) for op, impls in found.items()}


@dataclass(frozen=True)
class FloorRatio:
    """One kernel case's device time / its roofline floor: with a cold L2 (clock ``device``) and a
    warm one (``device_warm``; None where not stored), and whether one input set fits in the L2
    (None: not recorded)."""

    cold: float
    warm: float | None
    fits_l2: bool | None

    @property
    def suspect(self) -> bool:
        """A cold time at or below the floor: a measurement problem, not a speed."""
        from optbench.measure.roofline import below_floor

        return below_floor(self.cold)


def floor_ratios(run: Run) -> dict[str, dict[str, dict[str, FloorRatio]]]:
    """Time / roofline floor by 'op metric', shape and implementation ({} without known ceilings,
    and for an emulated run: :func:`peak_profile`)."""
    from optbench.measure.roofline import Ceilings, floor_ms

    profile = peak_profile(run)
    if profile is None:
        return {}
    ceilings = Ceilings.from_profile(profile)
    found: dict[str, dict[str, dict[str, FloorRatio]]] = defaultdict(lambda: defaultdict(dict))
    for (op, shape), impls in kernels(run).items():
        for impl, rec in impls.items():
            for metric in rec.metrics:
                flops, moved = rec.flops.get(metric), rec.bytes_moved.get(metric)
                if flops is None or moved is None or not rec.timing(metric, "device"):
                    continue
                floor = floor_ms(flops, moved, ceilings, peak_dtype(rec))
                if floor:
                    warm = rec.timing(metric, "device_warm")
                    found[f"{op} {metric}"][shape][impl] = FloorRatio(
                        _device_ms(rec, metric) / floor,
                        warm.median_ms / floor if warm else None,
                        rec.info.get("fits_l2"),
                    )
    return {panel: dict(shapes) for panel, shapes in found.items()}


def _entries(value: dict) -> int:
    """Measured entries of a value: its items, or the items of its items (implementations x
    shapes); an item that is None or NaN (a speedup whose reference that run did not measure) is
    none."""

    def measured(v: Any) -> int:
        if isinstance(v, (dict, list)):
            return len(v)
        return int(v is not None and not (isinstance(v, float) and math.isnan(v)))

    return sum(measured(v) for v in value.values())


def fullest(history: list[Run], extract: Callable[[Run], dict]) -> dict[str, tuple[Run, dict]]:
    """Each key that extract gives for some run (history is oldest first), with the run whose value
    for it has the most entries (:func:`_entries`), the newest of those, and that value."""
    found: dict[str, tuple[Run, dict]] = {}
    for run in history:
        for key, value in extract(run).items():
            if key not in found or _entries(value) >= _entries(found[key][1]):
                found[key] = (run, value)
    return found


def at_commit(key: str, run: Run) -> str:
    """'<key> @ <the run's commit, 8 hex digits>'."""
    return f"{key} @ {run.commit[:8]}"


def by_size(found: dict[str, tuple[Run, object]]) -> list[tuple[str, Run, object]]:
    """(size, run, value) of :func:`fullest`'s result, smallest size first."""
    return [(size, *found[size]) for size in sorted(found, key=size_order)]


def anchor_steps(run: Run) -> dict[str, Record]:
    """ok HF anchor records (optbench.suite.anchors) with a wall time, by size."""
    return anchor_records(run.records.values())


def anchor_records(records: Iterable[Record]) -> dict[str, Record]:
    """:func:`anchor_steps` of any ``records`` (one optbench run's, say)."""
    return {
        rec.params["size"]: rec
        for rec in records
        if rec.benchmark == ANCHOR_BENCHMARK and rec.ok and rec.timing("step", "wall")
    }


def run_of(rec: Record) -> str:
    """The optbench run of a record: its run id, else (records from before run ids) its date."""
    return rec.run or rec.date


def run_gpu(records: Mapping[str, Record]) -> str:
    """The first 8 hex digits of the GPU's UUID that one optbench run's ``records`` (its machine
    record's) name, as NOTES.md names GPUs; '' where the run recorded none."""
    machine = records.get(MACHINE_KEY)
    return str(machine.info.get("gpu_uuid") or "")[4:12] if machine else ""


def run_cells(run: str, commit: str, gpu: str) -> list[str]:
    """A table row's cells naming where its figures come from: the run id's last 6 characters, the
    commit's first 8, the GPU's (:func:`run_gpu`; 'n/a' where none)."""
    return [run[-6:], commit[:8], gpu or "n/a"]


def runs_at_once(run: Run, records: Iterable[Record]) -> int:
    """The most runs that measured on the host at once (their machine records' ``runs_at_once``)
    among the optbench runs of ``records``: over 1 where shards of ``run --gpus`` shared its CPUs,
    which host-bound steps feel."""
    infos = (run.by_run.get(run_of(rec), {}).get(MACHINE_KEY) for rec in records)
    return max((at_once(i.info) for i in infos if i is not None), default=1)


def hf_ratio(run: Run, size: str) -> tuple[float, str, str] | None:
    """(x HF, our variant, where) at ``size`` in ``run``: the HF anchor's median wall ms per step
    over that of our fastest variant; where: 'same run' where both records come from one optbench
    run, else 'another run, same day' or 'another run of the commit'. None where ``run`` has no
    anchor or none of our steps at ``size``."""
    anchor, ours = anchor_steps(run).get(size), steps(run).get(size, {})
    if anchor is None or not ours:
        return None
    variant = min(ours, key=lambda v: step_ms(ours[v]))
    rec = ours[variant]
    beside = run.by_run.get(run_of(rec), {}).get(record_key(ANCHOR_BENCHMARK, {"size": size}))
    if beside is not None and beside.ok and beside.timing("step", "wall"):
        anchor = beside  # the anchor of our variant's run, where it ran one (a shard)
    where = (
        "same run"
        if run_of(rec) == run_of(anchor)
        else "another run, same day"
        if rec.date[:10] == anchor.date[:10]
        else "another run of the commit"
    )
    return step_ms(anchor) / step_ms(rec), variant, where


@dataclass(frozen=True)
class RunTime:
    """One run's timing of a metric: the median and quartiles of its samples, ms per call, and the
    unit it ran on (:func:`optbench.gate.changepoints.unit_of`: its GPU; None for a GPU that
    recorded no UUID)."""

    run: str
    median_ms: float
    q25_ms: float
    q75_ms: float
    unit: str | None = None


@dataclass(frozen=True)
class CommitTimes:
    """A metric's runs at one commit, and the gate's verdict (:func:`optbench.gate.compare.verdict`:
    'REGRESSION', 'improvement', '... (not gated)'; '' for none) with its head/base ratio, on the
    change from the machine's previous commit to this one on one GPU; ``cross_gpu``: whether that
    change, measured on different GPUs only, went beyond the metric's threshold (a difference
    between GPUs: counted, never a verdict)."""

    commit: str
    runs: tuple[RunTime, ...]
    verdict: str = ""
    ratio: float | None = None
    cross_gpu: bool = False


@dataclass(frozen=True)
class TimeHistory:
    """One record's metric by one clock (a clock by method:
    :func:`optbench.gate.compare.series_clock`) over the commits that measured it, oldest first, and
    its change points (:func:`optbench.gate.changepoints.change_points` of :meth:`unit_runs`)."""

    key: str
    metric: str
    clock: str
    commits: tuple[CommitTimes, ...]
    change_points: tuple[ChangePoint, ...] = ()

    @property
    def benchmark(self) -> str:
        return self.key.split("|")[0]

    @property
    def label(self) -> str:
        """'<params> <metric> (<clock>)', e.g. 'shape=8192x768 impl=triton fwd (device)'."""
        return " ".join([*self.key.split("|")[1:], self.metric, f"({self.clock})"])

    @property
    def flagged(self) -> tuple[CommitTimes, ...]:
        """The commits with a verdict."""
        return tuple(c for c in self.commits if c.verdict)

    @property
    def cross_gpu(self) -> int:
        """How many commits differ from the previous one beyond the threshold across GPUs only."""
        return sum(c.cross_gpu for c in self.commits)

    def unit_runs(self) -> list[tuple[str, list[RunMedian]]]:
        """(commit, run medians with their unit) in commit order, without the runs of no known
        unit: the input of :func:`optbench.gate.changepoints.change_points`."""
        return [
            (c.commit, [RunMedian(r.unit, r.median_ms) for r in c.runs if r.unit is not None])
            for c in self.commits
        ]

    def searched_units(self) -> int:
        """How many units (GPUs) measured this metric at enough commits to be searched for change
        points."""
        series = unit_series(self.unit_runs())
        return sum(len(commits) >= MIN_COMMITS for commits in series.values())


def time_histories(
    store: ResultStore,
    machine: str,
    min_commits: int = 2,
    threshold: float | None = None,
    cache: ReportCache | None = None,
) -> list[TimeHistory]:
    """Each ok record's metrics on ``machine`` by the record's primary clock (wall where that has no
    timing), with every run's median and quartiles per commit and the unit it ran on, in the store's
    commit order (by the date of each commit's first run); only metrics measured at ``min_commits``
    commits or more. Verdicts: :func:`optbench.gate.compare.compare_runs` of each commit's runs
    against the previous commit's, with the noise of every run of the machine and ``threshold``, on
    time metrics only (a status change is no time); a change beyond the threshold between different
    GPUs is no verdict, only marked ``cross_gpu``. Change points:
    :func:`optbench.gate.changepoints.change_points` of each metric's runs, each GPU on its own,
    each search kept in ``cache`` by its input."""
    commits = store.commits(machine)
    found: dict[tuple[str, str, str], dict[str, list[RunTime]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for commit in commits:
        for run in store.runs(machine, commit):
            unit = unit_of(run.info, machine)
            for key, data in run.results().items():
                rec = Record.of(data)
                if not rec.ok or rec.ab_design:  # ab's own designs: not this trend's
                    continue
                for metric in rec.metrics:
                    clock = rec.primary_clock if rec.timing(metric, rec.primary_clock) else "wall"
                    t = rec.timing(metric, clock)
                    if t is not None:
                        found[key, metric, series_clock(rec, clock)][commit].append(
                            RunTime(run.run_id, t.median_ms, t.q25_ms, t.q75_ms, unit)
                        )
    kept = {
        series: by_commit for series, by_commit in found.items() if len(by_commit) >= min_commits
    }
    if not kept:
        return []
    noise = NoiseModel.of(store.machine_runs(machine))
    verdicts: dict[tuple[str, str, str, str], tuple[str, float | None, bool]] = {}
    for base, head in zip(commits, commits[1:]):
        for c in compare_runs(
            store.runs(machine, base), store.runs(machine, head), noise, threshold
        ):
            # the gate's verdicts and cross-GPU moves; not a trend it reports without gating
            if c.quantity == "time" and c.significant and (c.gated or c.reason == CROSS_GPU):
                cross = c.reason == CROSS_GPU
                verdicts[c.key, c.metric, c.clock, head] = (
                    "" if cross else verdict(c),
                    c.ratio,
                    cross,
                )
    histories = []
    for series, by_commit in kept.items():
        history = TimeHistory(
            *series,
            tuple(
                CommitTimes(commit, tuple(times), *verdicts.get((*series, commit), ("", None)))
                for commit, times in by_commit.items()
            ),
        )
        histories.append(
            dataclasses.replace(history, change_points=_change_points(history.unit_runs(), cache))
        )
    return histories


def _change_points(
    series: list[tuple[str, list[RunMedian]]], cache: ReportCache | None
) -> tuple[ChangePoint, ...]:
    """:func:`optbench.gate.changepoints.change_points` of ``series``, kept in ``cache`` (JSON)."""

    def search() -> bytes:
        return json.dumps([dataclasses.asdict(p) for p in change_points(series)]).encode()

    found = (cache or ReportCache(None)).make(ReportCache.key("change points", series), search)
    return tuple(ChangePoint(**p) for p in json.loads(found))
