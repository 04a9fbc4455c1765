"""The one timing primitive of optbench: repeated wall-clock and device timings of a callable, or of
a rotation of callables over input sets (one per set) for device times with a cold L2."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from optbench.measure.lockstep import Turns

METHODS: tuple[str, ...] = ("cuda-graph", "cuda-events", "profiler", "perf-counter", "thread-time")
# the method of wall samples timed by a clock other than perf_counter (or a caller's own clock)
_CLOCK_METHODS: dict[Callable[[], float], str] = {time.thread_time: "thread-time"}

_WARMUP_CALLS = 3  # at least this many calls before anything is timed
_WALL_SAMPLE_MS = 1.0  # a wall sample repeats fn until it lasts about this long...
_MAX_CALLS_PER_SAMPLE = 10_000  # ...but at most this many calls
_REPLAY_MS = 0.5  # a graph replay holds enough calls to last about this long...
_MAX_CALLS_PER_GRAPH = 1_000  # ...but at most this many calls
_MARK = "optbench::measure-call"  # profiler range around one call in the profiler fallback
# a cold set: this many L2 sizes of other sets' data are read between two calls on it
_L2_MARGIN = 2


@dataclass(frozen=True)
class Timing:
    """Repeated timings of one callable, milliseconds per call."""

    samples_ms: tuple[float, ...]
    method: str  # one of METHODS

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
    """Device time and wall time of one callable (or rotation), ms per call.

    ``device``: over the rotation (a cold L2 where the caller's input sets exceed it,
    :func:`rotation_sets`); ``device_warm``: back-to-back calls on the first input set alone (its
    data warm in L2 where it fits; the same timing as ``device`` for one set); ``wall``:
    synchronized perf_counter over the rotation. ``device`` and ``device_warm`` are None on CPU;
    ``device_warm`` also with graph=False.
    """

    device: Timing | None
    wall: Timing
    device_warm: Timing | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: {'device', 'device_warm', 'wall'}, a Timing dict or None each."""
        return {
            clock: timing.to_dict() if timing else None
            for clock, timing in (
                ("device", self.device),
                ("device_warm", self.device_warm),
                ("wall", self.wall),
            )
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """Inverse of to_dict (a dict without 'device_warm' gives None)."""

        def timing(clock: str) -> Timing | None:
            return Timing.from_dict(data[clock]) if data.get(clock) else None

        return cls(
            device=timing("device"),
            wall=Timing.from_dict(data["wall"]),
            device_warm=timing("device_warm"),
        )


def l2_cache_bytes(device: str | torch.device) -> int:
    """L2 cache size of a CUDA device, bytes."""
    return int(torch.cuda.get_device_properties(torch.device(device)).L2_cache_size)


def rotation_sets(set_bytes: int, l2_bytes: int) -> int:
    """How many input sets of ``set_bytes`` each a rotation needs for cold-L2 calls on an
    ``l2_bytes`` cache.

    Between two calls on one set the other sets are read, at least 2x the L2 in all: 1 + ceil(2 L2 /
    set). One set where it alone is at least 2x the L2 (a call then evicts its own data before it
    reads it again).
    """
    if set_bytes <= 0 or l2_bytes < 0:
        raise ValueError(f"need set_bytes > 0 and l2_bytes >= 0, got {set_bytes}, {l2_bytes}")
    flushing = _L2_MARGIN * l2_bytes
    return 1 if set_bytes >= flushing else 1 + math.ceil(flushing / set_bytes)


class _Rotation:
    """A callable that calls its callables in turn, one per call, and keeps each one's last output
    until its next call, so that every input set writes its outputs to memory of its own."""

    def __init__(self, fns: Sequence[Callable[[], object]]):
        if not fns:
            raise ValueError("a rotation needs at least one callable")
        self.fns = tuple(fns)
        self._outputs: list[object] = [None] * len(self.fns)
        self._next = 0

    @property
    def period(self) -> int:
        """Calls per round: one per input set."""
        return len(self.fns)

    def __call__(self) -> None:
        i = self._next
        self._outputs[i] = None  # freed first: its memory serves this set's next output
        self._outputs[i] = self.fns[i]()
        self._next = (i + 1) % self.period

    def release(self) -> None:
        """Drop the kept outputs (e.g. those allocated in a graph's memory pool)."""
        self._outputs = [None] * self.period


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
    fn: Callable[[], object] | Sequence[Callable[[], object]],
    *,
    device: str | torch.device = "cpu",
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_reps: int = 10,
    max_reps: int = 1000,
    graph: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    settled: Callable[[float], bool] | None = None,
    held_min_reps: int | None = None,
    turns: Turns | None = None,
) -> Measurement:
    """Time fn: wall milliseconds per call always, device milliseconds per call on CUDA.

    fn is one callable, or a rotation: one callable per input set, called in turn (the first set
    after the last), each keeping its last output until its next call. With sets sized by
    :func:`rotation_sets`, every call finds its inputs out of L2 and ``device`` is a cold-L2 time;
    ``device_warm`` times the first set alone. The rotation is called at least 3 times, at least
    once per set, and until warmup_ms of wall time passed, or until ``settled(elapsed_ms)``, asked
    after each warm-up call, says the device has reached its steady state
    (:class:`optbench.measure.machine.PowerSettle`: a clock no power cap or heat holds back). A wall
    sample repeats it until it lasts about 1 ms (synchronizing CUDA around it, timed with `clock`,
    seconds); samples are taken until rep_ms is spent, at least min_reps and at most max_reps of
    them; at least ``held_min_reps`` where ``settled`` never said so (a GPU held at its power cap
    through the warm-up, whose clock swings over a second or so: samples within one swing have a
    median that moves with its phase). On a CPU the warm-up and the samples run on one torch thread
    (:func:`one_thread`). Device time: with graph=True, replays of a CUDA graph of k back-to-back
    calls (k a multiple of the sets, so that a replay lasts about 0.5 ms; one round for long calls)
    timed with CUDA events: no host launch gap is in the figure. If the calls cannot be captured,
    the per-call sum of device-kernel durations from torch.profiler, and if that fails, CUDA events
    around each eager call. Where the graph was timed, eager calls over the same rotation timed by
    events are measured too and the faster median is kept (for long calls the launch gaps the graph
    removes are negligible, and a graph may execute some operations, like copies, differently). With
    graph=False (whole training steps, whose wall time is the primary figure) each wall sample is
    also bracketed by CUDA events, so one set of calls gives both clocks. With ``turns`` (a lockstep
    partner's, :mod:`optbench.measure.lockstep`) the wall samples are exactly ``turns.samples``,
    each taken in this process's turn. Raises RuntimeError if a median comes out as 0 (nothing
    measurable was timed)."""
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got {min_reps}, {max_reps}")
    sets = tuple(fn) if isinstance(fn, Sequence) else (fn,)
    rotation = _Rotation(sets)
    dev = torch.device(device)

    def budget_after(held: bool) -> _Budget:
        least = max(min_reps, held_min_reps or 0) if held else min_reps
        return _Budget(rep_ms, least, max(max_reps, least))

    if dev.type == "cpu":
        with one_thread():
            estimate_ms, held = _warm_up(rotation, _no_sync, clock, warmup_ms, settled)
            budget = budget_after(held)
            _, wall = _wall_timing(rotation, _no_sync, clock, estimate_ms, budget, turns=turns)
        return Measurement(device=None, wall=wall)
    if dev.type != "cuda":
        raise ValueError(f"measure() supports cpu and cuda devices, not {dev.type!r}")
    with torch.cuda.device(dev):
        sync = torch.cuda.synchronize
        estimate_ms, held = _warm_up(rotation, sync, clock, warmup_ms, settled)
        budget = budget_after(held)
        if not graph:
            device_timing, wall = _wall_timing(
                rotation, sync, clock, estimate_ms, budget, events=True, turns=turns
            )
            return Measurement(device=_nonzero(device_timing), wall=wall)
        # Device samples come right after the warm-up, as in triton's do_bench, and before the wall
        # samples, so that power-limited kernels are timed from a comparable thermal state.
        cold = _device_timing(rotation, budget, estimate_ms)
        warm = cold if len(sets) == 1 else _device_timing(_Rotation(sets[:1]), budget, estimate_ms)
        _, wall = _wall_timing(rotation, sync, clock, estimate_ms, budget, turns=turns)
        return Measurement(device=cold, wall=wall, device_warm=warm)


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to one inside the block, restored after. What a CPU times runs
    on one thread: on a CPU that other processes share, several threads per call wait for each
    other's cores and slow a call down many times over, at random."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _device_timing(rotation: _Rotation, budget: _Budget, estimate_ms: float) -> Timing:
    """Device ms per call of the rotation: graph replays, else the profiler; the faster of that and
    eager calls timed by events, where the graph was timed or the profiler failed."""
    timing = _graph_timing(rotation, budget)
    if timing is None:
        timing = _profiler_timing(rotation, budget.reps(estimate_ms))
    if timing is None or timing.method == "cuda-graph":
        # A graph can run the same work differently (a device copy becomes a copy-engine node, which
        # can be slower than the copy kernel eager calls launch): keep the faster of the two.
        events = Timing(tuple(_event_samples(rotation, budget.reps(estimate_ms), 1)), "cuda-events")
        if timing is None or events.median_ms < timing.median_ms:
            timing = events
    rotation.release()
    return _nonzero(timing)


