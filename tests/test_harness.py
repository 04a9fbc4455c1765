"""The harness around the timer: profiles, roofline, machine info, the grid runner and store, the
gate."""

from __future__ import annotations

import inspect
import itertools
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from optbench.gate.compare import compare
from optbench.measure import hardware, machine
from optbench.measure.roofline import Ceilings, floor_ms, roofline
from optbench.measure.timing import Timing, measure
from optbench.run.runner import RUN_DEADLINE_ENV, Case, Work, WrongResult, run_grid
from optbench.store.store import MACHINE_KEY, REPO_ROOT, ResultStore, record_key

ROOT = REPO_ROOT


def test_profiles_cover_the_users_gpus_and_lookup_is_strict():
    for key in ("rtx5090", "t4", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "cpu"):
        assert hardware.lookup(key).key == key
    t4 = hardware.lookup("t4")
    assert not t4.supports_bf16 and not t4.supports_tf32 and t4.peak_tflops["bf16"] is None
    assert hardware.lookup("h100-sxm").peak_tflops["bf16"] == pytest.approx(989.4)
    assert hardware.key_for("NVIDIA H100 80GB HBM3") == "h100-sxm"
    with pytest.raises(KeyError):
        hardware.lookup("not-a-gpu")


def test_roofline_arithmetic():
    c = Ceilings.from_profile(hardware.lookup("h100-sxm"))  # 989.4 TFLOP/s bf16, 3350 GB/s
    # 3.35 GB moved in 1 ms on a 3350 GB/s card is exactly the bandwidth floor.
    r = roofline(flops=1e9, bytes_moved=3.35e9, time_ms=2.0, ceilings=c, dtype="bf16")
    assert (
        r.floor_ms == pytest.approx(1.0)
        and r.floor_ratio == pytest.approx(2.0)
        and r.bound == "memory"
    )
    assert r.achieved_gbps == pytest.approx(1675.0) and r.bandwidth_frac == pytest.approx(0.5)
    assert floor_ms(989.4e12 * 1e-3, 0.0, c, "bf16") == pytest.approx(1.0)  # a compute-bound ms
    unknown = roofline(1e9, 1e9, 1.0, Ceilings.from_profile(hardware.lookup("cpu")), "bf16")
    assert unknown.floor_ms is None and unknown.compute_frac is None


def test_machine_info_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = machine.machine_info()
    assert info["gpu_name"] is None and info["gpu_count"] == 0 and info["profile"] == "cpu"
    assert info["torch"] == torch.__version__ and info["num_cpu"] >= 1
    assert machine.machine_name(info).startswith("cpu-")
    assert machine.machine_name(info, emulate="t4").endswith("-emulating-t4")


def _matrix(n: int) -> torch.Tensor:
    """An n x n matrix for a case to multiply, drawn from a seeded generator."""
    return torch.randn(n, n, generator=torch.Generator().manual_seed(0))


def _work(fn, check=None) -> Work:
    return Work(timed={"call": fn}, check=check, memory=("call",))


# the allocator's account comes after the first 300 characters of the message
OOM_ACCOUNT = "and 5.20 GiB is reserved by PyTorch but unallocated."


def _fail():
    raise RuntimeError(f"CUDA out of memory. Tried to allocate 2.00 GiB. {'x' * 300} {OOM_ACCOUNT}")


def _bare_oom():
    raise torch.OutOfMemoryError()


def _wrong():
    raise WrongResult("rel. error 0.5 over 0.01")


def _skip():
    raise NotImplementedError("needs a CUDA GPU")


def test_grid_records_every_outcome_and_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "c" * 40)
    x = _matrix(256)
    cases = [
        Case({"case": "ok"}, lambda: _work(lambda: x @ x, check=lambda: {"max_rel_err": 0.0})),
        Case({"case": "skip"}, _skip),
        Case({"case": "wrong"}, lambda: _work(lambda: x @ x, check=_wrong)),
        Case({"case": "oom"}, lambda: _work(_fail)),
        Case({"case": "oom-bare"}, lambda: _work(_bare_oom)),  # a message of no line at all
        Case({"case": "error"}, lambda: _work(lambda: 1 / 0)),
    ]
    store = ResultStore(tmp_path)
    records = run_grid("bench_test.Grid", cases, device="cpu", store=store, log=lambda _: None)
    status = {r["params"]["case"]: r["status"] for r in records.values()}
    assert status == {
        "ok": "ok",
        "skip": "skipped",
        "wrong": "wrong",
        "oom": "oom",
        "oom-bare": "oom",
        "error": "error",
    }
    oom = records[record_key("bench_test.Grid", {"case": "oom"})]
    assert oom["reason"].endswith("in its timing 'call'") and len(oom["reason"]) < 400
    assert oom["oom_message"].endswith(OOM_ACCOUNT)  # kept whole (mutation: only the reason)
    ok = records[record_key("bench_test.Grid", {"case": "ok"})]
    assert (
        ok["metrics"]["call"]["device"] is None and ok["metrics"]["call"]["wall"]["median_ms"] > 0
    )
    assert (
        "metrics" not in records[record_key("bench_test.Grid", {"case": "wrong"})]
        or not records[record_key("bench_test.Grid", {"case": "wrong"})]["metrics"]
    )  # wrong is never timed
    stored = store.load("test-machine", "c" * 40)
    assert (
        set(stored) == {MACHINE_KEY, *records}
        and stored[MACHINE_KEY]["info"]["torch"] == torch.__version__
    )
    assert store.commits("test-machine") == ["c" * 40]
    assert not list(tmp_path.rglob(".*.jsonl.*"))  # no temporary files left behind


