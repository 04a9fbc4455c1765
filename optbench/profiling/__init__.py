"""torch.profiler breakdowns of a training step. Imports itself, the suite, run, measure, the
store, kernels and models."""
