"""Probe (CPU): how often ab's ABBA design passes a head, with and without the ``not slower``
verdict (optbench.gate.ratio), on simulated runs: 8 runs a side at most, each run's value normal
with relative spread ``sigma`` around 100 (base) and 100 x ``true`` (head); looks after 4 to 8 runs
a side, as ab's default ``--min-rounds 4 --max-rounds 8``; a look stops at a regression (caught)
or any other decided verdict (passed), else the next look; threshold 3% (device-bound). Without
``not slower``, that verdict counts as inconclusive (ab before 346ffad). 400 trials per cell, the
same draws for both rules. Prints one line per sigma and true ratio; about 9 minutes. Output of
its run in session 29: results/cpu-amd-epyc/probes-2026-11-29/ab-not-slower-sim-session29.txt.

    python3 -m scripts.probes.ab_not_slower_sim
"""

import random

from optbench.gate.ratio import INCONCLUSIVE, NOT_SLOWER, REGRESSION, ratio


def run(true, sigma, new, trials, rng, t=0.03):
    passed = caught = 0
    for _ in range(trials):
        b = [100 * (1 + rng.gauss(0, sigma)) for _ in range(8)]
        h = [100 * true * (1 + rng.gauss(0, sigma)) for _ in range(8)]
        for n in range(4, 9):
            v = ratio(b[:n], h[:n]).verdict(t)
            if v == NOT_SLOWER and not new:
                v = INCONCLUSIVE
            if v == REGRESSION:
                caught += 1
                break
            if v != INCONCLUSIVE:
                passed += 1
                break
    return passed / trials, caught / trials


def main() -> None:
    for sigma in (0.003, 0.01, 0.02, 0.03):
        for true in (1.0, 1.03, 1.05):
            o = run(true, sigma, False, 400, random.Random(1))
            n = run(true, sigma, True, 400, random.Random(1))
            print(
                f"sigma {sigma:.3f} true {true:.2f}: old pass {o[0]:.3f} caught {o[1]:.3f} | "
                f"new pass {n[0]:.3f} caught {n[1]:.3f}"
            )


if __name__ == "__main__":
    main()
