"""A case's own memory (optbench.measure.memory.CaseMeter), on a fake CUDA caching allocator: what
counts (build, warm-up, capture, timing), what does not (the check, the check's reference), and
that a step replayed from a CUDA graph reads what its graph holds, not 0."""

import contextlib

import pytest
import torch

from optbench.measure import memory
from optbench.measure.memory import CaseMeter, not_counted
from optbench.run.runner import Case, Work, run_grid
from optbench.store.records import CASE_METER, CASE_PEAK, CASE_RESIDENT, Record
from optbench.store.store import ResultStore

GIB = 1 << 30


class FakeAllocator:
    """torch.cuda's memory statistics over allocations made by hand: a default pool and private
    pools (a CUDA graph's), each block its own segment."""

    def __init__(self) -> None:
        self.blocks: dict[int, tuple[int, tuple[int, int]]] = {}  # id -> (bytes, pool)
        self.private_free: dict[tuple[int, int], int] = {}  # pool -> free bytes kept reserved
        self.dead: set[tuple[int, int]] = set()  # pools whose graph was destroyed
        self.cached = 0  # the default pool's freed bytes, kept reserved until empty_cache()
        self.peak = self.reserved_peak = 0
        self._next = 0
        self.workspace: int | None = None  # cuBLAS's, once a matmul has run

    def alloc(self, nbytes: int, pool: tuple[int, int] = (0, 0)) -> int:
        self._next += 1
        self.blocks[self._next] = (nbytes, pool)
        self.peak = max(self.peak, self.allocated())
        self.reserved_peak = max(self.reserved_peak, self.reserved())
        return self._next

    def free(self, block: int) -> None:
        nbytes, pool = self.blocks.pop(block)
        if pool != (0, 0):  # a private pool keeps its segment for the graph's replays
            self.private_free[pool] = self.private_free.get(pool, 0) + nbytes
        else:
            self.cached += nbytes

    def release_pool(self, pool: tuple[int, int]) -> None:
        """The pool's graph is gone: its free segments stay reserved until empty_cache()."""
        self.dead.add(pool)

    def empty_cache(self) -> None:
        self.cached = 0
        live = {pool for _, pool in self.blocks.values()}
        for pool in [p for p in self.dead if p not in live]:
            self.private_free.pop(pool, None)

    def allocated(self) -> int:
        return sum(nbytes for nbytes, _ in self.blocks.values())

    def reserved(self) -> int:
        return self.allocated() + sum(self.private_free.values()) + self.cached

    def reset_peak(self) -> None:
        self.peak, self.reserved_peak = self.allocated(), self.reserved()

    def snapshot(self) -> list[dict]:
        segments = [
            {"segment_pool_id": pool, "total_size": nbytes, "allocated_size": nbytes}
            for nbytes, pool in self.blocks.values()
        ]
        segments += [
            {"segment_pool_id": pool, "total_size": nbytes, "allocated_size": 0}
            for pool, nbytes in self.private_free.items()
        ]
        return segments

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "synchronize", lambda *a, **k: None)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda *a, **k: self.reset_peak())
        monkeypatch.setattr(cuda, "memory_allocated", lambda *a, **k: self.allocated())
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda *a, **k: self.peak)
        monkeypatch.setattr(cuda, "memory_reserved", lambda *a, **k: self.reserved())
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda *a, **k: self.reserved_peak)
        monkeypatch.setattr(cuda, "memory_snapshot", lambda *a, **k: self.snapshot())
        monkeypatch.setattr(cuda, "empty_cache", self.empty_cache)
        monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", self.clear_workspace, False)

    def matmul(self) -> None:
        """A matmul: cuBLAS takes its workspace (32 MiB) from the allocator once and keeps it."""
        if self.workspace is None:
            self.workspace = self.alloc(32 << 20)

    def clear_workspace(self) -> None:
        if self.workspace is not None:
            self.free(self.workspace)
            self.workspace = None


@pytest.fixture
def fake(monkeypatch):
    allocator = FakeAllocator()
    allocator.install(monkeypatch)
    return allocator