def _no_sync() -> None:
    pass


def _nonzero(timing: Timing) -> Timing:
    if timing.median_ms <= 0:
        raise RuntimeError(
            f"median {timing.method} time is {timing.median_ms} ms: the callable did no measurable "
            "work"
        )
    return timing


def _warm_up(
    rotation: _Rotation,
    sync: Callable[[], None],
    clock: Callable[[], float],
    warmup_ms: float,
    settled: Callable[[float], bool] | None = None,
) -> tuple[float, bool]:
    """Call the rotation (synchronized) >= 3 times, once per set at least, and for >= warmup_ms
    unless ``settled(elapsed_ms)`` is true first; return the fastest call, ms, and whether the
    device stayed held back (``settled`` given and never true)."""
    sync()
    start = clock()
    calls, fastest_ms, now, held = 0, math.inf, start, settled is not None

    def warming() -> bool:
        nonlocal held
        elapsed_ms = (now - start) * 1e3
        if elapsed_ms >= warmup_ms:
            return False
        if settled is not None and calls > 0 and settled(elapsed_ms):
            held = False
            return False
        return True

    while calls < max(_WARMUP_CALLS, rotation.period) or warming():
        before = clock()
        rotation()
        sync()
        now = clock()
        fastest_ms = min(fastest_ms, (now - before) * 1e3)
        calls += 1
    return fastest_ms, held


