"""Roofline: how close a timed kernel gets to the compute and bandwidth ceilings of a device, and
which times beat its floor (a measurement problem where the L2 was cold)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from optbench.measure.hardware import DTYPES, HardwareProfile, detect, torch_dtype

COPY_BYTES = 1 << 30  # bytes copied (and as many written) by the bandwidth probe
MATMUL_N = 8192  # the compute probe multiplies two N x N matrices


@dataclass(frozen=True)
class Ceilings:
    """Peak TFLOPS per dtype (None = unknown/unsupported) and peak bandwidth in GB/s (1e9 B/s).

    The one lookup of a device's peaks: :meth:`peak` for TFLOP/s at a dtype, ``bandwidth_gbps`` for
    GB/s; vendor peaks through :meth:`from_profile`, achievable ones through
    :func:`measure_ceilings`.
    """

    tflops: dict[str, float | None]
    bandwidth_gbps: float | None
    source: str  # 'profile:<key>' or 'measured'

    @classmethod
    def from_profile(cls, profile: HardwareProfile) -> Ceilings:
        """The vendor peaks of a hardware profile."""
        return cls(dict(profile.peak_tflops), profile.mem_bw_gbps, f"profile:{profile.key}")

    def peak(self, dtype: str) -> float | None:
        """Ceiling in TFLOPS for dtype ('fp32', 'tf32', 'bf16', 'fp16'); None if unknown or
        unsupported; KeyError for any other dtype."""
        if dtype not in DTYPES:
            raise KeyError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
        return self.tflops.get(dtype)


@dataclass(frozen=True)
class Probe:
    """One ceiling probe: ``fn()`` runs its work once on the probe's device; ``flops`` and
    ``bytes_moved`` count that work (the inputs of :func:`roofline`), in precision ``dtype`` (one of
    :data:`DTYPES`)."""

    fn: Callable[[], object]
    flops: float
    bytes_moved: float
    dtype: str


def copy_probe(device: str | torch.device, dtype: str = "fp32", nbytes: int = COPY_BYTES) -> Probe:
    """Bandwidth probe: a device-to-device copy of ``nbytes`` of random ``dtype`` data into a
    preallocated buffer; 0 FLOPs, bytes read plus written (2 x ``nbytes``, rounded down to whole
    elements)."""
    src = torch.rand(nbytes // torch_dtype(dtype).itemsize, device=device, dtype=torch_dtype(dtype))
    dst = torch.empty_like(src)
    return Probe(lambda: dst.copy_(src), 0.0, 2.0 * src.numel() * src.element_size(), dtype)


def matmul_probe(dtype: str, device: str | torch.device, n: int = MATMUL_N) -> Probe:
    """Compute probe: an n x n x n matmul of random matrices in ``dtype`` into a preallocated
    output; 2 n^3 FLOPs, and the bytes of both inputs read once and the output written once (3 n^2
    elements). For 'tf32' the caller enables TF32 matmuls while it times ``fn``
    (:func:`measure_ceilings` does)."""
    a, b = (torch.randn(n, n, device=device, dtype=torch_dtype(dtype)) for _ in range(2))
    out = torch.empty_like(a)
    return Probe(lambda: torch.mm(a, b, out=out), 2.0 * n**3, 3.0 * n * n * a.element_size(), dtype)


def measure_ceilings(device: str | torch.device = "cuda") -> Ceilings:
    """Achievable ceilings measured on a CUDA device, each probe's fastest call after an idle spell
    (:func:`burst_ms`).

    Bandwidth: :func:`copy_probe` (1 GiB, bytes read plus written). Compute: :func:`matmul_probe`
    (8192^3) in bf16, fp16, fp32 with TF32 and fp32 without TF32 (the TF32 flag is restored
    afterwards); dtypes the device does not support natively are left None.

    Not a sustained loop: back-to-back 8192^3 products hold a 700 W card at its power cap, at a
    lower clock than GEMMs that alternate with memory-bound kernels, as a training step's do: a
    step's GEMMs beat that sustained rate, so it is no ceiling.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        raise NotImplementedError(f"ceilings can only be measured on CUDA, not {dev.type!r}")
    profile = detect(dev)
    supported = {
        "fp32": True,
        "tf32": profile.supports_tf32,
        "bf16": profile.supports_bf16,
        "fp16": True,
    }
    tflops = {dtype: _matmul_tflops(dtype, dev) if ok else None for dtype, ok in supported.items()}
    return Ceilings(tflops, _copy_gbps(dev), "measured")


BURST_WARMUP, BURST_CALLS = 3, 10
IDLE_CYCLES = 4_000_000  # about 2 ms of one spinning block at 2 GHz: the card's power falls back