def _events(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_case_of_a_grid_reports_its_start_and_end_to_the_progress_file(tmp_path, monkeypatch):
    """Each case appends 'start' and 'end' (status, seconds, the phases of its record) to the run's
    progress file, whatever its outcome; the process reports its start-up once, at its first
    case."""
    from optbench.run import progress

    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "c" * 40)
    monkeypatch.setenv("OPTBENCH_PROGRESS", str(tmp_path / "progress.jsonl"))
    monkeypatch.setattr(progress, "_startup_reported", False)
    x = _matrix(64)
    cases = [
        Case({"case": "ok"}, lambda: _work(lambda: x @ x, check=lambda: {"max_rel_err": 0.0})),
        Case({"case": "skip"}, _skip),
        Case({"case": "wrong"}, lambda: _work(lambda: x @ x, check=_wrong)),
        Case({"case": "error"}, lambda: _work(lambda: 1 / 0)),
    ]
    records = run_grid(
        "bench_test.Grid", cases, device="cpu", store=ResultStore(tmp_path), log=lambda _: None
    )
    events = _events(tmp_path / "progress.jsonl")
    assert [(e["event"], e.get("key", "").split("=")[-1]) for e in events] == [
        ("process", ""),
        ("start", "ok"),
        ("end", "ok"),
        ("start", "skip"),
        ("end", "skip"),
        ("start", "wrong"),
        ("end", "wrong"),
        ("start", "error"),
        ("end", "error"),
    ]
    assert events[0]["benchmark"] == "bench_test.Grid" and events[0]["startup_seconds"] > 0
    assert all(e["pid"] == os.getpid() and e["t"] > 0 for e in events)
    ends = {e["key"].split("=")[-1]: e for e in events if e["event"] == "end"}
    assert {c: e["status"] for c, e in ends.items()} == {
        "ok": "ok",
        "skip": "skipped",
        "wrong": "wrong",
        "error": "error",
    }
    for e in ends.values():
        assert e["seconds"] == records[e["key"]]["seconds"] and e["benchmark"] == "bench_test.Grid"
    ok = ends["ok"]
    for field in (
        "build_seconds",
        "check_seconds",
        "compile_seconds",
        "timing_seconds",
        "memory_seconds",
        "free_seconds",
    ):
        assert ok[field] == records[ok["key"]][field] and ok[field] >= 0
    assert ok["compile_seconds"] <= ok["check_seconds"]
    phases = ("build", "check", "timing", "memory", "free")
    assert sum(ok[f"{phase}_seconds"] for phase in phases) <= ok["seconds"]
    # the check ran, then failed
    assert "check_seconds" in ends["wrong"] and "timing_seconds" not in ends["wrong"]
    assert "ZeroDivisionError" in ends["error"]["reason"] and "timing_seconds" in ends["error"]


def test_a_case_whose_measurement_raises_past_the_runner_still_reports_its_end(
    tmp_path, monkeypatch
):
    """An exception past the runner's handlers that is no interrupt (SystemExit) leaves an 'end'
    event, status 'aborted', and goes on up (an interrupt: tests/test_interrupts.py)."""
    from optbench.run import progress, runner

    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "c" * 40)
    monkeypatch.setenv("OPTBENCH_PROGRESS", str(tmp_path / "progress.jsonl"))

    def interrupted(case, **kw):
        raise SystemExit("stopped by the user")

    monkeypatch.setattr(runner, "measure_case", interrupted)
    with pytest.raises(SystemExit):
        run_grid(
            "bench_test.Grid",
            [Case({"case": "a"}, _skip), Case({"case": "b"}, _skip)],
            device="cpu",
            store=ResultStore(tmp_path),
            log=lambda _: None,
        )
    ends = [e for e in _events(tmp_path / "progress.jsonl") if e["event"] == "end"]
    assert [(e["key"], e["status"], e["seconds"]) for e in ends] == [
        ("bench_test.Grid|case=a", progress.ABORTED, None)
    ]
    assert ends[0]["reason"] == "SystemExit: stopped by the user"


THREE_SAMPLES = {"warmup_ms": 0.0, "rep_ms": 0.0, "min_reps": 3, "max_reps": 3}


def _one_record(work: Work, results: Path) -> dict:
    """The record of one case that measures ``work`` on the CPU, stored under ``results``."""
    records = run_grid(
        "bench_test.Grid",
        [Case({"case": "c"}, lambda: work)],
        device="cpu",
        store=ResultStore(results),
        log=lambda _: None,
    )
    return next(iter(records.values()))


def test_a_case_records_the_seconds_torch_compile_spent_in_its_check_and_timing(
    tmp_path, monkeypatch
):
    """compile_seconds: the growth of torch's own compile timers over the check
    (timing_compile_seconds: over the timing); read from dynamo's module where it is loaded, 0
    before, None where its timers are named otherwise."""
    import types

    from optbench.run import runner

    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "c" * 40)
    timers: dict[str, list[float]] = {}
    monkeypatch.setitem(
        sys.modules, "torch._dynamo.utils", types.SimpleNamespace(compilation_time_metrics=timers)
    )
    assert runner.compile_seconds() == 0.0
    timers["GraphLowering.run"] = [1.0]
    assert runner.compile_seconds() is None  # timers, but none by the names read
    timers["_compile.compile_inner"] = [2.0]

    def check():
        timers["_compile.compile_inner"].append(3.0)  # a forward compiled in the check
        timers["backward._backward_impl"] = [0.5]  # and its backward
        return {}

    def first_call():
        timers["_compile.compile_inner"].append(0.25)  # recompiled when first timed

    calls = iter([first_call])
    work = Work(
        timed={"call": lambda: next(calls, lambda: None)()},
        check=check,
        timing={"call": THREE_SAMPLES},
    )
    rec = _one_record(work, tmp_path)
    assert rec["compile_seconds"] == 3.5 and rec["timing_compile_seconds"] == 0.25


def test_a_case_checked_in_an_earlier_run_compiles_where_its_check_would_have(
    tmp_path, monkeypatch
):
    """A Work with checked_in (ab's later rounds): no check runs, the record names the run whose
    check stands for it, and one call of each timed callable takes the check's place, so its first
    compile counts in compile_seconds as a check's would (not in timing_compile_seconds)."""
    import types

    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "c" * 40)
    timers: dict[str, list[float]] = {"_compile.compile_inner": []}
    monkeypatch.setitem(
        sys.modules, "torch._dynamo.utils", types.SimpleNamespace(compilation_time_metrics=timers)
    )
    calls = []

    def step():
        if not calls:
            timers["_compile.compile_inner"].append(3.0)  # the first call compiles
        calls.append(1)

    work = Work(
        timed={"call": step},
        checked_in="20261128T000000Z-abcdef",
        timing={"call": {"warmup_ms": 0.0, "rep_ms": 0.0, "min_reps": 3, "max_reps": 3}},
    )
    rec = next(
        iter(
            run_grid(
                "bench_test.Grid",
                [Case({"case": "c"}, lambda: work)],
                device="cpu",
                store=ResultStore(tmp_path),
                log=lambda _: None,
            ).values()
        )
    )
    assert rec["status"] == "ok" and "check" not in rec
    assert rec["checked_in"] == "20261128T000000Z-abcdef"
    assert rec["compile_seconds"] == 3.0 and rec["timing_compile_seconds"] == 0.0


