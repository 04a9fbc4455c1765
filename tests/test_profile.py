"""``optbench profile`` on the CPU with the tiny model: the report's structure and files, planted smells
found (one ``loss.item()`` sync, a Python loop over parameters), and ``--diff`` listing the sync."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from optbench.profiling import profile

PNG = b"\x89PNG\r\n\x1a\n"
RUN = ["--size", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "1"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Report folders of the tiny CPU baseline (item sync, loop grad stats) and of one switch each."""
    root = tmp_path_factory.mktemp("profiles")
    cases = {"base": [], "no_sync": ["--options", "item_sync=false"],
             "foreach": ["--options", "grad_stats=foreach"]}
    for name, extra in cases.items():
        assert profile.main([*RUN, *extra, "--out", str(root / name)]) == 0
    return {name: root / name for name in cases}


def load(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def numbers(obj: object) -> list[float]:
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in numbers(v)]
    return [obj] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def test_report_structure_and_files(reports: dict[str, Path]) -> None:
    folder = reports["base"]
    r = load(folder)
    assert {"meta", "notes", "time", "launches", "smells", "memory", "ops", "files"} <= r.keys()
    assert set(r["time"]["host_ms"]) == set(profile.PHASES)
    assert {"wall_ms", "gpu_busy_fraction", "tokens_per_s", "mfu"} <= r["time"].keys()
    assert r["time"]["gpu_busy_fraction"] is None and r["notes"]  # CPU: null, with a note that says why
    assert {"copy_calls", "host_syncs", "small_kernels", "loops"} <= r["smells"].keys()
    assert {"weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes",
            "logits_bytes_estimate", "peak_backward_bytes", "after_step_bytes"} <= r["memory"].keys()
    assert all(math.isfinite(x) for x in numbers(r))
    assert math.isclose(sum(r["time"]["host_ms"].values()), r["time"]["wall_ms"], rel_tol=0.05)
    assert r["memory"]["activations_bytes"] > 0 and r["memory"]["peak_backward_bytes"] > 0
    assert 0 < len(r["ops"]["top_host"]) <= profile.TOP and r["launches"]["per_step"] > 0

    for name in ("report.json", "report.md", "report.html", "trace.json.gz", "time_split.png",
                 "memory_timeline.png"):
        assert (folder / name).stat().st_size > 0, name
        assert name in r["files"]
    for name in ("time_split.png", "memory_timeline.png"):
        assert (folder / name).read_bytes().startswith(PNG)
    assert json.loads(gzip.decompress((folder / "trace.json.gz").read_bytes()))["traceEvents"]
    assert "time_split.png" in (folder / "report.md").read_text()
    assert '<img src="memory_timeline.png"' in (folder / "report.html").read_text()
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []  # no staging left


def test_master_adamw_is_profiled_as_the_optimizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our MasterAdamW: its time in the optimizer phase, its masters and moments in the optimizer's memory."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    options = ["--options", "precision=bf16", "optimizer=master", "grad_stats=foreach"]
    assert profile.main([*RUN, *options, "--out", str(tmp_path / "master")]) == 0
    r = load(tmp_path / "master")
    assert r["time"]["host_ms"]["optimizer"] > r["time"]["host_ms"]["other"]
    memory = r["memory"]
    assert memory["optimizer_state_bytes"] > 2 * memory["weights_bytes"]  # fp32 masters of bf16 weights + moments


def test_item_sync_is_one_more_host_sync(reports: dict[str, Path]) -> None:
    base, no_sync = load(reports["base"])["smells"], load(reports["no_sync"])["smells"]
    assert base["host_syncs"] == no_sync["host_syncs"] + 1
    assert base["host_syncs_by_phase"]["other"] == no_sync["host_syncs_by_phase"]["other"] + 1


def test_loop_grad_stats_launch_more_ops(reports: dict[str, Path]) -> None:
    base, foreach = load(reports["base"]), load(reports["foreach"])
    assert base["launches"]["per_step"] > foreach["launches"]["per_step"]
    loops, fused = base["smells"]["loops"], foreach["smells"]["loops"]
    assert loops["norm_ops"]["aten::sum"] > fused["norm_ops"]["aten::sum"] + loops["param_tensors"]
    assert fused["norm_ops"]["aten::_foreach_norm"] > loops["norm_ops"]["aten::_foreach_norm"] == 0


