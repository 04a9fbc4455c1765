"""The regression gate: stored runs compared against their run-to-run noise, A/B rounds of two
commits on one GPU, bisection, and the change points of a metric over commits.

Above the suite (it reads the catalog's thresholds): it imports itself, the suite, run, measure and
the store; reporting and the CLI import it."""
