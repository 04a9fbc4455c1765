"""optbench: benchmark harness with regression tracking for LLM-training optimizations."""

__version__ = "0.1.0"
