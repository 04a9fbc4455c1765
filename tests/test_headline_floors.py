"""The headline's table of where the 1B best steps' time goes, from stored profile reports: which
reports it takes (1B, floors, no CUDA graph, the newest two of a name) and what each cell says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optbench.reporting import floors
from optbench.reporting.floors import floor_markdown, floor_reports
from optbench.store.store import ResultStore


def write_report(
    root: Path,
    name: str,
    commit: str,
    date: str,
    graph: bool,
    gemm_ms: float,
    kernels_per_step: float = 852.0,
) -> None:
    classes = [
        {"class": "gemm", "ms": gemm_ms, "floor_ms": 60.0, "over_ms": gemm_ms - 60.0},
        {"class": "attention", "ms": 11.0, "floor_ms": 3.0, "over_ms": 8.0},
        {"class": "fp8_cast", "ms": 0.0, "floor_ms": None, "over_ms": None},
        {"class": "other", "ms": 0.5, "floor_ms": None, "over_ms": None},
    ]
    report = {
        "meta": {
            "name": name,
            "commit": commit,
            "date": date,
            "size": "1B",
            "machine": "h200",
            "options": {"cuda_graph": graph},
            "machine_info": {"gpu_uuid": "GPU-f15216d5-8682"},
        },
        "time": {"device_busy_ms": gemm_ms + 11.5, "wall_ms": gemm_ms + 15.0},
        "launches": {"kernels_per_step": kernels_per_step, "per_step": 852.0},
        "kernel_classes": {
            "floors": {
                "classes": classes,
                "floored_ms": gemm_ms + 11.0,
                "floor_ms": 63.0,
                "ceilings": {"bf16_tflops": 790.0, "bandwidth_gbps": 4300.0, "fp8_tflops": None},
            }
        },
    }
    folder = root / "h200" / "profiles" / f"{commit}-1B-{name}"
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(report))


def test_the_newest_ungraphed_profiles_of_a_name_grouped_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(floors, "PER_NAME", 2)
    for i, day in enumerate(("24", "25", "26")):
        write_report(tmp_path, "best-nograph", f"c{i}", f"2026-11-{day}T00:00:00", False, 70.0 - i)
    write_report(tmp_path, "best", "c9", "2026-11-27T00:00:00", True, 100.0)  # graphed: left out
    write_report(tmp_path, "fp8-nograph", "c5", "2026-11-25T12:00:00", False, 40.0)
    reports = floor_reports(ResultStore(tmp_path), "h200")
    assert [r["meta"]["commit"] for r in reports] == ["c1", "c2", "c5"]
    reports = reports[:2]

    caption, header, rows = floor_markdown(reports)
    assert header == ["class", "best-nograph @ `c1`", "best-nograph @ `c2`"]
    by_row = {r[0]: r[1:] for r in rows}
    assert [r[0] for r in rows][:3] == ["gemm", "attention", "other"]  # most time first
    assert "fp8_cast" not in by_row  # no time in any report
    assert by_row["gemm"] == ["69.00 / 60.00 (1.15×)", "68.00 / 60.00 (1.13×)"]
    assert by_row["other"] == ["0.50", "0.50"]  # no floor model: ms alone
    assert by_row["wall per step"] == ["84.00", "83.00"]
    assert "GPU f15216d5" in caption and "bf16 790 TFLOP/s" in caption


def test_a_profile_whose_window_held_earlier_kernels_is_marked(tmp_path: Path) -> None:
    """An ungraphed profile that recorded more kernels a step than it launched (the warm-up
    step's, still queued when the window opened) is marked, with how many a step; one that did
    not is not, nor a graphed one (one launch a step runs the graph)."""
    write_report(tmp_path, "best-nograph", "c1", "2026-11-24T00:00:00", False, 70.0)
    write_report(tmp_path, "fp8-nograph", "c2", "2026-11-25T00:00:00", False, 40.0, 878.67)
    caption, header, _ = floor_markdown(floor_reports(ResultStore(tmp_path), "h200"))
    assert header == ["class", "best-nograph @ `c1`", "fp8-nograph @ `c2` †"]
    assert "†: the profile's window also held kernels launched before it" in caption
    assert "(26.7 a step)" in caption
    graphed = {"meta": {"options": {"cuda_graph": True}}, "launches": {"per_step": 1.0}}
    assert (
        floors.spilled({**graphed, "launches": {"kernels_per_step": 1265.5, "per_step": 1.0}}) == 0
    )
