import contextlib
import gc
import json
import math
import statistics
import time
import weakref

import pytest
import torch

from optbench.measure import timing
from optbench.measure.timing import (
    Measurement,
    Timing,
    graph_calls,
    measure,
    rotation_sets,
    sync_clock,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# the timed tensors are drawn from torch's generators, seeded for each test
pytestmark = pytest.mark.usefixtures("seeded")

# Durations are multiples of 2**-9 s (1.953125 ms) or 2**-13 s, exact in binary floating point.
UNIT_S = 2.0**-9
UNIT_MS = UNIT_S * 1e3


class FakeClock:
    """A clock in seconds that only moves when a fake workload advances it; counts the calls."""

    def __init__(self, durations_s: list[float]):
        self.now = 0.0
        self.calls = 0
        self._durations = durations_s

    def __call__(self) -> float:
        return self.now

    def work(self) -> None:
        self.now += self._durations[self.calls % len(self._durations)]
        self.calls += 1


def test_constant_work_gives_exact_samples_and_counts():
    clock = FakeClock([2 * UNIT_S])
    m = measure(
        clock.work, warmup_ms=0, rep_ms=10 * 2 * UNIT_MS, min_reps=5, max_reps=100, clock=clock
    )
    assert m.device is None
    assert m.wall.method == "perf-counter"
    assert m.wall.n == 10  # samples continue until rep_ms is spent
    assert clock.calls == 3 + 10  # 3 warm-up calls, then one call per sample (each >= 1 ms)
    assert m.wall.samples_ms == (2 * UNIT_MS,) * 10
    assert m.wall.median_ms == 2 * UNIT_MS
    assert m.wall.iqr_ms == 0


def test_median_and_iqr_over_varying_samples():
    clock = FakeClock([UNIT_S, 2 * UNIT_S, 3 * UNIT_S, 4 * UNIT_S])
    m = measure(clock.work, warmup_ms=0, rep_ms=0, min_reps=8, max_reps=8, clock=clock)
    # warm-up consumes durations 1, 2, 3; the samples are 4, 1, 2, 3, 4, 1, 2, 3 units
    assert m.wall.samples_ms == tuple(u * UNIT_MS for u in (4, 1, 2, 3, 4, 1, 2, 3))
    assert m.wall.median_ms == 2.5 * UNIT_MS
    assert m.wall.q25_ms == 1.75 * UNIT_MS  # numpy's linear interpolation
    assert m.wall.q75_ms == 3.25 * UNIT_MS
    assert m.wall.iqr_ms == 1.5 * UNIT_MS


def test_short_calls_are_repeated_within_a_sample():
    call_s = 2.0**-13  # 0.1220703125 ms: ceil(1 ms / that) = 9 calls per sample
    clock = FakeClock([call_s])
    m = measure(clock.work, warmup_ms=0, rep_ms=0, min_reps=4, max_reps=4, clock=clock)
    assert m.wall.n == 4
    assert clock.calls == 3 + 4 * 9
    assert m.wall.median_ms == pytest.approx(call_s * 1e3, rel=1e-12)


def test_warmup_runs_until_warmup_ms_has_passed():
    clock = FakeClock([2 * UNIT_S])  # 3.90625 ms per call: 6 calls pass 20 ms
    m = measure(clock.work, warmup_ms=20, rep_ms=0, min_reps=2, max_reps=2, clock=clock)
    assert clock.calls == 6 + m.wall.n == 8


def test_max_reps_caps_the_samples():
    clock = FakeClock([2 * UNIT_S])
    m = measure(clock.work, warmup_ms=0, rep_ms=1e9, min_reps=1, max_reps=7, clock=clock)
    assert m.wall.n == 7


def test_zero_length_work_raises():
    clock = FakeClock([0.0])
    with pytest.raises(RuntimeError, match="no measurable work"):
        measure(clock.work, warmup_ms=0, rep_ms=0, min_reps=1, max_reps=1, clock=clock)


@pytest.mark.parametrize("min_reps, max_reps", [(0, 5), (6, 5)])
def test_bad_rep_bounds_raise(min_reps, max_reps):
    with pytest.raises(ValueError):
        measure(lambda: None, min_reps=min_reps, max_reps=max_reps)


def test_unsupported_device_raises():
    with pytest.raises(ValueError, match="meta"):
        measure(lambda: None, device="meta")


def test_real_cpu_callable():
    x = torch.randn(256, 256)
    m = measure(lambda: x @ x, warmup_ms=1, rep_ms=5, min_reps=3)
    assert m.device is None
    assert m.wall.n >= 3
    assert m.wall.median_ms > 0


def test_a_cpu_timing_runs_on_one_torch_thread_and_gives_the_threads_back():
    """Mutation: measure without one_thread on a CPU (every call then sees two threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: list[int] = []
        measure(lambda: seen.append(torch.get_num_threads()), warmup_ms=0, rep_ms=0, min_reps=3)
        assert set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_wall_samples_say_which_clock_timed_them():
    """A caller's clock other than perf_counter is named only where it is the thread's CPU time."""
    thread = measure(lambda: None, warmup_ms=0, rep_ms=0, min_reps=3, clock=time.thread_time)
    assert thread.wall.method == "thread-time"
    assert measure(lambda: None, warmup_ms=0, rep_ms=0, min_reps=3).wall.method == "perf-counter"


def test_timing_round_trips_through_json():
    t = Timing((3.0, 1.0, 2.0, 5.0), "cuda-graph")
    d = json.loads(json.dumps(t.to_dict()))
    assert d["median_ms"] == statistics.median([3.0, 1.0, 2.0, 5.0]) == 2.5
    assert d["n"] == 4
    assert d["iqr_ms"] == d["q75_ms"] - d["q25_ms"]
    assert Timing.from_dict(d) == t


def test_measurement_round_trips_through_json():
    for m in (
        Measurement(device=None, wall=Timing((1.0, 2.0), "perf-counter")),
        Measurement(device=Timing((0.5,), "profiler"), wall=Timing((1.0,), "perf-counter")),
        Measurement(
            device=Timing((0.5,), "cuda-graph"),
            wall=Timing((1.0,), "perf-counter"),
            device_warm=Timing((0.25,), "cuda-events"),
        ),
    ):
        assert Measurement.from_dict(json.loads(json.dumps(m.to_dict()))) == m


def test_a_measurement_stores_the_cold_device_the_warm_device_and_the_wall_clock():
    """The record shape compare and the report read: metrics[metric][clock], clock in device (cold
    L2), device_warm, wall; a record from before the warm clock reads back with device_warm None."""
    m = Measurement(
        device=Timing((0.5,), "cuda-graph"),
        wall=Timing((1.0,), "perf-counter"),
        device_warm=Timing((0.25,), "cuda-graph"),
    )
    d = m.to_dict()
    assert list(d) == ["device", "device_warm", "wall"]
    assert d["device"]["median_ms"] == 0.5 and d["device_warm"]["median_ms"] == 0.25
    assert Measurement.from_dict({"device": d["device"], "wall": d["wall"]}).device_warm is None


def test_timing_validates():
    with pytest.raises(ValueError):
        Timing((), "perf-counter")
    with pytest.raises(ValueError):
        Timing((1.0,), "stopwatch")


def test_sync_clock_is_perf_counter_seconds():
    a = sync_clock()
    b = sync_clock()
    assert isinstance(a, float) and b >= a


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_timing_of_a_matmul():
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    m = measure(lambda: a @ a, device="cuda", rep_ms=20)
    assert m.device is not None and m.device.method in ("cuda-graph", "cuda-events")
    assert 0 < m.device.median_ms <= m.wall.median_ms * 1.5


@pytest.mark.gpu
@needs_cuda
def test_uncapturable_callable_falls_back_and_leaves_cuda_usable():
    x = torch.randn(1 << 20, device="cuda")
    m = measure(lambda: (x * 2).sum().item(), device="cuda", rep_ms=10)  # .item() syncs: no capture
    assert m.device is not None and m.device.method in ("profiler", "cuda-events")
    assert m.device.median_ms > 0
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert (x * 0 + 1).sum().item() == x.numel()
    assert torch.randn(4, device="cuda").isfinite().all()  # the failed capture left the RNG usable


@pytest.mark.gpu
@needs_cuda
def test_captures_follow_one_another_in_a_process():
    """A forward, its forward+backward, then the forward again after an uncapturable callable: every
    one is captured (with one memory pool shared by all captures, 9e238a7, the later captures failed
    on an H100 and the kernel suite fell back to profiler timings)."""
    from optbench.measure.timing import _Budget, _graph_timing, _Rotation

    lin = torch.nn.Linear(256, 256, device="cuda")
    x = torch.randn(64, 256, device="cuda", requires_grad=True)

    def fwdbwd():
        lin(x).sum().backward()

    budget = _Budget(5.0, 3, 10)
    assert _graph_timing(_Rotation([lambda: lin(x)]), budget) is not None
    assert _graph_timing(_Rotation([fwdbwd]), budget) is not None
    assert _graph_timing(_Rotation([lambda: x.sum().item()]), budget) is None
    assert _graph_timing(_Rotation([lambda: lin(x)]), budget) is not None


@pytest.mark.gpu
@needs_cuda
def test_without_graph_one_set_of_calls_gives_both_clocks():
    calls = []
    spin = lambda: (calls.append(1), torch.cuda._sleep(4_000_000))  # noqa: E731 - over 1 ms: one call per sample
    m = measure(spin, device="cuda", warmup_ms=0, rep_ms=0, min_reps=5, max_reps=5, graph=False)
    assert m.device.method == "cuda-events" and m.device.n == m.wall.n == 5
    assert len(calls) == 3 + 5  # the warm-up, then the five samples: no separate device pass
    assert 0 < m.device.median_ms <= m.wall.median_ms * 1.05


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("case", ["bf16-matmul-8192", "copy-1gib"])
def test_agrees_with_triton_do_bench(case):
    do_bench = pytest.importorskip("triton.testing").do_bench
    if case == "copy-1gib":
        src = torch.rand(1 << 28, device="cuda")
        dst = torch.empty_like(src)
        fn = lambda: dst.copy_(src)
    else:
        a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        fn = lambda: a @ b
    ours = measure(fn, device="cuda").device.median_ms
    theirs = do_bench(fn, return_mode="median")
    assert ours == pytest.approx(theirs, rel=0.03)


# --- the cold-L2 rotation
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("set_bytes", "l2_bytes", "sets"),
    [
        (
            25 << 20,
            50 << 20,
            5,
        ),  # the other 4 sets read 100 MiB = 2x L2 between two calls on one set
        (24 << 20, 50 << 20, 6),  # 4 x 24 MiB falls short of 2x L2: one more set
        (99 << 20, 50 << 20, 3),
        (100 << 20, 50 << 20, 1),  # one set of 2x L2 evicts itself
        (1 << 30, 50 << 20, 1),
        (1 << 20, 0, 1),  # no L2
    ],
)
def test_rotation_sets(set_bytes, l2_bytes, sets):
    assert rotation_sets(set_bytes, l2_bytes) == sets


def test_rotation_sets_are_the_fewest_that_read_twice_the_l2_between_two_uses_of_a_set():
    l2 = 50 << 20
    for set_bytes in [1, 4096, 3 << 20, 12_582_912, 33 << 20, 51 << 20, (100 << 20) - 1]:
        n = rotation_sets(set_bytes, l2)
        assert (n - 1) * set_bytes >= 2 * l2 > (n - 2) * set_bytes, set_bytes


@pytest.mark.parametrize(("set_bytes", "l2_bytes"), [(0, 1), (1, -1)])
def test_rotation_sets_rejects_bad_sizes(set_bytes, l2_bytes):
    with pytest.raises(ValueError):
        rotation_sets(set_bytes, l2_bytes)


@pytest.mark.parametrize("period", [1, 3, 7, 1000, 1500])
@pytest.mark.parametrize("round_ms", [0.0, 1e-4, 0.01, 0.3, 5.0])
def test_a_graph_holds_whole_rounds_of_the_rotation(round_ms, period):
    calls = graph_calls(round_ms, period)
    assert calls % period == 0 and calls >= period  # every set, as often as the others
    assert calls <= max(1000, period)
    if round_ms > 0 and calls > period:
        assert (calls / period - 1) * round_ms < 0.5  # no more rounds than about 0.5 ms needs


class Sets:
    """Input-set callables that each advance a FakeClock by one unit and log their index."""

    def __init__(self, n: int):
        self.clock = FakeClock([UNIT_S])
        self.log: list[int] = []
        self.fns = [lambda i=i: (self.log.append(i), self.clock.work()) for i in range(n)]


def test_wall_samples_rotate_over_every_set_in_turn():
    sets = Sets(3)
    m = measure(sets.fns, warmup_ms=0, rep_ms=0, min_reps=5, max_reps=5, clock=sets.clock)
    assert m.wall.n == 5 and m.device is None
    assert sets.log == [i % 3 for i in range(len(sets.log))]  # 0, 1, 2, 0, 1, 2, ...
    assert len(sets.log) == 3 + 5  # the warm-up calls each set once, then one call per sample


def test_the_warm_up_calls_every_set():
    sets = Sets(5)
    measure(sets.fns, warmup_ms=0, rep_ms=0, min_reps=1, max_reps=1, clock=sets.clock)
    assert sets.log[:5] == [0, 1, 2, 3, 4]


def test_a_rotation_keeps_each_sets_last_output_until_its_next_call():
    """Every set writes its outputs to memory of its own: set i's output lives while the other sets
    run, and is freed before set i runs again (so its memory serves set i's next output)."""

    class Out:
        pass

    last: dict[int, weakref.ref] = {}
    alive_at_call: list[bool] = []

    def make(i):
        def call():
            if i in last:
                gc.collect()
                alive_at_call.append(last[i]() is not None)
            out = Out()
            last[i] = weakref.ref(out)
            return out

        return call

    rotation = timing._Rotation([make(0), make(1)])
    rotation()
    rotation()
    assert last[0]() is not None and last[1]() is not None  # both kept after the other set ran
    rotation()
    assert alive_at_call == [False]  # set 0's old output was dropped before set 0 ran again
    rotation.release()
    gc.collect()
    assert last[0]() is None and last[1]() is None


def sets_seen(monkeypatch, timer, n_sets: int, graph_ok: bool = True) -> tuple[float, float]:
    """(device, device_warm) medians of ``timer`` on n_sets input sets, its CUDA path run on a CPU:
    no device context or sync, a fake graph timing (None where not ``graph_ok``) and fake event
    samples that call what they are given and report, as their time, how many different sets it
    called (events: + 0.5 where the graph works, so that the graph's figure is kept)."""
    sets = Sets(n_sets)

    def different_sets(start: int) -> float:
        return float(len(set(sets.log[start:])))

    def graph_timing(rotation, budget):
        start = len(sets.log)
        for _ in range(graph_calls(0.01, rotation.period)):
            rotation()
        return Timing((different_sets(start),), "cuda-graph") if graph_ok else None

    def event_samples(launch, reps, calls_per_launch):
        start = len(sets.log)
        for _ in range(max(reps, 4) * calls_per_launch):
            launch()
        return [different_sets(start) + (0.5 if graph_ok else 0.0)] * reps

    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(timing, "_graph_timing", graph_timing)
    monkeypatch.setattr(timing, "_profiler_timing", lambda fn, reps: None)
    monkeypatch.setattr(timing, "_event_samples", event_samples)
    m = timer(
        sets.fns, device="cuda", warmup_ms=0, rep_ms=0, min_reps=3, max_reps=3, clock=sets.clock
    )
    return m.device.median_ms, m.device_warm.median_ms


@pytest.mark.parametrize("graph_ok", [True, False], ids=["graph", "events"])
def test_the_cold_device_time_rotates_over_every_set_and_the_warm_one_uses_the_first(
    monkeypatch, graph_ok
):
    assert sets_seen(monkeypatch, measure, 4, graph_ok) == (4.0, 1.0)
    # one set: one timing, cold and warm alike
    assert sets_seen(monkeypatch, measure, 1, graph_ok) == (1.0, 1.0)


def test_mutation_a_timer_that_reuses_one_set_for_the_cold_figure_is_caught(monkeypatch):
    def reusing(fns, **kw):
        return measure(fns[:1], **kw)

    assert sets_seen(monkeypatch, reusing, 4) != (4.0, 1.0)


@pytest.mark.gpu
@needs_cuda
def test_the_graph_rotates_over_every_set_on_a_gpu():
    xs = [torch.randn(1 << 20, device="cuda") for _ in range(3)]
    calls = [0, 0, 0]

    def call(i):
        calls[i] += 1
        return xs[i] * 2

    m = measure([lambda i=i: call(i) for i in range(3)], device="cuda", rep_ms=10)
    assert (
        m.device.method == "cuda-graph"
        and m.device_warm is not None
        and m.device_warm is not m.device
    )
    assert min(calls) > 0 and max(calls) - min(calls) <= 1


@pytest.mark.gpu
@needs_cuda
def test_a_cold_copy_is_not_faster_than_hbm_allows():
    """An 8 MiB copy fits in any H100's L2: warm, it may beat HBM; over a rotation of sets sized by
    rotation_sets its device time cannot beat the profile's HBM bandwidth."""
    from optbench.measure.hardware import detect
    from optbench.measure.roofline import Ceilings

    n_bytes = 8 << 20
    count = rotation_sets(2 * n_bytes, timing.l2_cache_bytes("cuda"))
    pairs = [
        (torch.rand(n_bytes // 4, device="cuda"), torch.empty(n_bytes // 4, device="cuda"))
        for _ in range(count)
    ]
    m = measure([lambda s=s, d=d: d.copy_(s) for s, d in pairs], device="cuda")
    floor_ms = 2 * n_bytes / (Ceilings.from_profile(detect()).bandwidth_gbps * 1e9) * 1e3
    assert m.device.median_ms > floor_ms
    assert math.isfinite(m.device_warm.median_ms)


@pytest.mark.parametrize("op_name", ["rmsnorm", "linear_ce"])
def test_a_kernel_case_draws_the_sets_its_rotation_needs(op_name):
    """optbench.suite.workloads.input_sets on a CPU: set 0 is the single set drawn before, then
    fresh random sets up to rotation_sets of one set's bytes (inputs and output gradients)."""
    from optbench.suite.ops import OPS
    from optbench.suite.workloads import input_sets, set_bytes

    op = OPS[op_name]
    dims = (
        {"rows": 64, "hidden": 32}
        if op_name == "rmsnorm"
        else {"tokens": 16, "hidden": 8, "vocab": 24}
    )
    fn = op.impl(op.impls[0], dims)
    one = set_bytes(
        input_sets(op, dims, torch.float32, "cpu", torch.Generator().manual_seed(0), fn, 0)[0]
    )
    sets = input_sets(op, dims, torch.float32, "cpu", torch.Generator().manual_seed(0), fn, 3 * one)
    assert len(sets) == rotation_sets(one, 3 * one) == 7
    single = op.make_inputs(dims, torch.float32, "cpu", torch.Generator().manual_seed(0))
    # the checked set is drawn as before
    assert all(torch.equal(a, b) for a, b in zip(sets[0][0], single))
    firsts = [s[0][0] for s in sets]
    # fresh data each
    assert all(not torch.equal(firsts[i], firsts[j]) for i in range(7) for j in range(i))
    assert all(set_bytes(s) == one for s in sets)
    if op.loss_like:
        assert all(g.shape == () and g.item() == 1.0 for s in sets for g in s[1])
    else:
        assert all(g.shape == fn(*sets[0][0]).shape for s in sets for g in s[1])
    assert (
        len(
            input_sets(
                op, dims, torch.float32, "cpu", torch.Generator().manual_seed(0), fn, one // 2
            )
        )
        == 1
    )