def test_a_work_sets_the_timers_budgets_per_metric(tmp_path, monkeypatch):
    """Work.timing reaches measure() for its metric only (steps: a power-steady warm-up; the rest:
    defaults)."""
    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "c" * 40)
    work = Work(
        timed={"long": lambda: None, "plain": lambda: None},
        timing={"long": THREE_SAMPLES},
    )
    metrics = _one_record(work, tmp_path)["metrics"]
    assert metrics["long"]["wall"]["n"] == 3 and metrics["plain"]["wall"]["n"] >= 10


def test_steps_on_a_gpu_are_timed_at_a_power_steady_clock():
    from optbench.measure.machine import PowerSettle
    from optbench.suite.workloads import STEP_REP_MS, STEP_WARMUP_MS, step_timing

    # an H100 reaches its power cap about a second into sustained steps
    assert STEP_WARMUP_MS >= 1000
    info: dict = {}
    gpu = step_timing("cuda", info)["step"]
    assert (gpu["warmup_ms"], gpu["rep_ms"]) == (STEP_WARMUP_MS, STEP_REP_MS)
    # held at the cap, a step is timed over more than one swing of its clock (1B: 0.11 s a step)
    assert gpu["held_min_reps"] * 110 >= 3000
    assert isinstance(gpu["settled"], PowerSettle) and gpu["settled"].min_ms >= 500
    gpu["settled"].on_settled(612.34)  # where the warm-up ends early, the record says so
    assert info == {"step_warmup_ms": 612.3}


def test_steps_on_a_cpu_are_timed_by_the_cpu_time_of_their_thread():
    """A CPU has no boost to wait out (default budgets), and other processes may hold its cores: a
    step's wall time would count their turns, its thread's CPU time does not (a call that sleeps
    costs next to none of it). Mutation: step_timing's CPU clock back to perf_counter."""
    from optbench.suite.workloads import step_timing, step_work

    timing = step_work("tiny", "eager", "cpu").timing
    assert timing == step_timing("cpu", {})
    assert set(timing) == {"step", "forward"}
    asleep = measure(
        lambda: time.sleep(0.002), warmup_ms=0, min_reps=3, max_reps=3, **timing["step"]
    )
    assert asleep.wall.method == "thread-time"
    assert asleep.wall.median_ms < 1.0  # 2 ms asleep per call, a few microseconds on the CPU


def test_a_timeout_s_notes_include_those_of_the_exceptions_it_replaced():
    """A timeout raised again while the case's code handled the first (the alarm fires every few
    seconds) keeps what the code noted on the first. Mutation: reading the last exception's own
    notes only loses it."""
    from optbench.run.runner import CaseTimeout, exception_notes

    try:
        try:
            raise CaseTimeout("over its budget")
        except CaseTimeout as first:
            first.__notes__ = ["rank 0 ended build 41.2 s"]
            raise CaseTimeout("over its budget, again") from None
    except CaseTimeout as last:
        assert exception_notes(last) == ["rank 0 ended build 41.2 s"]


def _settle_on(monkeypatch, states: list[dict | None], limit_w: float | None = 700.0):
    """A PowerSettle whose polls read ``states`` in turn (the last one after that), polling fast."""
    from optbench.measure import machine

    feed = iter(states)
    last = states[-1]
    monkeypatch.setattr(machine, "gpu_state", lambda: next(feed, last))
    monkeypatch.setattr(machine, "power_limit_w", lambda: limit_w)
    return machine.PowerSettle(min_ms=50.0, poll_s=0.01, max_s=2.0)


def _warm_up_ms(settled) -> float:
    """The warm-up's ms; asserts that it says the device was held back where it ran its length."""
    from optbench.measure.timing import _Rotation, _warm_up

    start = time.perf_counter()
    _, held = _warm_up(
        _Rotation((lambda: time.sleep(0.002),)), lambda: None, time.perf_counter, 600.0, settled
    )
    spent_ms = (time.perf_counter() - start) * 1e3
    assert held == (spent_ms >= 600), (held, spent_ms)
    return spent_ms


def test_a_device_held_back_through_the_warm_up_gets_more_samples():
    """A GPU at its power cap swings its clock over a second or so: held through the warm-up, a step
    is timed over at least held_min_reps samples; one that settled, or measured without a
    ``settled`` rule, over its usual budget."""
    from optbench.measure.timing import measure

    def samples(warmup_ms: float = 5.0, **kw) -> int:
        timing = measure(lambda: None, warmup_ms=warmup_ms, rep_ms=0.0, min_reps=10, **kw)
        return timing.wall.n

    assert samples(settled=lambda ms: False, held_min_reps=30) == 30
    assert samples(settled=lambda ms: False, held_min_reps=30, max_reps=20) == 30
    # settled at its first question (a warm-up that long would end by time only on a stalled CPU)
    assert samples(60_000.0, settled=lambda ms: True, held_min_reps=30) == 10
    assert samples(held_min_reps=30) == 10
    assert samples(settled=lambda ms: False) == 10


FREE = {
    "sm_clock_mhz": 1980,
    "power_w": 380.0,
    "power_instant_w": 390.0,
    "clock_events": "0x0000000000000000",
    "temperature_c": 50,
}
CAPPED = {
    "sm_clock_mhz": 1755,
    "power_w": 699.0,
    "power_instant_w": 701.0,
    "clock_events": "0x0000000000000004",
    "temperature_c": 60,
}
# Half a second into a load that will reach the cap: the average still holds the idle second before,
# the draw now is at the cap, and the clock is not held back yet (a 100M step captured in a graph at
# 67f6152, NOTES.md).
RAMPING = {**FREE, "power_w": 450.0, "power_instant_w": 690.0}


