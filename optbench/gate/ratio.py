"""head/base of one metric from two sets of runs, with its confidence interval, and the gate's
verdict on it.

Each run (one process) gives one value of a metric (its median over many samples); the runs of each
side are the evidence, never the samples inside one run. The shift of log values from base to head
is estimated with the Hodges-Lehmann estimator (the median of every pairwise difference ``log h_j -
log b_i``) and bounded by the interval the Mann-Whitney U test gives it: the shifts ``d`` for which
the exact two-sided test of ``log h - d`` against ``log b`` does not reject at ``1 - confidence``
(Hollander & Wolfe, *Nonparametric Statistical Methods*, section 4.3; asv's ``_stats`` and
Chromium's pinpoint rank runs the same way). The interval's ends are pairwise differences; it
assumes nothing about the distribution of a run's value and one outlying run moves it by one order
statistic. With few runs the test cannot reject anything (4 runs a side are the fewest whose exact
two-sided test reaches 5%), and the interval is unbounded.

Verdicts against a metric's threshold ``t`` (the catalog's ``GATE_THRESHOLDS``):

- ``regression``: the whole interval lies above ``1 + t``: slower by more than the threshold, at the
  interval's confidence;
- ``improvement``: the whole interval lies below ``1 / (1 + t)``;
- ``no change``: the whole interval lies inside ``(1 / (1 + t), 1 + t)``: any change is under the
  threshold;
- ``not slower``: the interval lies below ``1 + t`` and reaches below ``1 / (1 + t)``: faster, by
  the threshold or by less. The question the gate asks (is HEAD slower?) has its answer, at the
  confidence ``no change`` has, so no more runs are spent on how much faster;
- ``inconclusive``: the interval reaches past ``1 + t``: more runs would narrow it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

REGRESSION, IMPROVEMENT, NO_CHANGE, NOT_SLOWER, INCONCLUSIVE = (
    "regression",
    "improvement",
    "no change",
    "not slower",
    "inconclusive",
)


@dataclass(frozen=True)
class Ratio:
    """head/base: the Hodges-Lehmann estimate and its interval (``low``, ``high``; infinite ends
    where the runs are too few to bound it), from ``n_base`` and ``n_head`` runs."""

    estimate: float
    low: float
    high: float
    n_base: int
    n_head: int

    def verdict(self, threshold: float) -> str:
        """The gate's verdict on this ratio for a metric of relative ``threshold`` (module
        docstring)."""
        bound = 1 + threshold
        if self.low > bound:
            return REGRESSION
        if self.high < 1 / bound:
            return IMPROVEMENT
        if self.high < bound:
            return NO_CHANGE if 1 / bound < self.low else NOT_SLOWER
        return INCONCLUSIVE


def _accepts(base: Sequence[float], head: Sequence[float], shift: float, alpha: float) -> bool:
    """Whether the exact two-sided Mann-Whitney test keeps ``shift`` (of ``head`` over ``base``) at
    ``alpha``."""
    from scipy.stats import mannwhitneyu

    moved = [h - shift for h in head]
    return mannwhitneyu(moved, base, alternative="two-sided", method="exact").pvalue > alpha


def ratio(base: Sequence[float], head: Sequence[float], confidence: float = 0.95) -> Ratio:
    """head/base of the positive values ``base`` and ``head`` (one per run), with its interval at
    ``confidence`` (module docstring). ValueError where a side is empty or a value is not
    positive."""
    if not base or not head:
        raise ValueError("a ratio needs at least one run on each side")
    if min(*base, *head) <= 0:
        raise ValueError("a ratio needs positive values")
    lb, lh = [math.log(v) for v in base], [math.log(v) for v in head]
    pairs = [h - b for h in lh for b in lb]
    estimate = statistics.median(pairs)
    ends = sorted(set(pairs))
    # The accepted shifts form an interval whose ends are pairwise differences: test one shift
    # strictly between each two neighbouring differences (no tie across the sides there) and one
    # beyond each extreme.
    probes = [ends[0] - 1.0, *((a + b) / 2 for a, b in zip(ends, ends[1:])), ends[-1] + 1.0]
    kept = [i for i, d in enumerate(probes) if _accepts(lb, lh, d, 1 - confidence)]
    if not kept:  # identical values on both sides: the shift is known exactly
        return Ratio(
            math.exp(estimate), math.exp(estimate), math.exp(estimate), len(base), len(head)
        )
    first, last = kept[0], kept[-1]
    low = -math.inf if first == 0 else ends[first - 1]
    high = math.inf if last == len(probes) - 1 else ends[last]
    return Ratio(math.exp(estimate), math.exp(low), math.exp(high), len(base), len(head))


def replicated_ratio(
    base: Sequence[float], head: Sequence[float], tolerance: float
) -> Ratio | None:
    """head/base of a quantity that one code state gives run after run but for the allocator's
    smallest blocks (peak memory: ~5 GB that moved by 512 bytes between runs of one commit on an
    H200), bounded by its extreme ratios ``min(head) / max(base)`` and ``max(head) / min(base)``
    where it was measured at least twice on each side and each side's runs agree within
    ``tolerance`` (relative); None otherwise (a value that moves more between runs of one side is
    noise, for :func:`ratio` to bound)."""
    if min(len(base), len(head)) < 2:
        return None
    if max(max(side) / min(side) - 1 for side in (base, head)) > tolerance:
        return None
    estimate = statistics.median(head) / statistics.median(base)
    return Ratio(estimate, min(head) / max(base), max(head) / min(base), len(base), len(head))


def paired_ratio(shifts: Sequence[float], confidence: float = 0.95) -> Ratio:
    """head/base from paired rounds, each given as its log shift (a lockstep round's median of
    ``log head - log base`` over its paired samples): the one-sample Hodges-Lehmann estimate (the
    median of the Walsh averages, every ``(s_i + s_j) / 2`` with ``i <= j``) bounded by the shifts
    the exact two-sided Wilcoxon signed-rank test keeps at ``1 - confidence`` (Hollander & Wolfe,
    section 3.2). Its ends are Walsh averages; 6 rounds are the fewest whose test reaches 5%, and
    fewer leave the interval unbounded. ValueError where there is no round."""
    if not shifts:
        raise ValueError("a paired ratio needs at least one round")
    walsh = sorted((a + b) / 2 for i, a in enumerate(shifts) for b in shifts[i:])
    estimate = statistics.median(walsh)
    ends = sorted(set(walsh))
    probes = [ends[0] - 1.0, *((a + b) / 2 for a, b in zip(ends, ends[1:])), ends[-1] + 1.0]
    kept = [i for i, d in enumerate(probes) if _keeps(shifts, d, 1 - confidence)]
    n = len(shifts)
    if not kept:  # every round the same shift
        return Ratio(math.exp(estimate), math.exp(estimate), math.exp(estimate), n, n)
    first, last = kept[0], kept[-1]
    low = -math.inf if first == 0 else ends[first - 1]
    high = math.inf if last == len(probes) - 1 else ends[last]
    return Ratio(math.exp(estimate), math.exp(low), math.exp(high), n, n)


def _keeps(shifts: Sequence[float], shift: float, alpha: float) -> bool:
    """Whether the exact two-sided signed-rank test keeps ``shift`` as the rounds' center."""
    from scipy.stats import wilcoxon

    if len(shifts) < 2:
        return True
    return wilcoxon([s - shift for s in shifts], method="exact").pvalue > alpha