def burst_ms(fn: Callable[[], object], dev: torch.device) -> float:
    """The fastest device ms of ``fn`` over BURST_CALLS calls, each between its own CUDA events
    and after an idle spell, after BURST_WARMUP untimed calls. A ceiling is what the chip does
    before its power cap lowers the clock: back-to-back 8192^3 FP8 products reach the cap within
    a few calls; one after an idle spell, as a step's GEMMs come between memory-bound kernels,
    does not. Any slower call was slowed (by the clock), so the fastest is the ceiling."""
    for _ in range(BURST_WARMUP):
        fn()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(BURST_CALLS)
    ]
    for start, end in events:
        torch.cuda._sleep(IDLE_CYCLES)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(dev)
    return min(start.elapsed_time(end) for start, end in events)


def _copy_gbps(dev: torch.device) -> float:
    probe = copy_probe(dev)
    return probe.bytes_moved / burst_ms(probe.fn, dev) / 1e6


def _matmul_tflops(dtype: str, dev: torch.device) -> float:
    probe = matmul_probe(dtype, dev)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        ms = burst_ms(probe.fn, dev)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return probe.flops / ms / 1e9


def fp8_burst_tflops(device: str | torch.device = "cuda", n: int = MATMUL_N) -> float | None:
    """The FP8 matmul ceiling: an n x n x n ``torch._scaled_mm`` of e4m3 operands into bf16, one
    scale per tensor and fast accumulation (the fastest FP8 GEMM torchao's recipes run), its
    fastest call after an idle spell (:func:`burst_ms`); None without FP8 tensor cores (before
    sm89)."""
    dev = torch.device(device)
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev) < (8, 9):
        return None
    a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as it needs
    one = torch.ones((), device=dev)

    def product() -> torch.Tensor:
        return torch._scaled_mm(
            a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
        )

    return 2.0 * n**3 / burst_ms(product, dev) / 1e9


@dataclass(frozen=True)
class Roofline:
    """Where one timed kernel sits under the ceilings; fields needing an unknown ceiling are
    None."""

    achieved_tflops: float
    achieved_gbps: float
    compute_frac: float | None  # achieved / peak TFLOPS
    bandwidth_frac: float | None  # achieved / peak GB/s
    floor_ms: float | None  # max(flops / peak, bytes / bandwidth): the fastest the ceilings allow
    floor_ratio: float | None  # time / floor, >= 1 unless the ceilings are beaten
    bound: str | None  # 'compute' | 'memory': which term sets the floor


def _floor_terms(
    flops: float, bytes_moved: float, ceilings: Ceilings, dtype: str
) -> tuple[float | None, float | None]:
    """(compute ms, memory ms) lower bounds; a term is 0 without work, None if its ceiling is
    unknown."""
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"flops and bytes must be >= 0, got {flops}, {bytes_moved}")
    peak, bandwidth = ceilings.peak(dtype), ceilings.bandwidth_gbps
    compute_ms = 0.0 if flops == 0 else (flops / peak / 1e9 if peak else None)
    memory_ms = 0.0 if bytes_moved == 0 else (bytes_moved / bandwidth / 1e6 if bandwidth else None)
    return compute_ms, memory_ms


def _floor(compute_ms: float | None, memory_ms: float | None) -> float | None:
    return None if compute_ms is None or memory_ms is None else max(compute_ms, memory_ms)


def floor_ms(flops: float, bytes_moved: float, ceilings: Ceilings, dtype: str) -> float | None:
    """Roofline lower bound on time, ms: max(flops / peak, bytes / bandwidth).

    None if a ceiling that a nonzero term needs is unknown.
    """
    return _floor(*_floor_terms(flops, bytes_moved, ceilings, dtype))


def roofline(
    flops: float, bytes_moved: float, time_ms: float, ceilings: Ceilings, dtype: str
) -> Roofline:
    """Achieved TFLOPS and GB/s of a kernel doing flops and moving bytes_moved in time_ms, vs
    ceilings."""
    if time_ms <= 0:
        raise ValueError(f"time_ms must be > 0, got {time_ms}")
    compute_ms, memory_ms = _floor_terms(flops, bytes_moved, ceilings, dtype)
    achieved_tflops = flops / time_ms / 1e9
    achieved_gbps = bytes_moved / time_ms / 1e6
    peak, bandwidth = ceilings.peak(dtype), ceilings.bandwidth_gbps
    floor = _floor(compute_ms, memory_ms)
    return Roofline(
        achieved_tflops=achieved_tflops,
        achieved_gbps=achieved_gbps,
        compute_frac=achieved_tflops / peak if peak else None,
        bandwidth_frac=achieved_gbps / bandwidth if bandwidth else None,
        floor_ms=floor,
        floor_ratio=time_ms / floor if floor else None,
        bound=("compute" if compute_ms >= memory_ms else "memory") if floor else None,
    )


def below_floor(floor_ratio: float | None) -> bool:
    """Whether a time at ``floor_ratio`` x its roofline floor is at or under the floor. A cold-L2
    device time there is a measurement problem (its data comes from HBM); a warm-L2 one may be L2
    bandwidth."""
    return floor_ratio is not None and floor_ratio <= 1.0