def _wall_timing(
    fn: Callable[[], object],
    sync: Callable[[], None],
    clock: Callable[[], float],
    estimate_ms: float,
    budget: _Budget,
    events: bool = False,
    turns: Turns | None = None,
) -> tuple[Timing | None, Timing]:
    """(device, wall) ms per call of samples that each repeat fn for about 1 ms between two syncs;
    the device timing (CUDA events around the same calls) only with ``events``, else None. With
    ``turns``, exactly ``turns.samples`` samples, each in this process's turn."""
    if estimate_ms > 0:
        calls = max(1, min(_MAX_CALLS_PER_SAMPLE, math.ceil(_WALL_SAMPLE_MS / estimate_ms)))
    else:
        calls = _MAX_CALLS_PER_SAMPLE
    samples: list[float] = []
    marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    spent_ms = 0.0

    def more() -> bool:
        if turns is not None:
            return len(samples) < turns.samples
        return len(samples) < budget.max_reps and (
            len(samples) < budget.min_reps or spent_ms < budget.rep_ms
        )

    while more():
        with turns() if turns is not None else nullcontext():
            spent_ms += _wall_sample(fn, sync, clock, calls, samples, marks if events else None)
    device = (
        Timing(tuple(a.elapsed_time(b) / calls for a, b in marks), "cuda-events")
        if events
        else None
    )
    return device, _nonzero(Timing(tuple(samples), _CLOCK_METHODS.get(clock, "perf-counter")))


