"""The convergence check: does a variant train like the eager step? For the variants that change the
numerics on purpose (``models.variants.numerics``: FP8 matmuls, 8-bit AdamW states, bf16 weights),
which a 3-step check against a higher-precision reference cannot judge, this is what decides whether
they are right.

Protocol (:class:`Protocol`). The model of ``size`` on this machine's step baseline
(``optbench.suite.baseline. base_options``: bf16 autocast on a GPU, fp32 on a CPU, its batch and
sequence length) trains ``steps`` optimizer steps with :data:`HYPER` on a fixed corpus of a
synthetic language (``optbench.suite.corpus``: the same batches in the same order for every run),
from the init of one seed. Its loss curve: the mean training loss of each ``log_every`` consecutive
steps (nats), at the last step of each.

Tolerance. The eager step trains from ``seeds`` seeds (0, 1, ...). At each logged point the seeds'
mean and sample variance; the *seed spread* sigma is the root of the variances' mean over the
compared points (pooled: one figure from all points, steadier than any one point's from a few runs),
at least :data:`SPREAD_FLOOR`. The compared points are those after the first :data:`SKIP` of the
steps: before them the loss falls from ln V at a rate set by the init, where seeds differ most and
would swamp the spread.

Statistic. The variant trains from seed 0. Its *deviation* is the root-mean-square, over the
compared points, of its curve minus the eager mean curve (nats); it passes when the deviation is at
most :data:`FACTOR` = 4 times the seed spread, else it is ``wrong``
(:class:`optbench.run.runner.WrongResult`). A variant that trains like eager is one more draw of
the seed's noise: its deviation is about sigma * sqrt(1 + 1/seeds) (one point's) and averaging over
points keeps the tail short, where the largest point's deviation (a max statistic) has a long one; a
bug that shifts the curve anywhere in the window raises the mean square. Measured on the tiny model
with the protocol of tests/test_convergence.py (fp32 on a CPU, 200 steps, 4 seeds), once, from 16
seeds' curves: another seed's deviation is 1.0 sigma at the median, 2.6 at the 99th percentile and
3.75 at most over 1000 draws of 4 seeds and one more; in the tests (which hold these bounds
loosely): torchao's emulated FP8 1.0-1.1; planted bugs 6-67 (attention weights frozen 6.2, learning
rate x1.25 7.0, FP8 scales frozen at their first value 6.5 rowwise and 25 tensorwise, MLPs or
embedding frozen 16, AdamW state reset every step, as an optimizer that loses its state does, 67).
The variant and eager seed 0 share their init; their deviation (``same_seed_rms``) is kept beside,
as is each eager seed's deviation from the other seeds' mean (``leave_one_out``): the spread's own
check.

Seeds: 8. On a GPU eager's training is not deterministic (about half the variance between two
seeds' curves is between two runs of one seed), and the spread of 4 seeds moved 2.5x between runs
of the same code, which flipped a verdict; 8 narrow the tolerance's range, at FACTOR kept from 4
seeds (NOTES.md, "Session 28").

Records (``info``): every curve (the variant's and each eager seed's), the mean curve, the spread,
the deviation, the largest point's deviation, the final loss (mean over the last tenth of the
steps), the corpus's floor. The eager case stores the seeds (it always trains them); a variant's
case where this process has none (an ``optbench run --select`` of one variant) reads those a stored
run of the same code and software kept (:func:`stored_eager_seeds`, named in its record as
``eager.from_run``), else trains them, and keeps them for the next case.

GPU time (100M, B=8 x S=1024 = 8192 tokens per step, 300 steps = 2.5M tokens per run, on an H100):
the eager step at ~75 ms (110k tokens/s) takes ~23 s a run, ~3 min for its 8 seeds; an eager-speed
variant (adamw-8bit, master-adamw, fp8-* without compile) ~20-30 s; a compiled one (best-kernels*)
~5 s of steps plus ~30 s of compilation. The grid (catalog.CONVERGENCE) is ~6-7 min; a variant run
alone ~3 min more where it trains the eager seeds, which it reads instead from a stored run of the
same code and software where there is one (:func:`stored_eager_seeds`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from models.step import Hyper, TrainStep
from optbench.run.runner import Work, WrongResult
from optbench.suite.corpus import MarkovLanguage, uniform_loss, unigram_entropy

# nanoGPT's for its 124M model; constant lr
HYPER = Hyper(lr=6e-4, weight_decay=0.1, max_grad_norm=1.0)
FACTOR = 4.0  # the deviation's tolerance, in seed spreads
SPREAD_FLOOR = 1e-3  # nats: a seed spread smaller than this is taken as this
SKIP = 0.25  # the first quarter of the steps is not compared
# A case trains the eager seeds where this process has none (~3 min at 100M on an H100 or H200)
# and then its variant (with a cold compile, ~1 min): more than a single-GPU case's budget
# (optbench.store.settings' case_budget_s, 180 s).
CASE_BUDGET_S = 420.0


@dataclass(frozen=True)
class Protocol:
    """How a convergence run trains: ``steps`` optimizer steps with ``hyper``, the curve logged
    every ``log_every`` steps; the tolerance from ``seeds`` eager seeds; the corpus from
    ``language`` (its vocabulary is the model's); ``batch_size`` overrides the step baseline's
    (None: keep it)."""

    steps: int = 300
    log_every: int = 10
    seeds: int = 8
    hyper: Hyper = HYPER
    branching: int = 8
    corpus_seed: int = 1234
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.steps % self.log_every or self.steps // self.log_every < 4 or self.seeds < 2:
            raise ValueError(
                f"need steps a multiple of log_every, at least 4 logged points and 2 seeds: {self}"
            )

    def language(self, vocab_size: int) -> MarkovLanguage:
        return MarkovLanguage(vocab_size, branching=self.branching, seed=self.corpus_seed)

    def batches(self, vocab_size: int, batch_size: int, seq_len: int) -> tuple[Tensor, float]:
        """(the corpus as (steps, batch_size, seq_len + 1) token batches on the host, its floor in
        nats)."""
        corpus = self.language(vocab_size).corpus(self.steps * batch_size, seq_len + 1)
        return corpus.batches(batch_size), corpus.floor

    @property
    def first_compared(self) -> int:
        """Index of the first logged point compared (:data:`SKIP`)."""
        return math.ceil(SKIP * self.steps / self.log_every)

    def record(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "factor": FACTOR,
            "spread_floor": SPREAD_FLOOR,
            "skip": SKIP,
        }


@dataclass(frozen=True)
class Curve:
    """A run's loss curve: ``loss[i]``, the mean training loss (nats) of the ``log_every`` steps up
    to optimizer step ``steps[i]`` (1-based)."""

    steps: tuple[int, ...]
    loss: tuple[float, ...]

    @property
    def final(self) -> float:
        """Mean loss of the last tenth of the logged points (at least one), nats."""
        tail = self.loss[-max(1, len(self.loss) // 10) :]
        return sum(tail) / len(tail)

    def record(self) -> dict[str, list]:
        return {"steps": list(self.steps), "loss": list(self.loss)}


def train(step: TrainStep, batches: Tensor, protocol: Protocol) -> Curve:
    """Train freshly built ``step`` on ``batches`` ((protocol.steps, B, S + 1) tokens, any device)
    with ``protocol.hyper``, one batch per optimizer step; its loss curve. Losses stay on the device
    until the end (the step's own ``item_sync`` decides whether it syncs every step)."""
    if batches.shape[0] < protocol.steps or tuple(batches.shape[1:]) != (
        step.options.batch_size,
        step.options.seq_len + 1,
    ):
        raise ValueError(
            f"batches {tuple(batches.shape)} do not fit {protocol.steps} steps of {step.options}"
        )
    batches = batches.to(step.device)
    losses = []
    with step.tuned(protocol.hyper):
        for i in range(protocol.steps):
            step.feed(batches[i])
            losses.append(step())
    logged = (
        torch.stack([loss.float().reshape(()) for loss in losses])
        .view(-1, protocol.log_every)
        .mean(1)
    )
    every = protocol.log_every
    return Curve(tuple(range(every, protocol.steps + 1, every)), tuple(logged.tolist()))


@dataclass(frozen=True)
class EagerSeeds:
    """The eager step's curves from seeds 0, 1, ...; the mean curve and the seed spread over the
    compared points (from index ``first``), nats."""

    curves: tuple[Curve, ...]
    first: int
    # the stored run they were read from (:func:`stored_eager_seeds`); None: trained here
    source: str | None = None

    @property
    def mean(self) -> tuple[float, ...]:
        return tuple(
            torch.tensor([c.loss for c in self.curves], dtype=torch.float64).mean(0).tolist()
        )

    @property
    def spread(self) -> float:
        """Root of the mean over the compared points of the seeds' sample variance, at least
        SPREAD_FLOOR."""
        losses = torch.tensor([c.loss for c in self.curves], dtype=torch.float64)[:, self.first :]
        return max(float(losses.var(0).mean().sqrt()), SPREAD_FLOOR)

    def leave_one_out(self) -> list[float]:
        """Each seed's deviation from the other seeds' mean, in their spread: what a correct variant
        scores."""
        out = []
        for i, curve in enumerate(self.curves):
            others = EagerSeeds(self.curves[:i] + self.curves[i + 1 :], self.first)
            out.append(rms_deviation(curve, others.mean, self.first) / others.spread)
        return out

    def record(self) -> dict[str, Any]:
        return {
            "curves": [c.record() for c in self.curves],
            "mean": list(self.mean),
            "spread": self.spread,
            "compared_from_step": self.curves[0].steps[self.first],
            "leave_one_out": self.leave_one_out(),
            **({"from_run": self.source} if self.source else {}),
        }


def rms_deviation(curve: Curve, mean: tuple[float, ...], first: int) -> float:
    """Root-mean-square of ``curve`` minus ``mean`` over the points from index ``first``, nats."""
    d = torch.tensor(curve.loss[first:], dtype=torch.float64) - torch.tensor(
        mean[first:], dtype=torch.float64
    )
    return float(d.pow(2).mean().sqrt())


@dataclass(frozen=True)
class Verdict:
    """A curve against the eager seeds: ``deviation`` (RMS, nats) within ``tolerance`` (FACTOR x
    spread)."""

    curve: Curve
    eager: EagerSeeds
    deviation: float
    tolerance: float
    max_deviation: float  # the largest point's |curve - mean| over the compared points, nats
    same_seed_rms: float  # RMS against eager seed 0's curve (the same init), nats

    @property
    def ok(self) -> bool:
        return math.isfinite(self.deviation) and self.deviation <= self.tolerance

    @property
    def ratio(self) -> float:
        """deviation / tolerance: at most 1 passes."""
        return self.deviation / self.tolerance

    def summary(self) -> dict[str, float]:
        """The tracked figures: final loss, deviation and largest deviation (nats), deviation over
        tolerance."""
        return {
            "final_loss": self.curve.final,
            "rms_deviation": self.deviation,
            "max_deviation": self.max_deviation,
            "ratio": self.ratio,
        }

    def record(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "curve": self.curve.record(),
            "tolerance": self.tolerance,
            "spread": self.eager.spread,
            "same_seed_rms": self.same_seed_rms,
            "eager": self.eager.record(),
        }


def judge(curve: Curve, eager: EagerSeeds) -> Verdict:
    """``curve`` (from seed 0) against the eager seeds (the module docstring's statistic)."""
    first, mean = eager.first, eager.mean
    if curve.steps != eager.curves[0].steps:
        raise ValueError("the curve and the eager seeds were logged at different steps")
    deviations = [abs(a - b) for a, b in zip(curve.loss[first:], mean[first:])]
    return Verdict(
        curve,
        eager,
        rms_deviation(curve, mean, first),
        FACTOR * eager.spread,
        max(deviations),
        rms_deviation(curve, eager.curves[0].loss, first),
    )


def eager_seeds(
    build: Callable[[int], TrainStep], batches: Tensor, protocol: Protocol
) -> EagerSeeds:
    """Train the eager step built by ``build(seed)`` from seeds 0 .. protocol.seeds - 1."""
    curves = tuple(train(build(seed), batches, protocol) for seed in range(protocol.seeds))
    return EagerSeeds(curves, protocol.first_compared)


# What a run's software must share with a stored run for that run's eager seeds to stand in for its
# own.
SAME_SOFTWARE = ("gpu_name", "torch", "triton", "cuda")


def stored_eager_seeds(size: str, protocol: Protocol, options: Any) -> EagerSeeds | None:
    """Eager seeds that an earlier run of the code being measured stored on this machine: the seeds
    a convergence record of ``size`` keeps (the eager case's, or a variant's, which keeps those it
    was judged against), trained with this ``protocol`` at ``options``' precision, batch and
    sequence length, by a run with this process's GPU model, torch, Triton and CUDA
    (:data:`SAME_SOFTWARE`), every seed having learned; the newest such run's, with its id as
    ``source``. None where there is none. Reading them spares a variant's case the eager seeds'
    training (~3 min at 100M on an H100 or H200) when it runs without the eager case
    (``optbench run --select``)."""
    from optbench.measure.machine import machine_info
    from optbench.run.runner import current_commit, current_machine
    from optbench.store import settings
    from optbench.store.store import ResultStore

    commit, machine = current_commit(), current_machine()
    info = machine_info()
    store = ResultStore(settings.current().results)
    shape = (options.precision, options.batch_size, options.seq_len)
    for run in reversed(store.runs(machine, commit) if commit != "unknown" else []):
        if any(run.info.get(k) != info.get(k) for k in SAME_SOFTWARE):
            continue
        for key, rec in run.results().items():
            kept = rec.get("info") or {}
            if (
                not key.startswith(f"bench_convergence.Convergence{size}|")
                or not kept.get("eager")
                or kept.get("protocol") != protocol.record()
                or (kept.get("precision"), kept.get("batch_size"), kept.get("seq_len")) != shape
            ):
                continue
            curves = tuple(
                Curve(tuple(c["steps"]), tuple(c["loss"])) for c in kept["eager"]["curves"]
            )
            if all(c.loss[-1] < c.loss[0] for c in curves):
                return EagerSeeds(curves, protocol.first_compared, source=run.run_id)
    return None


# (size, device, eager options, protocol) -> the eager seeds of this process (trained, or read by
# stored_eager_seeds); the last one only.
_EAGER: dict[tuple, EagerSeeds] = {}
# (size, variant) -> Verdict.summary() of the cases measured in this process (what asv's track
# methods read).
_SUMMARIES: dict[tuple[str, str], dict[str, float]] = {}


def summary(size: str, variant: str) -> dict[str, float] | None:
    """The tracked figures of the convergence case of ``variant`` at ``size`` measured in this
    process."""
    return _SUMMARIES.get((size, variant))


def convergence_work(
    size: str, variant: str, device: str, protocol: Protocol = Protocol(), seed: int = 0
) -> Work:
    """The convergence case of ``variant`` at ``size``: trains it (and the eager seeds, unless this
    process has them or, for a variant, a stored run of this code and software has:
    :func:`stored_eager_seeds`, named in the record as ``eager.from_run``) when built, so that the
    record's ``info`` holds the curves (:meth:`Verdict.record`) whatever the verdict; its check
    raises WrongResult where the deviation is over the tolerance. The eager case always trains its
    seeds. Nothing is timed."""
    from models.config import CONFIGS
    from models.step import UnsupportedOptions, build_step
    from optbench.suite.baseline import step_pair
    from optbench.suite.plan import convergence_skip_reason
    from optbench.suite.workloads import machine_profile, skip_if

    profile = machine_profile(device)
    skip_if(convergence_skip_reason(profile, size, variant))
    eager_options, options = (
        step_pair(profile, size, "eager")[1],
        step_pair(profile, size, variant)[1],
    )
    if protocol.batch_size is not None:
        eager_options = eager_options.replace(batch_size=protocol.batch_size)
        options = options.replace(batch_size=protocol.batch_size)
    config = CONFIGS[size]
    batches, floor = protocol.batches(config.vocab_size, options.batch_size, options.seq_len)
    try:
        key = (size, str(device), eager_options, protocol)
        if key not in _EAGER or (variant == "eager" and _EAGER[key].source):
            stored = (
                None if variant == "eager" else stored_eager_seeds(size, protocol, eager_options)
            )
            # a 100M run's curves are small; its model is gone: only the last key is kept
            _EAGER.clear()
            _EAGER[key] = stored or eager_seeds(
                lambda s: build_step(config, eager_options, device, s, profile=profile),
                batches,
                protocol,
            )
        eager = _EAGER[key]
        curve = (
            eager.curves[seed]
            if variant == "eager" and seed < len(eager.curves)
            else train(
                build_step(config, options, device, seed, profile=profile), batches, protocol
            )
        )
    except UnsupportedOptions as exc:
        raise NotImplementedError(str(exc)) from exc
    verdict = judge(curve, eager)
    language = protocol.language(config.vocab_size)
    info = {
        "protocol": protocol.record(),
        "precision": options.precision,
        "batch_size": options.batch_size,
        "seq_len": options.seq_len,
        "tokens_per_step": options.batch_size * options.seq_len,
        "corpus": {
            "floor": floor,
            "unigram_entropy": unigram_entropy(language),
            "uniform": uniform_loss(language),
        },
        **verdict.record(),
    }

    def check() -> dict[str, Any]:
        _SUMMARIES[(size, variant)] = verdict.summary()
        if variant == "eager" and not all(c.loss[-1] < c.loss[0] for c in eager.curves):
            raise WrongResult(
                f"convergence {size}/eager: a seed did not learn: {[c.loss for c in eager.curves]}"
            )
        if not verdict.ok:
            eager_final = sum(c.final for c in eager.curves) / len(eager.curves)
            raise WrongResult(
                f"convergence {size}/{variant}: the loss curve deviates from the eager seeds' mean "
                f"by {verdict.deviation:.4g} nats (RMS from step {curve.steps[eager.first]}), over "
                f"{FACTOR:g} x their spread {eager.spread:.4g} = {verdict.tolerance:.4g}; final "
                f"loss {curve.final:.4f} against eager's {eager_final:.4f}"
            )
        return {
            "deviation": verdict.deviation,
            "tolerance": verdict.tolerance,
            "ratio": verdict.ratio,
            "spread": eager.spread,
            "factor": FACTOR,
        }

    return Work(timed={}, check=check, info=info)