def _graphed_step_build(fake: FakeAllocator) -> dict[str, int]:
    """Weights and optimizer state (1 GiB), then a capture: 2 GiB of activations in the graph's
    pool, 1.5 GiB of it freed back to the pool at the capture's end."""
    kept = {"weights": fake.alloc(GIB)}
    activations = fake.alloc(3 * GIB // 2, pool=(1, 0))
    kept["outputs"] = fake.alloc(GIB // 2, pool=(1, 0))
    fake.free(activations)
    return kept


def test_a_graphed_step_reads_what_its_graph_holds_not_zero(fake):
    earlier = fake.alloc(5 * GIB)  # what earlier cases of the process left: not this case's
    meter = CaseMeter("cuda")
    with meter.metering(), meter.counting():
        _graphed_step_build(fake)
    with meter.counting():
        pass  # replays allocate nothing
    got = meter.result()
    assert got["held_before_bytes"] == 5 * GIB
    assert got["peak_bytes"] == 3 * GIB  # weights + the capture's activations and outputs
    assert got["resident_bytes"] == 3 * GIB  # weights + the graph's whole pool
    assert got["reserved_peak_bytes"] == 3 * GIB
    fake.free(earlier)


def _captured_again(fake: FakeAllocator) -> dict[str, int]:
    """A graphed step's memory where the check captured its graph again between the counted
    phases: the first graph's pool dead (its 2 GiB cached until emptied), a live one of 2 GiB."""
    meter = CaseMeter("cuda")
    with meter.metering(), meter.counting():
        _graphed_step_build(fake)  # 3 GiB: weights and pool (1, 0)
    fake.release_pool((1, 0))
    fake.free(next(b for b, (_, pool) in fake.blocks.items() if pool == (1, 0)))
    activations = fake.alloc(3 * GIB // 2, pool=(2, 0))
    fake.alloc(GIB // 2, pool=(2, 0))
    fake.free(activations)
    with meter.counting():
        pass
    return meter.result()


def test_a_graph_captured_again_counts_only_its_live_pool(fake):
    assert _captured_again(fake)["resident_bytes"] == 3 * GIB  # weights + the live pool alone


def test_the_reserved_peak_leaves_out_what_the_check_left_cached(fake):
    assert _captured_again(fake)["reserved_peak_bytes"] == 3 * GIB


def test_the_check_and_its_reference_are_not_counted(fake):
    meter = CaseMeter("cuda")
    with meter.metering(), meter.counting():
        with not_counted():  # the check's reference: 4 GiB built, 1 GiB kept on the device
            transient = fake.alloc(3 * GIB)
            fake.alloc(GIB)
            fake.free(transient)
        fake.alloc(GIB)  # the step's weights
    scratch = fake.alloc(10 * GIB)  # the check, run between counted phases
    fake.free(scratch)
    with meter.counting():
        step = fake.alloc(GIB // 2)  # a step's activations while timed
        fake.free(step)
    got = meter.result()
    assert got["peak_bytes"] == GIB + GIB // 2
    assert got["reference_bytes"] == GIB
    assert got["resident_bytes"] == GIB
    assert got["reserved_peak_bytes"] == GIB + GIB // 2  # not the reference's 4 GiB build


def test_the_reference_kept_is_its_own_bytes_when_another_leaves_the_device(fake):
    other = fake.alloc(2 * GIB)  # another size's reference, from an earlier case
    meter = CaseMeter("cuda")
    kept: list[int] = []
    with meter.metering(), meter.counting():
        with not_counted(kept=lambda: GIB * len(kept)):
            fake.free(other)  # sent to the host
            kept.append(fake.alloc(GIB))  # this size's reference, kept on the device
        fake.alloc(GIB // 2)  # the step
    got = meter.result()
    assert got["held_before_bytes"] == 2 * GIB
    assert got["reference_bytes"] == GIB  # not the net -1 GiB
    assert got["peak_bytes"] == GIB // 2 and got["resident_bytes"] == GIB // 2


def test_an_earlier_graphs_free_pool_bytes_do_not_shrink_the_peak(fake):
    """Mutation: an earlier case's live CUDA graph keeps 1 GiB free in its pool, which the start's
    held bytes count and max_memory_allocated does not; a peak taken against the held bytes read
    this case's 2 GiB as 1 GiB (the 100M best-kernels step read 4,199 MiB after 56 cases of a full
    suite, 5,230 MiB first in its process)."""
    fake.alloc(GIB // 2, pool=(7, 0))  # an earlier graph's outputs
    fake.free(fake.alloc(GIB, pool=(7, 0)))  # its activations, freed back to its pool
    meter = CaseMeter("cuda")
    with meter.metering(), meter.counting():
        fake.alloc(2 * GIB)
    got = meter.result()
    assert got["held_before_bytes"] == GIB + GIB // 2
    assert got["peak_bytes"] == got["resident_bytes"] == 2 * GIB


def test_a_case_counts_its_cublas_workspace_first_in_its_process_or_not(fake):
    """Mutation: cuBLAS's workspace, taken by a process's first matmul and kept, counted in the
    first case and in none after it (the 100M best-kernels step: 62 MiB more resident first in its
    process)."""

    def case() -> dict[str, int]:
        meter = CaseMeter("cuda")
        with meter.metering(), meter.counting():
            fake.alloc(GIB)  # weights
            fake.matmul()
        return meter.result()

    first, second = case(), case()
    assert first["peak_bytes"] == second["peak_bytes"] == GIB + (32 << 20)
    assert first["resident_bytes"] == second["resident_bytes"] == GIB + (32 << 20)


def test_a_meter_without_cuda_measures_nothing():
    assert CaseMeter("cpu").result() == {}
    with not_counted():  # no meter active: a no-op
        pass


class PhaseMeter:
    """A CaseMeter stand-in that logs which phases run inside counting()."""

    log: list[str] = []

    def __init__(self, device) -> None:
        self.inside = False

    @contextlib.contextmanager
    def metering(self):
        yield self

    @contextlib.contextmanager
    def counting(self):
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def result(self) -> dict[str, int]:
        return {"peak_bytes": 7, "resident_bytes": 3, "meter": CASE_METER}


def test_the_runner_counts_build_and_timing_but_not_the_check(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "c" * 40)
    meters: list[PhaseMeter] = []

    def make(device):
        meters.append(PhaseMeter(device))
        return meters[-1]

    monkeypatch.setattr(memory, "CaseMeter", make)
    seen: dict[str, list[bool]] = {"build": [], "check": [], "timed": []}

    def note(phase: str) -> None:
        seen[phase].append(meters[-1].inside)

    def build() -> Work:
        note("build")

        def check() -> dict:
            note("check")
            return {"max_rel_err": 0.0}

        return Work(timed={"fwd": lambda: note("timed")}, check=check, graph=False)

    records = run_grid(
        "bench_test.Grid",
        [Case({"case": "one"}, build)],
        device="cpu",
        store=ResultStore(tmp_path),
        log=lambda _: None,
    )
    (rec,) = records.values()
    assert seen["build"] == [True]
    assert seen["check"] == [False]
    assert seen["timed"] and all(seen["timed"])
    assert rec["memory"] == {"peak_bytes": 7, "resident_bytes": 3, "meter": CASE_METER}
    assert Record.of(rec).peaks() == {CASE_PEAK: 7, CASE_RESIDENT: 3}


def test_a_case_timed_elsewhere_records_no_memory_of_this_process(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "c" * 40)
    monkeypatch.setattr(memory, "CaseMeter", PhaseMeter)
    timing = {"wall": {"median_ms": 1.0, "q25_ms": 1.0, "q75_ms": 1.0, "samples_ms": [1.0]}}
    records = run_grid(
        "bench_test.Grid",
        [Case({"case": "ranks"}, lambda: Work(timed={}, measured={"step": timing}))],
        device="cpu",
        store=ResultStore(tmp_path),
        log=lambda _: None,
    )
    (rec,) = records.values()
    assert rec["status"] == "ok" and "memory" not in rec
