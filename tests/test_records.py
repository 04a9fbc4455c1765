"""optbench.store.records: one typed view of stored records, new and old (synthetic test data)."""

from __future__ import annotations

import math

import pytest
from synthetic_results import record, samples

from benchmarks.common import Grid, StepGrid
from optbench.store.records import (
    CASE_PEAK,
    CASE_RESIDENT,
    EARLIER_METER,
    Record,
    TimingView,
    metric_label,
)
from optbench.store.store import record_key


def test_a_record_reads_back_what_the_runner_wrote():
    from optbench.measure.timing import Measurement, Timing

    wall = Timing((1.0, 2.0, 3.0, 4.0), "perf-counter")
    data = {
        **record(
            "bench_kernels.RMSNorm",
            {"shape": "8x8", "impl": "eager"},
            peak={"fwd": 2**20},
            flops={"fwd": 1e6},
            bytes_={"fwd": 2e6},
            info={"device_clock": "cold-l2"},
        ),
        "run": "r1",
        "date": "2025-01-01T00:00:00+00:00",
    }
    data["metrics"] = {"fwd": Measurement(device=None, wall=wall).to_dict()}
    rec = Record.of(data)
    assert (rec.key, rec.benchmark, rec.params, rec.status, rec.run) == (
        "bench_kernels.RMSNorm|shape=8x8|impl=eager",
        "bench_kernels.RMSNorm",
        {"shape": "8x8", "impl": "eager"},
        "ok",
        "r1",
    )
    assert (
        rec.ok
        and rec.primary_clock == "device"
        and rec.metrics == ("fwd",)
        and rec.clocks("fwd") == ("wall",)
    )
    t = rec.timing("fwd", "wall")
    assert (t.median_ms, t.q25_ms, t.q75_ms, t.iqr_ms) == (
        wall.median_ms,
        wall.q25_ms,
        wall.q75_ms,
        wall.iqr_ms,
    )
    assert t.samples_ms == wall.samples_ms and t.method == "perf-counter"
    # null clock, no metric
    assert rec.timing("fwd", "device") is None and rec.timing("fwdbwd", "wall") is None
    assert (
        rec.peaks() == {"fwd": 2**20}
        and rec.peak_bytes("fwd") == 2**20
        and rec.peak_bytes("step") is None
    )
    assert rec.flops == {"fwd": 1e6} and rec.bytes_moved == {"fwd": 2e6}


def test_old_and_partial_records_read_as_empty():
    rec = Record.of(
        {
            "key": "k",
            "metrics": {"step": {"wall": {"median_ms": 5.0}, "device": None}, "fwd": None},
            "peak_mem_bytes": {"step": None},
            "info": None,
        }
    )
    assert rec.status == "" and not rec.ok and rec.reason == "" and rec.run == "" and rec.date == ""
    assert rec.info == {} and rec.params == {} and rec.peaks() == {} and rec.clocks("fwd") == ()
    # quartiles default to the median
    assert rec.timing("step", "wall") == TimingView(5.0, 5.0, 5.0)
    assert Record.of({}).metrics == () and Record.of({}).primary_clock == "device"
    assert rec.compile_seconds is None


class Probe(Grid):
    param_names = ["case"]
    params = [["ok", "cpu", "skipped", "oom"]]


def test_asv_track_methods_read_records_through_the_view():
    def kept(case: str, **fields) -> tuple[str, dict]:
        return record_key(Probe.benchmark_name(), {"case": case}), fields

    ok = record(
        "x", {}, times={"step": (samples(2.0, 1), samples(3.0, 2))}, peak={"step": 3 * 2**20}
    )
    records = dict(
        [
            kept("ok", **ok),
            kept("cpu", **record("x", {}, times={"step": (None, samples(3.0, 2))})),
            kept("skipped", status="skipped", reason="no GPU"),
            kept("oom", status="oom", reason="big"),
        ]
    )
    grid = Probe()
    assert (
        grid.metric_ms(records, ("ok",), "step") == Record.of(ok).timing("step", "device").median_ms
    )
    assert grid.peak_mb(records, ("ok",), "step") == 3.0
    assert math.isnan(grid.metric_ms(records, ("cpu",), "step")) and math.isnan(
        grid.peak_mb(records, ("cpu",), "x")
    )
    grid.setup(records, "ok")
    with pytest.raises(NotImplementedError, match="no GPU"):
        grid.setup(records, "skipped")
    with pytest.raises(RuntimeError, match="oom: big"):
        grid.setup(records, "oom")


class StepProbe(StepGrid):
    params = [["compiled", "eager", "old"]]


def test_a_steps_compile_seconds_are_an_asv_metric_of_their_own():
    """track_compile_s reports the record's compile_seconds (0 for a step that compiles nothing);
    NaN for a record written before the runner counted them."""

    def kept(variant: str, **fields) -> tuple[str, dict]:
        return record_key(StepProbe.benchmark_name(), {"variant": variant}), fields

    step = record("x", {}, times={"step": (samples(2.0, 1), samples(3.0, 2))})
    records = dict(
        [
            kept("compiled", **step, compile_seconds=12.5),
            kept("eager", **step, compile_seconds=0.0),
            kept("old", **step),
        ]
    )
    grid = StepProbe()
    assert (
        grid.track_compile_s(records, "compiled") == 12.5
        and grid.track_compile_s(records, "eager") == 0.0
    )
    assert math.isnan(grid.track_compile_s(records, "old"))
    assert StepProbe.track_compile_s.unit == "s"


def test_each_metric_reads_once_in_a_table():
    """A table names each metric once: not 'case peak peak memory', nor 'compile compile'."""
    assert metric_label(CASE_PEAK, "peak memory") == "case peak"
    assert metric_label(CASE_RESIDENT, "peak memory") == "case resident"
    assert metric_label(EARLIER_METER[0], "peak memory") == "case peak (earlier meter)"
    assert metric_label("fwdbwd", "peak memory") == "fwdbwd peak memory"
    assert metric_label("compile", "compile") == "compile"
    assert metric_label("step", "time", "device") == "step device"
    assert metric_label("fwd", "time") == "fwd"
    assert metric_label("", "status") == "status"  # a change of status (compare, noisecheck)