def test_a_warm_up_ends_early_only_on_a_gpu_that_is_not_held_back(monkeypatch):
    """The step's warm-up ends once two polls, half a second in (here 50 ms), find no limiting clock
    event and a draw well under the limit; at the power cap, near it, thermally slowed, without
    readings or without a known limit, it runs its full length (each of those is a planted state the
    rule must refuse)."""
    free = _settle_on(monkeypatch, [FREE])
    assert _warm_up_ms(free) < 300 and 50 <= free.settled_ms < 300
    for held in (
        CAPPED,
        RAMPING,
        {**FREE, "power_instant_w": 650.0},
        {**FREE, "power_instant_w": None},
        {**FREE, "clock_events": "0x0000000000000020"},
        None,
    ):
        settle = _settle_on(monkeypatch, [held])
        assert _warm_up_ms(settle) >= 600 and settle.settled_ms is None, held
    no_limit = _settle_on(monkeypatch, [FREE], limit_w=None)
    assert _warm_up_ms(no_limit) >= 600 and no_limit.settled_ms is None
    # reaches the cap after its first polls
    capped_later = _settle_on(monkeypatch, [FREE, FREE, CAPPED])
    assert _warm_up_ms(capped_later) >= 600


def test_gpu_state_reads_nvml_in_process_and_falls_back_to_nvidia_smi(monkeypatch):
    """With nvidia-ml-py, the state comes from NVML (no process started); where NVML fails, from
    nvidia-smi."""
    import types

    from optbench.measure import machine

    calls: list = []
    instant = types.SimpleNamespace(
        nvmlReturn=0, valueType=1, value=types.SimpleNamespace(uiVal=702_500)
    )
    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
        NVML_FI_DEV_POWER_INSTANT=186,
        nvmlDeviceGetClockInfo=lambda h, which: 1755,
        nvmlDeviceGetPowerUsage=lambda h: 699_123,
        nvmlDeviceGetTemperature=lambda h, which: 61,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
        nvmlDeviceGetFieldValues=lambda h, ids: [instant] if ids == [186] else [],
    )
    monkeypatch.setattr(machine, "_nvml_device", lambda: (fake, "handle"))
    monkeypatch.setattr(machine, "_nvidia_smi", lambda fields: calls.append(fields))
    assert machine.gpu_state() == {
        "sm_clock_mhz": 1755,
        "power_w": 699.123,
        "temperature_c": 61,
        "clock_events": "0x0000000000000004",
        "power_instant_w": 702.5,
    }
    instant.nvmlReturn = 3  # NVML_ERROR_NOT_SUPPORTED: no instant reading, the rest as before
    assert machine.gpu_state()["power_instant_w"] is None
    assert machine.power_limit_w() == 700.0 and calls == []

    def broken(h):
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    monkeypatch.setattr(fake, "nvmlDeviceGetPowerUsage", broken)
    monkeypatch.setattr(fake, "nvmlDeviceGetEnforcedPowerLimit", broken)
    monkeypatch.setattr(
        machine,
        "_nvidia_smi",
        lambda fields: ["1980", "380.5", "50", "0x0", "[N/A]"][: len(fields)],
    )
    assert machine.gpu_state() == {
        "sm_clock_mhz": 1980,
        "power_w": 380.5,
        "temperature_c": 50,
        "clock_events": "0x0",
        "power_instant_w": None,
    }
    assert machine.power_limit_w() == 1980.0  # nvidia-smi's first field, as asked for
    monkeypatch.setattr(machine, "_nvml_device", lambda: None)
    monkeypatch.setattr(machine, "_nvidia_smi", lambda fields: None)
    assert machine.gpu_state() is None and machine.power_limit_w() is None


def test_a_case_that_loses_the_cuda_context_ends_the_grid_and_keeps_what_was_measured(
    tmp_path, monkeypatch
):
    from optbench.run import runner

    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "c" * 40)
    lost = []

    def illegal_access():
        lost.append(True)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    # every CUDA call fails once the context is gone, the cleanup after the case too
    def free(baseline=None):
        if lost:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(runner, "_free_device_memory", free)
    x = _matrix(64)
    cases = [
        Case({"case": "before"}, lambda: _work(lambda: x @ x)),
        Case({"case": "crash"}, lambda: _work(illegal_access)),
        Case({"case": "after"}, lambda: _work(lambda: x @ x)),
    ]
    records = run_grid(
        "bench_test.Grid", cases, device="cpu", store=ResultStore(tmp_path), log=lambda _: None
    )
    by_case = {r["params"]["case"]: r for r in records.values()}
    assert by_case["before"]["status"] == "ok"
    assert (
        by_case["crash"]["status"] == "crashed"
        and "context became unusable" in by_case["crash"]["reason"]
    )
    assert by_case["after"]["status"] == "crashed" and "not measured" in by_case["after"]["reason"]
    stored = ResultStore(tmp_path).load("test-machine", "c" * 40)
    assert {r["status"] for k, r in stored.items() if k != MACHINE_KEY} == {"ok", "crashed"}


def _record(key: str, samples: list[float], peak: int = 1000) -> dict:
    timing = Timing(tuple(samples), "cuda-graph").to_dict()
    bench, *params = key.split("|")
    return {
        "key": key,
        "benchmark": bench,
        "params": dict(p.split("=") for p in params),
        "status": "ok",
        "commit": "x",
        "date": "2026-11-22",
        "metrics": {"fwdbwd": {"device": timing, "wall": timing}},
        "peak_mem_bytes": {"fwdbwd": peak},
        "flops": {"fwdbwd": 1e9},
        "bytes": {"fwdbwd": 1e9},
        "info": {},
    }


def test_gate_is_quiet_on_noise_and_flags_a_planted_slowdown(tmp_path):
    """Two runs of each commit on one GPU (the A/A history the noise needs); a 30% slowdown."""
    gen = torch.Generator().manual_seed(0)
    noise = lambda: (1.0 + 0.01 * torch.randn(60, generator=gen)).tolist()  # noqa: E731
    keys = [f"bench_kernels.RMSNorm|shape=s|impl={i}" for i in ("eager", "triton")]
    store = ResultStore(tmp_path)
    gpu = {"key": MACHINE_KEY, "info": {"gpu_uuid": "GPU-1"}}
    for label, slow in (("a" * 40, 1.0), ("b" * 40, 1.0), ("d" * 40, 1.30)):
        for run in ("r1", "r2"):
            records = [_record(keys[0], noise()), _record(keys[1], [slow * v for v in noise()])]
            store.save("gpu", label, [gpu, *records], run_id=run)
    assert not [c for c in compare(store, "a" * 8, "b" * 8) if c.regression]
    flagged = [c for c in compare(store, "a" * 8, "d" * 8) if c.regression]
    assert {c.key for c in flagged} == {keys[1]}


