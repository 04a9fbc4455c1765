"""Kernels x implementations (eager, torch.compile, Liger-Kernel, ours in Triton) x shapes.

Per combination: forward and forward+backward device time with a cold L2 (CUDA-graph replays
rotating over input sets larger than the L2, ms per call; ``track_*_ms``), the same with a warm L2
(one input set back-to-back; ``track_*_warm_ms``), wall time (synchronized, ms per call) and peak
extra memory (MiB). Each case is checked against the eager baseline run in higher precision before
it is timed.
"""

from __future__ import annotations

from .common import Grid, grid, unit


class _Kernel(Grid):
    param_names = ["shape", "impl"]
    version = 2  # 2: device time with a cold L2 (1: back-to-back calls on one input set, a warm L2)

    @unit("ms")
    def track_fwd_ms(self, records, shape, impl):
        return self.metric_ms(records, (shape, impl), "fwd")

    @unit("ms")
    def track_fwd_warm_ms(self, records, shape, impl):
        return self.metric_ms(records, (shape, impl), "fwd", "device_warm")

    @unit("ms")
    def track_fwd_wall_ms(self, records, shape, impl):
        return self.metric_ms(records, (shape, impl), "fwd", "wall")


class _KernelWithBackward(_Kernel):
    @unit("ms")
    def track_fwdbwd_ms(self, records, shape, impl):
        return self.metric_ms(records, (shape, impl), "fwdbwd")

    @unit("ms")
    def track_fwdbwd_warm_ms(self, records, shape, impl):
        return self.metric_ms(records, (shape, impl), "fwdbwd", "device_warm")

    @unit("ms")
    def track_fwdbwd_wall_ms(self, records, shape, impl):
        return self.metric_ms(records, (shape, impl), "fwdbwd", "wall")

    @unit("MB")
    def track_fwdbwd_peak_mb(self, records, shape, impl):
        return self.peak_mb(records, (shape, impl), "fwdbwd")


class RMSNorm(_KernelWithBackward):
    params = grid(__module__, __qualname__)


class AddRMSNorm(_KernelWithBackward):
    """The residual add and the RMSNorm after it (x fp32, y and the norm's output bf16), fused or
    not."""

    params = grid(__module__, __qualname__)


class SwiGLU(_KernelWithBackward):
    params = grid(__module__, __qualname__)


class QKNorm(_KernelWithBackward):
    params = grid(__module__, __qualname__)


class QKVRope(_KernelWithBackward):
    """RoPE of q and k out of one packed q/k/v projection output (B=8, S=1024), and its packed
    gradient."""

    params = grid(__module__, __qualname__)


class LinearCrossEntropy(_KernelWithBackward):
    params = grid(__module__, __qualname__)


class GradStats(_Kernel):
    """Gradient norm + parameter norm + clipping over all of a model's parameters (fp32)."""

    params = grid(__module__, __qualname__)

    @unit("MB")
    def track_fwd_peak_mb(self, records, shape, impl):
        return self.peak_mb(records, (shape, impl), "fwd")
