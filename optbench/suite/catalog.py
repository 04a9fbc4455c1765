"""Everything optbench measures, in one place: plain data, importable without torch.

- :data:`KERNELS`: each kernel op with its shapes (those of the 100M/500M/1B configs, tokens = batch
  8 x sequence 1024), its implementations (the first is the baseline), the shape the full suite
  measures (the 1B config's) and whether the quick suite measures it there too.
- :data:`STEP_GRIDS`: which training-step variants (``models.variants``) each step grid measures.
- :data:`CONVERGENCE`: which variants the convergence check (``optbench.suite.convergence``) trains.
- :data:`BENCHMARKS`: every asv benchmark (name, kind, parameters per suite, metrics), built from
  the two above.
- :data:`SUITES`: which benchmarks ``optbench run --suite S`` runs; :data:`METRICS`: what each
  metric measures.

asv's classes (``benchmarks/``), the pytest-benchmark twin, the plan, the report and the CLI read
this module; ``tests/test_catalog.py`` fails where any of them names a benchmark this catalog lacks,
and where an asv class and its entry differ. What to touch to add a kernel benchmark, a step variant
or a suite: docs/architecture.md.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from models.variants import (
    ABLATED,
    ABLATION,
    ADDED,
    GRAPHED_COMPILE_MODES,
    VARIANTS,
    reference,
    switches,
)
from optbench.store.records import CASE_PEAK, CASE_RESIDENT, EARLIER_METER

#: metric -> what it measures and in what unit. Times are ms per call (kernels) or per optimizer
#: step; every kernel time has three clocks: ``device`` (CUDA-graph replays over input sets larger
#: than the L2: a cold L2), ``device_warm`` (one input set back-to-back) and ``wall`` (synchronized
#: host time, reported, not gated).
METRICS: dict[str, str] = {
    "fwd": "forward call, ms",
    "fwdbwd": "forward + backward call, ms; peak extra device memory, MiB",
    "step": "one optimizer step (forward, loss, backward, clip, optimizer), ms: wall (primary) "
    "and device; peak device memory, MiB",
    "forward": "forward + loss, wall ms",
    "mm": "one N^3 matrix product, device ms",
    "compile": "a training step's compile: torch.compile's seconds in its case's build and check "
    "(dynamo, AOTAutograd, inductor, autotuning), with the compile caches its run "
    "started from (the machine record's info.compile_cache: cold, restored, local or prewarmed); "
    "0 for a step that compiles nothing",
    "cpu": "one call on the CPU, s (asv's own timer)",
    "loss": "convergence: training loss over the last tenth of the steps, nats; the curve's "
    "largest deviation from the eager seeds' mean curve, nats, and that over its tolerance",
}
SUITE_NAMES = ("cpu", "quick", "full", "sweep", "ablation", "convergence", "multigpu")
#: What each suite is for, and what it costs (goals on one H100, cold caches).
SUITE_DOCS: dict[str, str] = {
    "cpu": "the tiny config and the CPU classes: what a machine without a GPU runs",
    "quick": "every commit, at most 3 minutes: best-kernels and each of its switches alone at "
    "100M; four kernel ops at their 1B shapes; the matmul ceilings",
    "full": "every commit, at most 10 minutes: at 100M every switch against its reference, four "
    "best combinations, torch.compile whole and regional, FP8; eager, best-regional and "
    "best-kernels at 1B; every kernel op at its 1B shape; the precision modes; the matmul "
    "ceilings",
    "sweep": "the whole matrix: every variant at 100M, 500M and 1B, every kernel shape, every "
    "compile mode (max-autotune too), the HF + torch.compile anchor at each size; about "
    "45 minutes on an H100, run in parts: optbench run --suite sweep --skip-existing "
    "--time-budget S, until nothing is left",
    "ablation": "best-kernels with each of its switches left out in turn, at each size",
    "convergence": "a few hundred steps of training of the variants that change the numerics on "
    "purpose",
    "multigpu": "DDP and FSDP2 at 1, 2 and 4 GPUs of one host",
}


@dataclass(frozen=True)
class KernelOp:
    """A kernel op: ``shapes`` label -> dimensions, ``impls`` (baseline first), the shape of the 1B
    config (the one the full suite measures) and whether the quick suite measures it."""

    name: str
    benchmark: str  # asv class in benchmarks/bench_kernels.py
    shapes: dict[str, dict[str, int]]
    impls: tuple[str, ...]
    shape_1b: str
    quick: bool = False  # in the quick suite too (at shape_1b)
    backward: bool = True  # measured forward+backward too (fwdbwd), not only forward


def _labelled(
    fmt: str, keys: tuple[str, ...], rows: list[tuple[int, ...]]
) -> dict[str, dict[str, int]]:
    return {fmt.format(*row): dict(zip(keys, row)) for row in rows}


_HEADS = ("tokens", "q_heads", "kv_heads", "head_dim")
# 100M, 500M, 1B (B=8, S=1024)
_ATTENTION = [(8192, 12, 4, 64), (8192, 16, 4, 96), (8192, 32, 4, 64)]

KERNELS: dict[str, KernelOp] = {
    op.name: op
    for op in [
        KernelOp(
            "rmsnorm",
            "bench_kernels.RMSNorm",
            _labelled(
                "{}x{}",
                ("rows", "hidden"),
                [
                    (8192, 768),
                    (8192, 1536),
                    (8192, 2048),
                    (16384, 768),
                    (16384, 2048),
                    (16384, 4096),
                ],
            ),
            ("eager", "compile", "liger", "triton"),
            "8192x2048",
        ),
        # The residual add and the norm after it: x fp32 (the stream), y in the op's dtype.
        KernelOp(
            "add_rmsnorm",
            "bench_kernels.AddRMSNorm",
            _labelled("{}x{}", ("rows", "hidden"), [(8192, 768), (8192, 1536), (8192, 2048)]),
            ("eager", "compile", "triton"),
            "8192x2048",
            quick=True,
        ),
        KernelOp(
            "swiglu",
            "bench_kernels.SwiGLU",
            _labelled(
                "{}x{}",
                ("rows", "inter"),
                [(8192, 2048), (8192, 4096), (8192, 5632), (8192, 14336)],
            ),
            ("eager", "compile", "liger", "triton"),
            "8192x5632",
            quick=True,
        ),
        KernelOp(
            "qknorm",
            "bench_kernels.QKNorm",
            _labelled("{}x{}+{}x{}", _HEADS, _ATTENTION),
            ("eager", "compile", "triton"),
            "8192x32+4x64",
        ),
        # RoPE of the packed q/k/v projection.
        KernelOp(
            "qkv_rope",
            "bench_kernels.QKVRope",
            _labelled("{}x{}+{}x{}", _HEADS, _ATTENTION),
            ("eager", "compile", "triton"),
            "8192x32+4x64",
            quick=True,
        ),
        KernelOp(
            "linear_ce",
            "bench_kernels.LinearCrossEntropy",
            _labelled(
                "{}x{}x{}",
                ("tokens", "hidden", "vocab"),
                [
                    (8192, 768, 32000),
                    (8192, 1536, 32000),
                    (8192, 2048, 32000),
                    (8192, 2048, 128256),
                ],
            ),
            ("eager", "compile", "chunked", "triton-ce", "triton", "liger-ce", "liger"),
            "8192x2048x32000",
            quick=True,
        ),
        KernelOp(
            "grad_stats",
            "bench_kernels.GradStats",
            {"100M": {"size_m": 100}, "500M": {"size_m": 500}, "1B": {"size_m": 1000}},
            ("loop", "foreach"),
            "1B",
            backward=False,
        ),
    ]
}

# The single switches, each reference that is not eager right before the switches measured against
# it.
SWITCHES = [
    "triton-norm",
    "liger-norm",
    "triton-swiglu",
    "liger-swiglu",
    "qknorm",
    "triton-qknorm",
    "chunked-ce",
    "fused-ce",
    "liger-flce",
    "checkpoint",
    "foreach-stats",
    "foreach-adamw",
    "fused-adamw",
    "adamw-8bit",
    "master-adamw",
    "no-item-sync",
    "cached-mask",
    "sdpa-causal",
    "fused-proj",
    "triton-rope",
    "graph-prereqs",
    "cuda-graph",
]
# 'best' last: a lost CUDA context ends its grid.
BEST = [
    "best-inductor",
    "best-graph",
    "best-compile-graph",
    "best-master",
    "best-fused",
    "best-kernels",
    "best-regional",
    "best",
]
# The max-autotune modes last: their autotuning can take minutes on a cold cache.
COMPILE_MODES = [
    "compile-default",
    "compile-regional",
    "compile-reduce-overhead",
    "compile-max-autotune",
    "compile-max-autotune-no-cudagraphs",
]
# FP8 matmuls (torchao's float8 training and ours), at the end of a grid: new, and a lost CUDA
# context ends its grid.
FP8 = [
    "fp8-tensorwise",
    "fp8-rowwise",
    "best-kernels-fp8-tensorwise",
    "best-kernels-fp8-rowwise",
    "best-kernels-fp8-tensorwise-fast-accum",
    "best-kernels-fp8-triton",
]

STEP_GRIDS: dict[str, list[str]] = {
    # What a CPU runs (Triton through the interpreter is too slow for a timed step).
    "tiny": [
        "eager",
        "chunked-ce",
        "checkpoint",
        "foreach-stats",
        "foreach-adamw",
        "no-item-sync",
        "cached-mask",
        "sdpa-causal",
        "fused-proj",
    ],
    # The quick suite: best-kernels and each of its switches alone (with cuda-graph's reference).
    # best-kernels compiles the model (around our kernels); the other whole-model and regional
    # compiles are the full suite's: each costs 20-40 s of cold compile at 100M.
    "quick": [
        "eager",
        "triton-norm",
        "triton-swiglu",
        "fused-ce",
        "foreach-stats",
        "fused-adamw",
        "master-adamw",
        "no-item-sync",
        "sdpa-causal",
        "fused-proj",
        "graph-prereqs",
        "cuda-graph",
        "best-kernels",
    ],
    # The full suite at 100M: every switch against its reference, the best combinations with the
    # fewest compiles, torch.compile whole and regional, torchao's FP8. A whole-model compile costs
    # 20-45 s cold, each: the rest of BEST, the other compile modes and the FP8 combinations are the
    # sweep's.
    "full100M": [
        "eager",
        *SWITCHES,
        "best-graph",
        "best-regional",
        "best-compile-graph",
        "best-kernels",
        "compile-default",
        "compile-regional",
        "fp8-tensorwise",
        "fp8-rowwise",
    ],
    # The full suite at 1B: where the step is device-bound, eager and our two cheapest-to-compile
    # best steps.
    "full1B": ["eager", "best-regional", "best-kernels"],
    "100M": ["eager", *SWITCHES, *BEST, *COMPILE_MODES, *FP8],
    "500M": ["eager", *SWITCHES, "compile-default", "compile-regional", *BEST, *FP8],
    "1B": ["eager", *SWITCHES, "compile-default", "compile-regional", *BEST, *FP8],
    # fp32 with TF32 off/on, bf16 autocast (the baseline), fp16 autocast + GradScaler.
    "precision": ["fp32", "tf32", "eager", "fp16-scaler"],
    # best-kernels, each of its switches left out in turn (models.variants.ABLATION), and eager;
    # last, FP8 added to it (models.variants.ADDED: new, and a lost CUDA context ends a grid).
    "ablation": ["eager", ABLATED, *ABLATION, *ADDED],
}
# The convergence check: eager (its seeds give the tolerance), every variant that changes the
# numerics on purpose (models.variants.numerics), and best-kernels, an exact one that must pass too.
CONVERGENCE = [
    "eager",
    "adamw-8bit",
    "master-adamw",
    "fp8-tensorwise",
    "fp8-rowwise",
    "best-kernels",
    "best-kernels-fp8-tensorwise",
    "best-kernels-fp8-rowwise",
    "best-kernels-fp8-tensorwise-fast-accum",
    "best-kernels-fp8-triton",
]
# Multi-GPU training steps (optbench.suite.distributed): DDP and FSDP2 over the eager step and over
# 'best' (no CUDA graphs), each at 1, 2 and 4 GPUs of one host; the multigpu suite only. Each
# variant -> (its wrapper, the single-GPU step variant of models.variants it wraps; compiled per
# block: optbench.suite.distributed).
DISTRIBUTED_VARIANTS: dict[str, tuple[str, str]] = {
    "ddp": ("ddp", "eager"),
    "fsdp2": ("fsdp2", "eager"),
    "ddp-best": ("ddp", "best"),
    "fsdp2-best": ("fsdp2", "best"),
    "ddp-best-kernels": ("ddp", "best-kernels"),
}
DISTRIBUTED = list(DISTRIBUTED_VARIANTS)
WORLD_SIZES = ["1", "2", "4"]
ANCHOR_SIZES = ["100M", "500M", "1B"]  # HF + torch.compile step sizes
MATMUL_N, MATMUL_MODES = "8192", ["fp32", "tf32", "bf16", "fp16"]


@dataclass(frozen=True)
class Benchmark:
    """One asv benchmark: ``params`` per suite it belongs to (asv's ``params``, one list per
    ``param_names``)."""

    name: str  # '<module>.<class>' as asv names it, without the track method
    kind: str  # 'kernel', 'step', 'anchor', 'matmul', 'cpu', 'convergence' or 'distributed'
    param_names: tuple[str, ...]
    params: dict[str, list[list[str]]]  # suite -> asv params
    metrics: tuple[str, ...]
    op: str | None = None  # kernel op (KERNELS)
    size: str | None = None  # model size (models.config.CONFIGS) of a step or anchor
    role: str = ""  # of a step: 'variants' (a size's variant grid), 'ablation' or 'precision'
    doc: str = field(default="", compare=False)

    def cases(self, suite: str) -> list[dict[str, str]]:
        """Every parameter combination of this benchmark in ``suite`` (none where it is not in
        it)."""
        grid = self.params.get(suite, [])
        return (
            [dict(zip(self.param_names, combo)) for combo in itertools.product(*grid)]
            if grid
            else []
        )

    def grid(self, suite: str) -> list[list[str]]:
        """The parameter grid ``suite`` measures (none where the benchmark is not in it)."""
        return self.params.get(suite, [])

    def asv_params(self) -> list[list[str]]:
        """asv's ``params``: per parameter, every value of every suite (the widest suite's first,
        in its order). One grid whatever the suite, so that asv's list of benchmarks
        (``results/asv/benchmarks.json``) is the same for every run on every machine; a run skips
        the combinations its suite does not measure."""
        widest = sorted(self.params.values(), key=lambda g: math.prod(map(len, g)))
        return [
            list(dict.fromkeys(v for g in reversed(widest) for v in g[axis]))
            for axis in range(len(self.param_names))
        ]


def _kernel(op: KernelOp) -> Benchmark:
    one = [[op.shape_1b], list(op.impls)]
    params = {
        "full": one,
        "sweep": [list(op.shapes), list(op.impls)],
        **({"quick": one} if op.quick else {}),
    }
    return Benchmark(
        op.benchmark,
        "kernel",
        ("shape", "impl"),
        params,
        ("fwd", "fwdbwd") if op.backward else ("fwd",),
        op=op.name,
    )


def _step(
    name: str, size: str, suites: dict[str, str], role: str = "variants", doc: str = ""
) -> Benchmark:
    return Benchmark(
        name,
        "step",
        ("variant",),
        {s: [STEP_GRIDS[g]] for s, g in suites.items()},
        ("step", "forward"),
        size=size,
        role=role,
        doc=doc,
    )


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in [
        *(_kernel(op) for op in KERNELS.values()),
        # The anchors before our steps: a run cut by its time budget keeps the reference its
        # speedups divide by.
        Benchmark(
            "bench_anchors.HFCompileStep",
            "anchor",
            ("size",),
            {"sweep": [ANCHOR_SIZES]},
            ("step", "forward"),
            doc="HF Llama + torch.compile, fused AdamW, bf16 autocast",
        ),
        _step(
            "bench_step.StepTiny",
            "tiny",
            {"cpu": "tiny"},
            doc="the tiny config (B=2, S=128): what a CPU runs",
        ),
        _step(
            "bench_step.Step100M", "100M", {"full": "full100M", "sweep": "100M", "quick": "quick"}
        ),
        # Right after Step100M: its grid reuses the 100M reference (optbench.suite.workloads), and a
        # run cut by its time budget loses the larger sizes' cases first.
        _step(
            "bench_precision.Step100M",
            "100M",
            {"full": "precision", "sweep": "precision"},
            "precision",
            "precision modes of the 100M step",
        ),
        _step("bench_step.Step500M", "500M", {"sweep": "500M"}),
        _step("bench_step.Step1B", "1B", {"full": "full1B", "sweep": "1B"}),
        *(
            _step(
                f"bench_step.Ablation{size}",
                size,
                {"ablation": "ablation"},
                "ablation",
                f"leave-one-out of {ABLATED}",
            )
            for size in ("100M", "500M", "1B")
        ),
        Benchmark(
            "bench_precision.Matmul",
            "matmul",
            ("n", "mode"),
            {s: [[MATMUL_N], MATMUL_MODES] for s in ("full", "sweep", "quick")},
            ("mm",),
        ),
        Benchmark(
            "bench_convergence.Convergence100M",
            "convergence",
            ("variant",),
            {"convergence": [CONVERGENCE]},
            ("loss",),
            size="100M",
            doc="loss curves of a few hundred steps on a synthetic language against "
            "the spread of eager seeds",
        ),
        Benchmark(
            "bench_distributed.DistributedStep1B",
            "distributed",
            ("variant", "world_size"),
            {"multigpu": [DISTRIBUTED, WORLD_SIZES]},
            ("step",),
            size="1B",
            doc="the 1B step under torchrun: DDP or FSDP2 (fully_shard), per rank; the slowest "
            "rank's figure",
        ),
        Benchmark("bench_cpu.MLP", "cpu", ("impl",), {"cpu": [["eager", "compile"]]}, ("cpu",)),
        Benchmark(
            "bench_cpu.GradStats", "cpu", ("impl",), {"cpu": [["loop", "foreach"]]}, ("cpu",)
        ),
    ]
}
ANCHOR_BENCHMARK = "bench_anchors.HFCompileStep"
SUITES: dict[str, list[str]] = {
    s: [b.name for b in BENCHMARKS.values() if s in b.params] for s in SUITE_NAMES
}


def benchmark(name: str) -> Benchmark:
    """The catalog entry of an asv benchmark name ('bench_kernels.RMSNorm'); KeyError if it has
    none."""
    return BENCHMARKS[name]


def kind(name: str) -> str | None:
    """'kernel', 'step', 'anchor', 'matmul', 'cpu', 'convergence' or 'distributed' of a benchmark
    name; None if the catalog lacks it."""
    entry = BENCHMARKS.get(name)
    return entry.kind if entry else None


def references(benchmark: str, params: Mapping[str, str]) -> list[dict[str, str]]:
    """The parameters of the cases of ``benchmark`` that a report sets this case beside, each
    measured in the same run (on the same GPU): a step variant's reference
    (``models.variants.reference``; in the leave-one-out grid, best-kernels), a kernel's baseline
    implementation (its op's first), a distributed variant's 1-GPU case. None of its own reference,
    nor of other kinds."""
    entry = BENCHMARKS.get(benchmark)
    if entry is None:
        return []
    if entry.kind == "kernel":
        wanted = [{"impl": KERNELS[entry.op].impls[0]}]
    elif entry.kind == "distributed":
        wanted = [{"world_size": WORLD_SIZES[0]}]
    elif entry.kind == "step" and entry.role == "ablation":
        wanted = [{"variant": ABLATED}]
    elif entry.kind == "step" and params.get("variant") in (*VARIANTS, "eager"):
        wanted = [{"variant": reference(params["variant"])}]
    else:
        wanted = []
    found: list[dict[str, str]] = []
    for change in wanted:
        case = {**params, **change}
        if case != dict(params) and case not in found:
            found.append(case)
    return found


def with_references(keys: Iterable[str], among: Iterable[str]) -> list[str]:
    """The record keys of ``among`` that are in ``keys`` or a reference of one of them
    (:func:`references`, followed down its chain: cuda-graph's graph-prereqs, then eager), in the
    order of ``among``: what a run that measures ``keys`` measures, so that each of their speedups
    divides two times of one run, on one GPU (a shard of a suite, a run resumed with
    ``--skip-existing``)."""
    from optbench.store.store import record_key, split_key

    wanted, new = set(keys), set(keys)
    while new:
        found = {
            record_key(benchmark, case)
            for benchmark, params in map(split_key, new)
            for case in references(benchmark, params)
        }
        new = found - wanted
        wanted |= new
    return [k for k in among if k in wanted]


def suite_cases(suite: str) -> list[tuple[str, dict[str, str]]]:
    """(benchmark, params) of every case ``optbench run --suite suite`` runs, in the catalog's
    order."""
    return [(b.name, params) for b in BENCHMARKS.values() for params in b.cases(suite)]


def measured_combos(name: str, suite: str, select: str | None = None) -> list[tuple[str, ...]]:
    """The combinations of benchmark ``name``'s parameters (values in its ``param_names``' order)
    that ``optbench run --suite suite`` measures: its cases in ``suite``, with ``select`` (a regex)
    those whose record key it matches."""
    from optbench.store.store import record_key

    entry = BENCHMARKS[name]
    return [
        tuple(params[p] for p in entry.param_names)
        for params in entry.cases(suite)
        if not select or re.search(select, record_key(name, params))
    ]


def asv_pattern(suite: str, select: str | None = None) -> str:
    """asv's ``--bench`` regex selecting what ``optbench run --suite suite`` measures: every method
    of each benchmark of ``suite``, for the combinations of its parameters the run measures
    (:func:`measured_combos`).

    asv matches a parameterized benchmark's combinations by ``<name>.<method>(<values' reprs>)``,
    and starts a process for each one it matches and each method, where the benchmark's
    ``skip_params`` then skip those left out (``benchmarks/common.py``): naming only the measured
    combinations spares those processes (the full suite's grids hold three times the combinations
    it measures). Where nothing is selected, a regex that matches nothing."""
    alternatives = [
        re.escape(name)
        + r"\.\w+\(("
        + "|".join(re.escape(", ".join(map(repr, combo))) for combo in combos)
        + r")\)$"
        for name in SUITES[suite]
        if (combos := measured_combos(name, suite, select))
    ]
    return "^(" + "|".join(alternatives) + ")" if alternatives else "(?!)"


def selected_benchmarks(suite: str, select: str | None = None) -> list[str]:
    """The benchmarks of ``suite`` with a case whose record key ``select`` (a regex) matches; all of
    them without ``select``."""
    return [name for name in SUITES[suite] if measured_combos(name, suite, select)]


#: The cases ``optbench ab`` measures by default (a regex on case keys, in the full suite): a kernel
#: with its eager baseline at its 1B shape, and the device-bound best-kernels steps at 100M and 1B,
#: about a minute a round on an H100 (a pull request's gate: 4 judged rounds a side in under 10
#: minutes).
GATE_SELECT = (
    r"^bench_kernels\.SwiGLU\|shape=8192x5632\|impl=(eager|triton)$"
    r"|^bench_step\.Step(100M|1B)\|variant=best-kernels$"
)
GATE_SUITE = "full"

#: The regression gate's threshold per metric class: the smallest relative growth of head over base
#: that fails a commit. Device-bound times (kernel device times, the matmul, CUDA-graphed steps,
#: steps at 1B) move by well under 1% between processes of one GPU, so 3% is a change; host-bound
#: steps (launch-bound eager steps at 100M and 500M, their forward) move by several percent between
#: processes, so 10%; peak memory is deterministic: any growth over 1%; compile time 15% (the rule
#: PyTorch's HUD applies to compilation latency).
GATE_THRESHOLDS: dict[str, float] = {
    "device-bound": 0.03,
    "host-bound": 0.10,
    "memory": 0.01,
    "compile": 0.15,
}


def graphed(variant: str) -> bool:
    """Whether a step variant replays CUDA graphs (its own capture, or a compile mode that
    captures): the host no longer sets its pace."""
    if variant not in VARIANTS and variant != "eager":
        return False
    options = switches(variant)
    return bool(options.get("cuda_graph")) or options.get("compile") in GRAPHED_COMPILE_MODES


def metric_class(
    benchmark: str,
    params: Mapping[str, str],
    quantity: str,
    clock: str | None = None,
    metric: str = "",
) -> str | None:
    """The :data:`GATE_THRESHOLDS` class of one metric of one case, or None where the metric is not
    gated.

    ``quantity`` is 'time' (with its ``clock``: 'device', 'device_warm' or 'wall'), 'peak memory' or
    'compile'. A kernel's or the matmul's wall time is host launch overhead: reported, never gated
    (its device times gate). Compile seconds are gated for training steps (ours and the anchor's),
    where a compile mode's cost matters to the user choosing it; a kernel's compile (a fraction of a
    second) is not. A step (ours, the anchor's, a distributed one) is device-bound at 1B or when it
    replays CUDA graphs, host-bound otherwise, by every clock; a graphed step's ``forward`` runs
    eagerly (its graph replays the whole step) and moves by several percent between processes at
    every size, so it is host-bound. Peak memory is the memory class, but for the per-call peak of
    a graphed step and the case figures of an earlier meter (``records.EARLIER_METER``).
    Convergence losses and the CPU suite's classes are not gated here.
    """
    if quantity == "peak memory":
        if metric in EARLIER_METER:  # an earlier meter's case figures: reported, never judged
            return None
        # a replay allocates nothing (the graph's memory came at capture): a graphed step's own
        # call reads ~0 by how it is measured; its case peak and resident bytes are judged
        per_call = metric not in (CASE_PEAK, CASE_RESIDENT)
        return None if per_call and graphed(params.get("variant", "")) else "memory"
    entry = BENCHMARKS.get(benchmark)
    if quantity == "compile":
        return "compile" if entry is not None and entry.kind in ("step", "anchor") else None
    if entry is None or entry.kind in ("convergence", "cpu"):
        return None
    if entry.kind in ("kernel", "matmul"):
        return None if clock == "wall" else "device-bound"
    size = params.get("size") or entry.size
    if graphed(params.get("variant", "")):
        return "host-bound" if metric == "forward" else "device-bound"
    return "device-bound" if size == "1B" else "host-bound"


def gate_threshold(
    benchmark: str,
    params: Mapping[str, str],
    quantity: str,
    clock: str | None = None,
    metric: str = "",
) -> float | None:
    """The gate's threshold of one metric (:func:`metric_class`, :data:`GATE_THRESHOLDS`); None: not
    gated."""
    cls = metric_class(benchmark, params, quantity, clock, metric)
    return None if cls is None else GATE_THRESHOLDS[cls]