def test_asv_discovers_the_suite():
    """asv's check of this work tree's benchmarks: its processes import optbench from this tree,
    installed (``pip install -e .``) or not, through PYTHONPATH and ASV_PYTHONPATH (asv's benchmark
    processes drop PYTHONPATH)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "ASV_PYTHONPATH": path}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "optbench.asv.asv_atomic",
            "check",
            "-E",
            f"existing:{sys.executable}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_case_over_its_budget_is_stopped_even_inside_a_long_call_and_the_grid_goes_on(
    tmp_path, monkeypatch
):
    """The budget interrupts Python-level work such as a compilation (here a sleeping loop that, as
    inductor's autotuning does, swallows every Exception of a failing attempt), not only between
    metrics."""
    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "c" * 40)

    def endless_compile():
        try:
            while True:
                try:
                    time.sleep(0.01)
                except Exception:  # noqa: BLE001, S110 - what a library's retry loop does
                    pass
        except BaseException as exc:  # what the case says on its way out reaches its record
            exc.__notes__ = ["the compile was at step 3"]
            raise

    x = _matrix(64)
    cases = [
        Case({"case": "slow"}, lambda: _work(lambda: x @ x, check=endless_compile)),
        Case({"case": "next"}, lambda: _work(lambda: x @ x)),
    ]
    started = time.perf_counter()
    records = run_grid(
        "bench_test.Grid",
        cases,
        device="cpu",
        budget_s=4.0,  # the next case's timing takes its ~1 s on a busy CPU too
        store=ResultStore(tmp_path),
        log=lambda _: None,
    )
    by_case = {r["params"]["case"]: r for r in records.values()}
    assert by_case["slow"]["status"] == "timeout"
    assert by_case["slow"]["reason"].endswith("in its check; the compile was at step 3")
    stored = ResultStore(tmp_path).load("test-machine", "c" * 40)
    # a fact about the case
    assert stored[record_key("bench_test.Grid", {"case": "slow"})]["status"] == "timeout"
    assert by_case["next"]["status"] == "ok"
    assert time.perf_counter() - started < 30


def test_the_deadline_restores_an_outer_timer():
    import signal

    from optbench.run.runner import deadline

    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.4)
        with deadline(5.0):
            pass
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left <= 0.4
        time.sleep(0.6)
        assert fired == [True]  # the outer alarm still went off, through its own handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_suite_with_nothing_selected_returns_its_skips_without_building_cases(monkeypatch):
    """asv calls the shared setup_cache in a --select run too: where no key of the suite matches,
    every grid benchmark's keys come back as skips from the catalog alone (no cases built: no torch,
    no CUDA context)."""
    from optbench.suite import catalog, grids

    monkeypatch.setenv("OPTBENCH_SUITE", "full")
    monkeypatch.setenv("OPTBENCH_SELECT", "^nothing-matches$")
    monkeypatch.setattr(
        grids, "cases", lambda *a: pytest.fail("built cases for an unselected grid")
    )
    records = grids.measure_suite()
    keys = {
        record_key(b.name, params)
        for b in catalog.BENCHMARKS.values()
        if b.kind in grids.GRID_KINDS
        for params in (
            dict(zip(b.param_names, combo)) for combo in itertools.product(*b.asv_params())
        )
    }
    assert set(records) == keys  # every combination asv lists
    assert all(r["status"] == "skipped" for r in records.values())
    in_full = {
        record_key(b.name, params)
        for b in catalog.BENCHMARKS.values()
        for params in b.cases("full")
    }
    assert in_full & keys and all("not selected" in records[k]["reason"] for k in in_full & keys)
    assert all("not in the 'full' suite" in records[k]["reason"] for k in keys - in_full)


def test_the_kept_records_carry_each_cases_compile_seconds(monkeypatch):
    """What a grid process hands asv's track methods holds the runner's compile_seconds
    (track_compile_s reads it)."""
    from optbench.run import runner
    from optbench.suite import grids

    params = {"variant": "best-kernels"}
    key = record_key("bench_step.Step100M", params)
    stored = {
        "key": key,
        "status": "ok",
        "reason": "",
        "metrics": {},
        "compile_seconds": 12.5,
        "check_seconds": 1.0,
    }
    monkeypatch.setattr(grids, "cases", lambda *a: [Case(params, lambda: pytest.fail("built"))])
    monkeypatch.setattr(runner, "out_of_run_time", lambda: False)
    monkeypatch.setattr(runner, "run_grid", lambda name, todo, **kw: {key: stored})
    kept = grids._measure_grid("bench_step.Step100M", [["best-kernels"]], [key], "cpu")
    assert kept[key]["compile_seconds"] == 12.5 and "check_seconds" not in kept[key]


def _resumed_quick_suite(tmp_path, monkeypatch, earlier: dict[str, str]) -> list[str]:
    """A quick-suite run with --skip-existing of a commit whose earlier run stored ``earlier``
    (key -> status); returns the list the grids' measured keys go to (nothing is measured)."""
    from optbench.suite import grids

    commit = "e" * 40
    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", commit)
    monkeypatch.setenv("OPTBENCH_RESULTS", str(tmp_path))
    monkeypatch.setenv("OPTBENCH_SUITE", "quick")
    monkeypatch.setenv("OPTBENCH_SKIP_EXISTING", "true")
    ResultStore(tmp_path).save(
        "test-machine",
        commit,
        [{"key": k, "status": status} for k, status in earlier.items()],
        run_id="20261125T000000Z-aaaaaa",
    )
    measured: list[str] = []
    monkeypatch.setattr(
        grids, "_measure_grid", lambda name, grid, chosen, device: measured.extend(chosen) or {}
    )
    monkeypatch.setattr("optbench.run.runner.default_device", lambda: "cpu")
    return measured