def _wall_sample(
    fn: Callable[[], object],
    sync: Callable[[], None],
    clock: Callable[[], float],
    calls: int,
    samples: list[float],
    marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None,
) -> float:
    """One wall sample of ``calls`` calls of fn, appended to ``samples`` (and its CUDA events to
    ``marks`` where given); returns its ms."""
    if marks is not None:
        marks.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
    sync()
    start = clock()
    if marks is not None:
        marks[-1][0].record()
    for _ in range(calls):
        fn()
    if marks is not None:
        marks[-1][1].record()
    sync()
    elapsed_ms = (clock() - start) * 1e3
    samples.append(elapsed_ms / calls)
    return elapsed_ms


def _event_samples(launch: Callable[[], object], reps: int, calls_per_launch: int) -> list[float]:
    """Device ms per call of reps back-to-back launches, each bracketed by CUDA events."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        launch()
        end.record()
    torch.cuda.synchronize()
    return [
        start.elapsed_time(end) / calls_per_launch for start, end in zip(starts, ends, strict=True)
    ]


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _capture_stream() -> torch.cuda.Stream:
    """The side stream every capture on the current device uses: one per device for the process's
    lifetime.

    One stream, not one per capture: cuBLAS keeps a workspace per stream, so a stream per capture
    grows the memory a process holds from case to case. Each capture still gets a private memory
    pool of its own (:func:`_capture` passes none to share): captures that share a pool can fail
    after another capture, and their timings then fall back to the profiler."""
    device = torch.cuda.current_device()
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream()
    return _CAPTURE_STREAMS[device]


def _capture(
    fn: Callable[[], object], calls: int, stream: torch.cuda.Stream
) -> torch.cuda.CUDAGraph | None:
    """A graph of `calls` back-to-back calls of fn, or None (and CUDA left usable) if capture
    fails."""
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
        # A capture that fails in capture_end leaves the default generator in capture mode, and
        # every later eager RNG call raises: point the generator at a copy of its pre-capture state.
        generator.graphsafe_set_state(rng)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return graph


def graph_calls(round_ms: float, period: int) -> int:
    """Calls in one captured graph: whole rounds of ``period`` calls (one per input set) lasting
    ``round_ms`` each, enough rounds for about 0.5 ms and at most about 1000 calls, one round at
    least."""
    if period < 1:
        raise ValueError(f"need period >= 1, got {period}")
    wanted = math.ceil(_REPLAY_MS / round_ms) if round_ms > 0 else 1
    return period * max(1, min(_MAX_CALLS_PER_GRAPH // period, wanted))


def _graph_timing(rotation: _Rotation, budget: _Budget) -> Timing | None:
    """Device ms per call from replays of a CUDA graph of whole rounds of the rotation, timed by
    events; None if it cannot be captured."""
    stream = _capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on the capture stream, as PyTorch requires
        for _ in range(max(_WARMUP_CALLS, rotation.period)):
            rotation()
    torch.cuda.current_stream().wait_stream(stream)
    graph = _capture(rotation, rotation.period, stream)
    if graph is None:
        return None
    round_ms = float(np.median(_event_samples(graph.replay, _WARMUP_CALLS, 1)))
    calls = graph_calls(round_ms, rotation.period)
    if calls > rotation.period:
        del graph
        graph = _capture(rotation, calls, stream)
        if graph is None:
            return None
    samples = _event_samples(graph.replay, budget.reps(calls * round_ms / rotation.period), calls)
    return Timing(tuple(samples), "cuda-graph")


def _profiler_timing(fn: Callable[[], object], reps: int) -> Timing | None:
    """Per-call sums of device activity (kernels, memcpy, memset) durations, ms; None if
    unavailable.

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
