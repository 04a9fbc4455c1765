"""The one timing primitive of optbench: repeated wall-clock and device timings of a callable."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

METHODS: tuple[str, ...] = ("cuda-graph", "cuda-events", "profiler", "perf-counter")

_WARMUP_CALLS = 3  # at least this many calls before anything is timed
_WALL_SAMPLE_MS = 1.0  # a wall sample repeats fn until it lasts about this long...
_MAX_CALLS_PER_SAMPLE = 10_000  # ...but at most this many calls
_REPLAY_MS = 0.5  # a graph replay holds enough calls to last about this long...
_MAX_CALLS_PER_GRAPH = 1_000  # ...but at most this many calls
_MARK = "optbench::measure-call"  # profiler range around one call in the profiler fallback


@dataclass(frozen=True)
class Timing:
    """Repeated timings of one callable, milliseconds per call."""

    samples_ms: tuple[float, ...]
    method: str  # 'cuda-graph' | 'cuda-events' | 'profiler' | 'perf-counter'

    def __post_init__(self) -> None:
        if not self.samples_ms:
            raise ValueError("a Timing needs at least one sample")
        if self.method not in METHODS:
            raise ValueError(f"unknown timing method {self.method!r}; expected one of {METHODS}")
        object.__setattr__(self, "samples_ms", tuple(float(s) for s in self.samples_ms))

    def _percentile(self, q: float) -> float:
        return float(np.percentile(self.samples_ms, q))

    @property
    def median_ms(self) -> float:
        """Median over samples, ms per call."""
        return self._percentile(50)

    @property
    def q25_ms(self) -> float:
        """25th percentile over samples, ms per call."""
        return self._percentile(25)

    @property
    def q75_ms(self) -> float:
        """75th percentile over samples, ms per call."""
        return self._percentile(75)

    @property
    def iqr_ms(self) -> float:
        """Interquartile range over samples, ms."""
        return self.q75_ms - self.q25_ms

    @property
    def n(self) -> int:
        """Number of samples."""
        return len(self.samples_ms)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: method, statistics and the samples."""
        return {
            "method": self.method,
            "n": self.n,
            "median_ms": self.median_ms,
            "q25_ms": self.q25_ms,
            "q75_ms": self.q75_ms,
            "iqr_ms": self.iqr_ms,
            "samples_ms": list(self.samples_ms),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timing:
        """Inverse of to_dict; the statistics are recomputed from the samples."""
        return cls(samples_ms=tuple(data["samples_ms"]), method=data["method"])


@dataclass(frozen=True)
class Measurement:
    """Device time and wall time of one callable."""

    device: Timing | None  # None on CPU
    wall: Timing

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"device": self.device.to_dict() if self.device else None, "wall": self.wall.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """Inverse of to_dict."""
        device = data.get("device")
        return cls(device=Timing.from_dict(device) if device else None, wall=Timing.from_dict(data["wall"]))


def sync_clock() -> float:
    """perf_counter() seconds, after synchronizing the current CUDA device if CUDA is initialized.

    Use as asv `timer = staticmethod(sync_clock)` and pytest-benchmark
    `@pytest.mark.benchmark(timer=sync_clock)`, so neither measures only the launch.
    """
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


@dataclass(frozen=True)
class _Budget:
    rep_ms: float
    min_reps: int
    max_reps: int

    def reps(self, sample_ms: float) -> int:
        """Samples of about sample_ms each that fill rep_ms, within [min_reps, max_reps]."""
        wanted = math.ceil(self.rep_ms / sample_ms) if sample_ms > 0 else self.max_reps
        return max(self.min_reps, min(self.max_reps, wanted))


def measure(
    fn: Callable[[], object],
    *,
    device: str | torch.device = "cpu",
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_reps: int = 10,
    max_reps: int = 1000,
    flush_l2: bool = False,
    graph: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """Time fn: wall milliseconds per call always, device milliseconds per call on CUDA.

    fn is first called at least 3 times and until warmup_ms of wall time passed. A wall sample
    repeats fn until it lasts about 1 ms (synchronizing CUDA around it, timed with `clock`, seconds);
    samples are taken until rep_ms is spent, at least min_reps and at most max_reps of them.
    Device time: with graph=True, replays of a CUDA graph of k back-to-back calls (k so that a
    replay lasts about 0.5 ms; 1 for long calls) timed with CUDA events; if fn cannot be captured,
    the per-call sum of device-kernel durations from torch.profiler, and if that fails, CUDA
    events around each eager call. Where the graph was timed, eager calls timed by events are
    measured too and the faster median is kept (for long calls the launch gaps the graph removes are
    negligible, and a graph may execute some operations, like copies, differently). With graph=False
    (whole training steps, whose wall time is the primary figure) each wall sample is also bracketed
    by CUDA events, so one set of calls gives both clocks.
    flush_l2 (CUDA, graph=True only) overwrites a buffer of twice the L2 size before each device
    sample; with k > 1 only the first call of a replay starts from a cold L2, so it is only meaningful
    for long calls.
    Raises RuntimeError if a median comes out as 0 (nothing measurable was timed).
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got {min_reps}, {max_reps}")
    if flush_l2 and not graph:
        raise ValueError("flush_l2 needs graph=True: with graph=False the device samples are the wall samples")
    budget = _Budget(rep_ms, min_reps, max_reps)
    dev = torch.device(device)
    if dev.type == "cpu":
        estimate_ms = _warm_up(fn, _no_sync, clock, warmup_ms)
        return Measurement(device=None, wall=_wall_timing(fn, _no_sync, clock, estimate_ms, budget)[1])
    if dev.type != "cuda":
        raise ValueError(f"measure() supports cpu and cuda devices, not {dev.type!r}")
    with torch.cuda.device(dev):
        sync = torch.cuda.synchronize
        estimate_ms = _warm_up(fn, sync, clock, warmup_ms)
        if not graph:
            device_timing, wall = _wall_timing(fn, sync, clock, estimate_ms, budget, events=True)
            return Measurement(device=_nonzero(device_timing), wall=wall)
        # Device samples come right after the warm-up, as in triton's do_bench, and before the wall
        # samples, so that power-limited kernels are timed from a comparable thermal state.
        flush = _l2_flusher() if flush_l2 else None
        timing = _graph_timing(fn, budget, flush)
        if timing is None:
            timing = _profiler_timing(fn, budget.reps(estimate_ms))
        if timing is None or timing.method == "cuda-graph":
            # A graph can run the same work differently (a device copy becomes a copy-engine node, measured
            # 23% slower than the copy kernel eager calls use on an H100): keep the faster of the two.
            events = Timing(tuple(_event_samples(fn, budget.reps(estimate_ms), flush, 1)), "cuda-events")
            if timing is None or events.median_ms < timing.median_ms:
                timing = events
        del flush
        _, wall = _wall_timing(fn, sync, clock, estimate_ms, budget)
        return Measurement(device=_nonzero(timing), wall=wall)


def _no_sync() -> None:
    pass


def _nonzero(timing: Timing) -> Timing:
    if timing.median_ms <= 0:
        raise RuntimeError(
            f"median {timing.method} time is {timing.median_ms} ms: the callable did no measurable work"
        )
    return timing


def _warm_up(
    fn: Callable[[], object], sync: Callable[[], None], clock: Callable[[], float], warmup_ms: float
) -> float:
    """Call fn (synchronized) >= 3 times and for >= warmup_ms; return the fastest call, ms."""
    sync()
    start = clock()
    calls, fastest_ms, now = 0, math.inf, start
    while calls < _WARMUP_CALLS or (now - start) * 1e3 < warmup_ms:
        before = clock()
        fn()
        sync()
        now = clock()
        fastest_ms = min(fastest_ms, (now - before) * 1e3)
        calls += 1
    return fastest_ms


def _wall_timing(
    fn: Callable[[], object],
    sync: Callable[[], None],
    clock: Callable[[], float],
    estimate_ms: float,
    budget: _Budget,
    events: bool = False,
) -> tuple[Timing | None, Timing]:
    """(device, wall) ms per call of samples that each repeat fn for about 1 ms between two syncs; the
    device timing (CUDA events around the same calls) only with ``events``, else None."""
    if estimate_ms > 0:
        calls = max(1, min(_MAX_CALLS_PER_SAMPLE, math.ceil(_WALL_SAMPLE_MS / estimate_ms)))
    else:
        calls = _MAX_CALLS_PER_SAMPLE
    samples: list[float] = []
    marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    spent_ms = 0.0
    while len(samples) < budget.max_reps and (len(samples) < budget.min_reps or spent_ms < budget.rep_ms):
        if events:
            marks.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        sync()
        start = clock()
        if events:
            marks[-1][0].record()
        for _ in range(calls):
            fn()
        if events:
            marks[-1][1].record()
        sync()
        elapsed_ms = (clock() - start) * 1e3
        samples.append(elapsed_ms / calls)
        spent_ms += elapsed_ms
    device = Timing(tuple(a.elapsed_time(b) / calls for a, b in marks), "cuda-events") if events else None
    return device, _nonzero(Timing(tuple(samples), "perf-counter"))


def _l2_flusher() -> Callable[[], object]:
    """A callable that overwrites 2x the current device's L2 cache (256 MiB if unknown)."""
    l2_bytes = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
    buffer = torch.empty(2 * l2_bytes if l2_bytes > 0 else 256 << 20, dtype=torch.uint8, device="cuda")
    return buffer.zero_


def _event_samples(
    launch: Callable[[], object], reps: int, flush: Callable[[], object] | None, calls_per_launch: int
) -> list[float]:
    """Device ms per call of reps back-to-back launches, each bracketed by CUDA events."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends, strict=True):
        if flush is not None:
            flush()
        start.record()
        launch()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / calls_per_launch for start, end in zip(starts, ends, strict=True)]


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _capture_stream() -> torch.cuda.Stream:
    """The one side stream every capture on the current device uses.

    With a new stream per capture (until 61d5c0a), the memory allocated before each linear+CE case grew by
    about 100 MB per case over the first 14 cases of a process, then stayed flat (cuBLAS keeps a workspace
    per stream and PyTorch's stream pool wraps after 32: the suspected cause). Each capture still gets its
    own private memory pool: with one pool shared by all captures (9e238a7), later captures failed on an
    H100 (in the tests, the first capture after a failed one; in the kernel grid, 55 of 77 fwd+bwd
    captures, taken after their forward's), and those timings fell back to the profiler."""
    device = torch.cuda.current_device()
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream()
    return _CAPTURE_STREAMS[device]


def _capture(fn: Callable[[], object], calls: int, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph | None:
    """A graph of `calls` back-to-back calls of fn, or None (and CUDA left usable) if capture fails."""
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    rng = generator.clone_state()
    graph: torch.cuda.CUDAGraph | None = torch.cuda.CUDAGraph()
    try:
        # The outer stream context restores the current stream even when capture_end raises.
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                for _ in range(calls):
                    fn()
    except Exception:  # host sync, CPU-side work, unsupported op: the caller falls back
        graph = None
    if graph is None:
        # A capture that fails in capture_end leaves the default generator in capture mode, and every
        # later eager RNG call raises: point the generator at a copy of its pre-capture state.
        generator.graphsafe_set_state(rng)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return graph


def _graph_timing(
    fn: Callable[[], object], budget: _Budget, flush: Callable[[], object] | None
) -> Timing | None:
    """Device ms per call from CUDA-graph replays timed by events; None if fn cannot be captured."""
    stream = _capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on the capture stream, as PyTorch requires
        for _ in range(_WARMUP_CALLS):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = _capture(fn, 1, stream)
    if graph is None:
        return None
    call_ms = float(np.median(_event_samples(graph.replay, _WARMUP_CALLS, None, 1)))
    calls = max(1, min(_MAX_CALLS_PER_GRAPH, math.ceil(_REPLAY_MS / call_ms))) if call_ms > 0 else 1
    if calls > 1:
        del graph
        graph = _capture(fn, calls, stream)
        if graph is None:
            return None
    samples = _event_samples(graph.replay, budget.reps(calls * call_ms), flush, calls)
    return Timing(tuple(samples), "cuda-graph")


def _profiler_timing(fn: Callable[[], object], reps: int) -> Timing | None:
    """Per-call sums of device activity (kernels, memcpy, memset) durations, ms; None if unavailable.

    Each call is synchronized inside its own profiler range, so a device event belongs to the call
    whose host range contains its start. Work on concurrent streams is summed, not overlapped.
    """
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                with record_function(_MARK):
                    fn()
                    torch.cuda.synchronize()
        events = list(prof.events())
    except (RuntimeError, AttributeError):
        return None
    calls = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.name == _MARK and e.device_type == DeviceType.CPU
    )
    device_events = sorted(
        (e.time_range.start, e.time_range.elapsed_us())
        for e in events
        if e.device_type == DeviceType.CUDA and not e.is_user_annotation
    )
    if len(calls) != reps or not device_events:
        return None
    starts = [start for start, _ in device_events]
    samples = []
    for begin, end in calls:
        lo, hi = bisect.bisect_left(starts, begin), bisect.bisect_right(starts, end)
        samples.append(sum(us for _, us in device_events[lo:hi]) / 1e3)
    return Timing(tuple(samples), "profiler")