def test_skip_existing_leaves_out_what_an_earlier_run_of_the_commit_ended(tmp_path, monkeypatch):
    """--skip-existing: a case this commit has a record of on this machine is a skip with its
    reason, whatever that record's status, except 'crashed' (the process died in it): that one, and
    those never run, are measured."""
    from optbench.suite import grids

    key = {
        mode: record_key("bench_precision.Matmul", {"n": "8192", "mode": mode})
        for mode in ("fp32", "tf32", "bf16", "fp16")
    }
    earlier = {key["fp32"]: "ok", key["tf32"]: "wrong", key["bf16"]: "crashed"}
    measured = _resumed_quick_suite(tmp_path, monkeypatch, earlier)
    records = grids.measure_suite(["bench_precision.Matmul"])
    assert measured == [key["bf16"], key["fp16"]]
    assert (
        records[key["fp32"]]["reason"] == records[key["tf32"]]["reason"] == grids.SKIPPED_EXISTING
    )
    measured.clear()
    monkeypatch.setenv("OPTBENCH_SKIP_EXISTING", "")  # without it, all four
    grids.measure_suite(["bench_precision.Matmul"])
    assert measured == list(key.values())


def test_a_case_that_ended_its_process_here_is_measured_after_every_other_grid(
    tmp_path, monkeypatch
):
    """A case whose stored record on this machine (another commit's) says the watchdog ended its
    process goes after every grid of the process: it may end it again (max-autotune's compile on
    an H100 did, and the rest of that shard went unmeasured), and then nothing else is left
    unmeasured. A timeout the alarm interrupted stays in place; a multi-GPU grid goes late whole
    (its cases share the 1-GPU figures of one call). The mutation, measuring it in its grid's
    place, was seen to fail here."""
    from optbench.run.runner import PROCESS_ENDED
    from optbench.suite import grids

    matmul = {
        mode: record_key("bench_precision.Matmul", {"n": "8192", "mode": mode})
        for mode in ("fp32", "tf32", "bf16", "fp16")
    }
    dist = record_key("bench_distributed.DistributedStep1B", {"variant": "ddp", "world_size": "2"})
    measured = _resumed_quick_suite(tmp_path, monkeypatch, {})
    ended = f"over its budget of 180 s, and the alarm could not interrupt it: {PROCESS_ENDED}"
    ResultStore(tmp_path).save(
        "test-machine",
        "f" * 40,
        [
            {"key": matmul["tf32"], "status": "timeout", "reason": ended},
            {"key": matmul["bf16"], "status": "timeout", "reason": "over its budget of 180 s"},
            {"key": dist, "status": "timeout", "reason": ended},
        ],
        run_id="20261124T000000Z-bbbbbb",
    )
    grids.measure_suite(["bench_precision.Matmul", "bench_step.Step100M"])
    steps = [k for k in measured if k.startswith("bench_step.Step100M|")]
    assert steps and measured[-1] == matmul["tf32"]
    assert measured[:3] == [matmul["fp32"], matmul["bf16"], matmul["fp16"]]
    assert len(measured) == 4 + len(steps)
    calls: list[list[str]] = []
    monkeypatch.setattr(
        grids, "_measure_grid", lambda name, grid, chosen, device: calls.append(chosen) or {}
    )
    monkeypatch.setenv("OPTBENCH_SUITE", "multigpu")
    grids.measure_suite(["bench_distributed.DistributedStep1B"])
    assert len(calls) == 1 and dist in calls[0] and len(calls[0]) == 15


def test_skip_existing_measures_again_the_references_of_what_it_measures(tmp_path, monkeypatch):
    """An earlier run of the commit measured eager, triton-norm, graph-prereqs and cuda-graph: a
    run resumed with --skip-existing measures the rest and, again, eager, their reference (a
    speedup divides two times of one run); not triton-norm, nor graph-prereqs, whose only variant
    (cuda-graph) is measured already."""
    from optbench.suite import grids
    from optbench.suite.catalog import suite_cases

    keys = [record_key(b, p) for b, p in suite_cases("quick") if b == "bench_step.Step100M"]
    done = [
        record_key("bench_step.Step100M", {"variant": v})
        for v in ("eager", "triton-norm", "graph-prereqs", "cuda-graph")
    ]
    measured = _resumed_quick_suite(tmp_path, monkeypatch, dict.fromkeys(done, "ok"))
    records = grids.measure_suite(["bench_step.Step100M"])
    eager = record_key("bench_step.Step100M", {"variant": "eager"})
    assert measured == [k for k in keys if k == eager or k not in done]
    assert {k for k in done if k != eager} == {
        k for k, r in records.items() if r.get("reason") == grids.SKIPPED_EXISTING
    }


def test_the_grid_classes_share_two_setup_caches_the_steps_and_the_rest():
    """asv runs a setup_cache once per cache key (the defining line): one process for the training
    steps, one for everything else, each measuring the kinds of its own classes."""
    from asv_runner.benchmarks._base import get_setup_cache_key

    from benchmarks import (
        bench_anchors,
        bench_convergence,
        bench_distributed,
        bench_kernels,
        bench_precision,
        bench_step,
    )
    from benchmarks.common import Grid, StepGrid
    from optbench.suite import catalog
    from optbench.suite.grids import PROCESSES

    modules = (
        bench_anchors,
        bench_convergence,
        bench_distributed,
        bench_kernels,
        bench_precision,
        bench_step,
    )
    classes = [
        cls
        for m in modules
        for cls in vars(m).values()
        if isinstance(cls, type) and issubclass(cls, Grid) and not inspect.isabstract(cls)
    ]
    keys = {"steps": set(), "other": set()}
    for cls in classes:
        process = "steps" if issubclass(cls, StepGrid) else "other"
        assert catalog.benchmark(cls.benchmark_name()).kind in PROCESSES[process]
        keys[process].add(get_setup_cache_key(cls.setup_cache))
    assert len(keys["steps"]) == len(keys["other"]) == 1 and keys["steps"] != keys["other"]


def test_results_belong_to_the_commit_whose_code_was_measured(tmp_path):
    """Commits that only add results, docs or notes do not change what a run measures: a later
    session's run of the same code is stored under the same commit, and adds up with the earlier
    one."""
    from optbench.run.runner import measured_commit

    def git(*args):
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def commit(path, text):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
        git("add", "-A")
        git("commit", "-qm", path)
        return git("rev-parse", "HEAD")

    git("init", "-q")
    code = commit("kernels/k.py", "1")
    for path in ("results/m/r.jsonl", "NOTES.md", "README.md", "docs/d.md"):
        commit(path, "figures")
    assert measured_commit(cwd=str(tmp_path)) == code
    assert measured_commit(cwd=str(tmp_path)) != git("rev-parse", "HEAD")
    changed = commit("models/step.py", "2")
    assert measured_commit(cwd=str(tmp_path)) == changed


