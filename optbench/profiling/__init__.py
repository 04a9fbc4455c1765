"""torch.profiler breakdowns of a training step."""