def test_diff_lists_the_sync(reports: dict[str, Path]) -> None:
    assert profile.main(["--diff", str(reports["base"]), str(reports["no_sync"] / "report.json")]) == 0
    rows = {row[0]: row for row in profile.figure_rows(load(reports["base"]), load(reports["no_sync"]))}
    assert rows["smells.host_syncs"][3] == -1
    text = (reports["no_sync"] / "diff.md").read_text()
    assert any(line.startswith("| smells.host_syncs |") and "| -1 |" in line for line in text.splitlines())


def test_staging_leaves_nothing_on_failure(tmp_path: Path) -> None:
    final = tmp_path / "report"
    with pytest.raises(RuntimeError), profile.staging(final) as tmp:
        (tmp / "report.json").write_text("{}")
        raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []
    for text in ("old", "new"):
        with profile.staging(final) as tmp:
            (tmp / "report.json").write_text(text)
    assert [p.name for p in tmp_path.iterdir()] == ["report"] and (final / "report.json").read_text() == "new"


def test_parse_options_types_values() -> None:
    assert profile.parse_options(["item_sync=false", "batch_size=4", "compile=none", "loss=chunked"]) == {
        "item_sync": False, "batch_size": 4, "compile": None, "loss": "chunked"}
    with pytest.raises(SystemExit):
        profile.parse_options(["no_such_switch=1"])


def test_cuda_call_names_are_classified() -> None:
    """Kineto's names of CUDA runtime and driver calls (the CUDA path cannot run here)."""
    launches = ["cudaLaunchKernel", "cudaLaunchKernelExC_v11060", "cuLaunchKernelEx", "cudaGraphLaunch_ptsz"]
    syncs = ["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"]
    assert all(profile.LAUNCH_CALL.match(n) for n in launches)
    assert all(profile.SYNC_CALL.match(n) for n in syncs)
    assert not any(profile.SYNC_CALL.match(n) for n in ("cudaMemcpyAsync", "cudaStreamWaitEvent", *launches))
    assert all(profile.DATA_CALL.match(n) for n in ("cudaMemcpyAsync", "cuMemcpyHtoDAsync_v2", *syncs))
    assert not any(profile.DATA_CALL.match(n) for n in launches)


def test_command_buffer_full_is_not_device_time():
    """CUPTI's 'Command Buffer Full' spans (a launch waiting on the host side) attached to an operator are
    left out of the device split; the kernel beside them counts."""
    from types import SimpleNamespace as NS

    def span(name, start, us, kernels=()):
        return NS(name=name, time_range=NS(start=start, end=start + us, elapsed_us=lambda: us),
                  duration=us, kernels=list(kernels), is_user_annotation=False)

    kernel, stall = span("gemm", 10, 2000), span("Command Buffer Full", 5, 90000)
    line = profile.Timeline([(0, 100)], [(0, 100, "optimizer")])
    parsed = profile.Parsed(host=[span("aten::mm", 1, 3, [kernel, stall])], device=[kernel], line=line,
                            curve=None)
    split = profile.device_split(parsed)
    assert split["optimizer"] == pytest.approx(2.0) and split["unattributed"] == 0.0


def test_a_gpu_steps_mfu_divides_by_the_profiles_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """time_figures on a CUDA step (CPU-tested with a recorded timeline): MFU = step FLOPs / wall s / the
    precision's peak of the detected profile (bf16 on an H100: 989.4 TFLOP/s by its datasheet)."""
    from types import SimpleNamespace as NS

    from optbench.core import hardware
    from optbench.core.roofline import Ceilings

    h100 = hardware.PROFILES["h100-sxm"]
    monkeypatch.setattr(hardware, "detect", lambda device=None: h100)
    monkeypatch.setattr(profile, "host_split", lambda p: {})
    monkeypatch.setattr(profile, "device_split", lambda p: {})
    kernel = NS(time_range=NS(start=0.0, end=10_000.0))
    parsed = NS(line=NS(ranges=[(0.0, 10_000.0)], n=1), device=[kernel])  # one 10 ms step, busy throughout
    step = NS(device=NS(type="cuda"), options=NS(precision="bf16"), tokens_per_step=8192, flops_per_step=1e15)
    figures = profile.time_figures(step, parsed)
    assert figures["wall_ms"] == pytest.approx(10.0) and figures["gpu_busy_fraction"] == pytest.approx(1.0)
    assert figures["mfu"] == pytest.approx(1e15 / 0.01 / (Ceilings.from_profile(h100).peak("bf16") * 1e12))