def test_a_run_with_a_time_budget_stops_in_time_and_stores_nothing_it_did_not_measure(
    tmp_path, monkeypatch
):
    """--time-budget: a case running when the run's budget ends is stopped and, as its timeout says
    nothing about the case, skipped as not measured (its placeholder removed from the store); later
    cases are skipped unmeasured and not stored (a later run fills them in), and a grid that starts
    after the end builds no cases."""
    from optbench.run import runner
    from optbench.run.runner import NOT_STARTED

    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "d" * 40)
    monkeypatch.setattr(runner, "_MIN_CASE_S", 1.0)
    monkeypatch.setenv(RUN_DEADLINE_ENV, str(time.time() + 3.0))
    monkeypatch.setenv("OPTBENCH_PROGRESS", str(tmp_path / "progress.jsonl"))
    x = _matrix(64)

    def long_check() -> None:
        try:
            time.sleep(30)
        except BaseException as exc:  # as a distributed launch does: how far its ranks got
            exc.add_note("rank 0 ended build 41.2 s")
            raise

    cases = [
        Case({"case": "long"}, lambda: _work(lambda: x @ x, check=long_check)),
        Case({"case": "after"}, lambda: _work(lambda: x @ x)),
    ]
    store = ResultStore(tmp_path)
    started = time.perf_counter()
    records = run_grid(
        "bench_test.Grid", cases, device="cpu", budget_s=100.0, store=store, log=lambda _: None
    )
    assert time.perf_counter() - started < 10
    by_case = {r["params"]["case"]: r for r in records.values()}
    assert by_case["long"]["status"] == "skipped"
    assert re.fullmatch(
        r"not measured: the run's time budget ended \d+\.\d s into this case; "
        r"rank 0 ended build 41\.2 s",
        by_case["long"]["reason"],
    )
    assert by_case["after"] == {**by_case["after"], "status": "skipped", "reason": NOT_STARTED}
    # neither a timeout nor a placeholder
    assert set(store.load("test-machine", "d" * 40)) == {MACHINE_KEY}

    from optbench.suite import grids

    monkeypatch.setattr(
        grids, "cases", lambda *a: pytest.fail("built cases after the run's budget ended")
    )
    monkeypatch.setenv("OPTBENCH_SUITE", "full")  # a suite Matmul is in: its skips are the budget's
    skipped = grids.measure_suite(["bench_precision.Matmul"])
    assert {r["status"] for r in skipped.values()} == {"skipped"}
    # The run's progress counts them all as ended: the cut case with the seconds it ran, the rest
    # not started.
    ends = {e["key"]: e for e in _events(tmp_path / "progress.jsonl") if e["event"] == "end"}
    long, after = ends.pop("bench_test.Grid|case=long"), ends.pop("bench_test.Grid|case=after")
    assert long["status"] == "skipped" and long["seconds"] > 1 and "not_started" not in long
    assert long["check_seconds"] > 1  # the phase it was cut in
    assert after["not_started"] and after["seconds"] is None
    assert set(ends) == set(skipped) and all(
        e["not_started"] and e["status"] == "skipped" for e in ends.values()
    )


def test_a_case_needs_a_minimum_of_the_runs_time_budget_left_to_start(tmp_path, monkeypatch):
    """With less than 30 s of the run's budget left, a case with a longer budget is not started (nor
    stored); one whose own budget fits in what is left still runs."""
    from optbench.run.runner import _MIN_CASE_S, NOT_STARTED, out_of_run_time

    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "e" * 40)
    monkeypatch.setenv(RUN_DEADLINE_ENV, str(time.time() + 20.0))
    assert (
        _MIN_CASE_S == 30.0
        and out_of_run_time()
        and out_of_run_time(120.0)
        and not out_of_run_time(10.0)
    )
    store = ResultStore(tmp_path)
    cases = [Case({"case": "quick"}, lambda: Work(timed={}, check=lambda: {"max_rel_err": 0.0}))]
    long_budget = run_grid(
        "bench_test.Grid", cases, device="cpu", budget_s=120.0, store=store, log=lambda _: None
    )
    assert [(r["status"], r["reason"]) for r in long_budget.values()] == [("skipped", NOT_STARTED)]
    assert set(store.load("test-machine", "e" * 40)) == {MACHINE_KEY}
    short_budget = run_grid(
        "bench_test.Grid", cases, device="cpu", budget_s=10.0, store=store, log=lambda _: None
    )
    assert [r["status"] for r in short_budget.values()] == ["ok"]


def test_the_store_drops_records_by_key(tmp_path):
    store = ResultStore(tmp_path)
    store.save("m", "c" * 40, [{"key": "a"}, {"key": "b"}])
    store.drop("m", "c" * 40, ["a", "not-there"])
    assert set(store.load("m", "c" * 40)) == {"b"}
    store.drop("m", "f" * 40, ["a"])
    assert store.commits("m") == ["c" * 40]  # dropping from a commit without records writes no file


def test_a_case_that_ends_stops_its_watchdog(monkeypatch):
    """Whether a case ends in time or by its alarm, its watchdog thread is gone when it returns and
    never fires into what comes after."""
    from optbench.run import runner

    # Margins for a loaded CPU, where a case's end (a gc pass over this process: 0.1-0.3 s on an
    # idle machine) may take seconds: the quick case's budget, and the grace after the slow one's.
    grace_s, quick_budget_s = 5.0, 5.0
    monkeypatch.setattr(runner, "HARD_STOP_GRACE_S", grace_s)
    fired = []
    monkeypatch.setattr(runner, "_kill_child_processes", lambda: fired.append("kill") or [])
    monkeypatch.setattr(runner.os, "_exit", lambda status: fired.append(status))

    def spin():
        while True:
            pass

    quick = Case({"case": "quick"}, lambda: Work(timed={}, check=lambda: {}))
    slow = Case({"case": "slow"}, lambda: Work(timed={}, check=spin))
    # other tests' (a hard stop's)
    earlier = {t for t in threading.enumerate() if t.name == runner.WATCHDOG_THREAD}
    assert runner.measure_case(quick, device="cpu", budget_s=quick_budget_s)["status"] == "ok"
    assert runner.measure_case(slow, device="cpu", budget_s=0.3)["status"] == "timeout"
    assert not [
        t for t in threading.enumerate() if t.name == runner.WATCHDOG_THREAD and t not in earlier
    ]
    time.sleep(quick_budget_s + grace_s + 0.2)  # past either watchdog's first firing (its kill)
    assert fired == []


