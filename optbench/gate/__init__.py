"""The regression gate: stored runs compared against their run-to-run noise, A/B rounds of two
commits on one GPU, bisection. Above the suite (it reads the catalog's thresholds), below reporting
and the CLI."""