def test_the_watchdog_restarts_inductors_compile_workers_after_killing_them(monkeypatch):
    from optbench.run import runner

    restarted = []
    async_compile = type(sys)("torch._inductor.async_compile")
    async_compile.shutdown_compile_workers = lambda: restarted.append(True)
    monkeypatch.setitem(sys.modules, "torch._inductor.async_compile", async_compile)
    runner._restart_compile_workers()
    assert restarted == [True]


_UNINTERRUPTIBLE_GRID = """
    import signal, subprocess, sys, time
    from optbench.run import runner
    from optbench.run.runner import Case, Work, run_grid
    from optbench.store.store import ResultStore

    # a case's first imports: outside its budget
    import optbench.measure.memory, optbench.measure.timing

    runner.HARD_STOP_GRACE_S = float(sys.argv[3])
    runner._restart_compile_workers = lambda: print("compile workers restarted")

    def blocked(wait):
        # A wait in C that SIGALRM cannot interrupt, as the main thread's on inductor's compile
        # workers: with the signal blocked here, another thread takes it and the handler runs only
        # once the wait returns.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            wait()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def case(name, check):
        return Case({"case": name}, lambda: Work(timed={}, check=check))

    cases = [
        # killing the child helps
        case("waits-on-a-child", lambda: blocked(lambda: subprocess.run(["sleep", "30"]))),
        case("next", lambda: {}),
        # no child: only ending the process helps
        case("stuck", lambda: blocked(lambda: time.sleep(30))),
        case("never", lambda: {}),
    ]
    run_grid("bench_test.Grid", cases, device="cpu", budget_s=float(sys.argv[2]),
             store=ResultStore(sys.argv[1]), log=print)
"""


def test_a_case_the_alarm_cannot_interrupt_is_hard_stopped_by_the_watchdog(tmp_path):
    """A case blocked in C past its budget: the watchdog kills the child process it waits on, so
    that the alarm lands and the grid goes on; a case that stays blocked ends the process, with its
    timeout stored. In a child process, which the watchdog ends. Each case ends well before the 30 s
    of either blocked wait."""
    from optbench.run.runner import HARD_STOP_EXIT

    # Margins for a loaded CPU: the budget holds "next" (its end runs a gc pass: seconds there), the
    # grace the alarm's landing and the first case's end after the kill.
    budget_s, grace_s = 2.0, 2.0
    script = tmp_path / "grid.py"
    script.write_text(textwrap.dedent(_UNINTERRUPTIBLE_GRID))
    env = {
        **os.environ,
        "OPTBENCH_MACHINE": "test-machine",
        "ASV_COMMIT": "a" * 40,
        "PYTHONPATH": str(ROOT),
        "OPTBENCH_PROGRESS": str(tmp_path / "progress.jsonl"),
    }
    env.pop(RUN_DEADLINE_ENV, None)
    grid = [sys.executable, str(script), str(tmp_path / "results"), str(budget_s), str(grace_s)]
    out = subprocess.run(grid, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == HARD_STOP_EXIT, out.stdout + out.stderr
    assert "compile workers restarted" in out.stdout and "alarm could not interrupt" in out.stderr
    stored = {
        k.split("=")[-1]: r
        for k, r in ResultStore(tmp_path / "results").load("test-machine", "a" * 40).items()
        if k != MACHINE_KEY
    }
    assert set(stored) == {"waits-on-a-child", "next", "stuck"}
    waited = stored["waits-on-a-child"]
    assert waited["status"] == "timeout" and waited["seconds"] < 25
    assert "until its child processes (1) were killed" in waited["reason"]
    assert stored["next"]["status"] == "ok"
    assert stored["stuck"]["status"] == "timeout" and stored["stuck"]["seconds"] < 25
    ended = f"the process was ended {2 * grace_s:g} s after the budget"
    assert f"the alarm could not interrupt it: {ended}" in stored["stuck"]["reason"]
    # The case that ended the process reported its end first, as the watchdog stored it.
    ends = [
        (e["key"].split("=")[-1], e["status"])
        for e in _events(tmp_path / "progress.jsonl")
        if e["event"] == "end"
    ]
    assert ends == [("waits-on-a-child", "timeout"), ("next", "ok"), ("stuck", "timeout")]


def test_a_time_budget_too_short_to_measure_anything_is_refused_before_any_work(capsys):
    from optbench import cli

    with pytest.raises(SystemExit) as exit_:
        cli.run(["--time-budget", "110", "--no-html"])
    assert exit_.value.code == 2 and "cannot measure anything" in capsys.readouterr().err


class _Model:
    """A stand-in for what a case's timed callables hold (a model, its inputs: device memory)."""

    def __call__(self) -> None:
        pass


def test_what_a_case_timed_is_gone_before_its_memory_is_given_back(tmp_path, monkeypatch):
    """Dropping a case's work frees what its timed callables hold by reference counting, before
    ``_free_device_memory`` looks at the bytes still allocated: a callable the runner kept in a
    local of its own would hold the model (and its device memory) past that, and the collector's
    full pass (0.2-0.3 s in a process that has imported inductor) would run after every case, in
    vain."""
    import weakref

    from optbench.run import runner

    monkeypatch.setenv("OPTBENCH_MACHINE", "test-machine")
    monkeypatch.setenv("ASV_COMMIT", "c" * 40)
    held: list[Any] = []  # the model's weak reference; then whether it was alive at the check

    def build() -> Work:
        model = _Model()
        held.append(weakref.ref(model))
        return Work(timed={"step": model.__call__, "forward": model}, memory=("step",))

    def free(baseline=None):
        held[:] = [ref() is not None for ref in held]

    monkeypatch.setattr(runner, "_free_device_memory", free)
    run_grid(
        "bench_test.Grid",
        [Case({"case": "c"}, build)],
        device="cpu",
        store=ResultStore(tmp_path),
        log=lambda _: None,
    )
    assert held == [False]
