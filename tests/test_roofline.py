import pytest
import torch

from optbench.measure.hardware import PROFILES
from optbench.measure.roofline import (
    Ceilings,
    copy_probe,
    floor_ms,
    matmul_probe,
    measure_ceilings,
    roofline,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# Round ceilings: 100 TFLOPS bf16 and 1000 GB/s, so 1e9 FLOP take 0.01 ms and 1e6 bytes take 0.001
# ms.
CEIL = Ceilings({"fp32": 10.0, "tf32": None, "bf16": 100.0, "fp16": 100.0}, 1000.0, "test")


def test_from_profile():
    c = Ceilings.from_profile(PROFILES["h100-sxm"])
    assert c.source == "profile:h100-sxm"
    assert c.peak("bf16") == 989.4 and c.bandwidth_gbps == 3350.0


def test_peak_is_the_one_lookup():
    # a profile's peaks are read through Ceilings: the dtype's TFLOP/s, None where unsupported,
    # KeyError otherwise
    t4 = Ceilings.from_profile(PROFILES["t4"])
    assert t4.peak("fp16") == 65.0 and t4.peak("bf16") is None and t4.bandwidth_gbps == 320.0
    with pytest.raises(KeyError):
        Ceilings.from_profile(PROFILES["h100-sxm"]).peak("fp8")
    assert not hasattr(PROFILES["h100-sxm"], "peak")  # no second lookup on the profile


def test_probes_count_their_work():
    torch.manual_seed(0)  # the probes draw their data from torch's generator
    copy = copy_probe("cpu", "bf16", nbytes=4096)
    assert (copy.flops, copy.bytes_moved, copy.dtype) == (0.0, 8192.0, "bf16")
    out = copy.fn()
    assert out.dtype == torch.bfloat16 and out.numel() == 2048
    mm = matmul_probe("fp32", "cpu", n=16)
    assert (mm.flops, mm.bytes_moved, mm.dtype) == (2.0 * 16**3, 3.0 * 16 * 16 * 4, "fp32")
    assert mm.fn().shape == (16, 16)
    assert matmul_probe("bf16", "cpu", n=8).bytes_moved == 3.0 * 8 * 8 * 2


def test_calibrate_times_the_roofline_probes(monkeypatch):
    from optbench.measure import roofline as R
    from optbench.run import calibrate

    made = []
    monkeypatch.setattr(
        R, "copy_probe", lambda device, dtype="fp32": made.append(("copy", dtype)) or "copy"
    )
    monkeypatch.setattr(
        R, "matmul_probe", lambda dtype, device: made.append(("matmul", dtype)) or "mm"
    )
    assert calibrate.cases("cpu") == {"matmul_bf16_8192": "mm", "copy_1GiB": "copy"}
    assert sorted(made) == [("copy", "bf16"), ("matmul", "bf16")]


def test_compute_bound_kernel():
    # 2e12 FLOP, 1e9 bytes in 40 ms: 50 TFLOPS of 100, 25 GB/s of 1000; floor max(20, 1) = 20 ms
    r = roofline(2e12, 1e9, 40.0, CEIL, "bf16")
    assert r.achieved_tflops == pytest.approx(50.0)
    assert r.achieved_gbps == pytest.approx(25.0)
    assert r.compute_frac == pytest.approx(0.5)
    assert r.bandwidth_frac == pytest.approx(0.025)
    assert r.floor_ms == pytest.approx(20.0)
    assert r.floor_ratio == pytest.approx(2.0)
    assert r.bound == "compute"


def test_memory_bound_kernel():
    # 1e9 FLOP, 4e9 bytes in 5 ms: floor max(0.01, 4) = 4 ms, 800 GB/s of 1000
    r = roofline(1e9, 4e9, 5.0, CEIL, "bf16")
    assert r.floor_ms == pytest.approx(4.0)
    assert r.floor_ratio == pytest.approx(1.25)
    assert r.bandwidth_frac == pytest.approx(0.8)
    assert r.achieved_tflops == pytest.approx(0.2)
    assert r.bound == "memory"


def test_floor_ms_uses_the_dtype_peak():
    assert floor_ms(1e12, 0, CEIL, "fp32") == pytest.approx(100.0)  # 1e12 / 10e12 s
    assert floor_ms(1e12, 0, CEIL, "bf16") == pytest.approx(10.0)


def test_unknown_peak_leaves_fields_none():
    r = roofline(1e12, 1e9, 10.0, CEIL, "tf32")
    assert (
        r.compute_frac is None and r.floor_ms is None and r.floor_ratio is None and r.bound is None
    )
    assert r.achieved_tflops == pytest.approx(100.0)
    assert r.bandwidth_frac == pytest.approx(0.1)


def test_work_free_term_needs_no_ceiling():
    # a pure copy: no FLOPs, so an unknown compute peak does not matter
    assert floor_ms(0, 2e9, CEIL, "tf32") == pytest.approx(2.0)


def test_cpu_profile_has_no_roofline():
    r = roofline(1e9, 1e9, 1.0, Ceilings.from_profile(PROFILES["cpu"]), "fp32")
    assert r.achieved_tflops == pytest.approx(1.0) and r.achieved_gbps == pytest.approx(1000.0)
    assert r.compute_frac is None and r.bandwidth_frac is None and r.floor_ms is None


def test_rejects_bad_inputs():
    with pytest.raises(ValueError):
        roofline(1.0, 1.0, 0.0, CEIL, "bf16")
    with pytest.raises(ValueError):
        floor_ms(-1.0, 1.0, CEIL, "bf16")
    with pytest.raises(KeyError):
        floor_ms(1.0, 1.0, CEIL, "int8")


def test_measure_ceilings_needs_cuda():
    with pytest.raises(NotImplementedError):
        measure_ceilings("cpu")


@pytest.mark.gpu
@needs_cuda
def test_measure_ceilings_on_gpu():
    flag = torch.backends.cuda.matmul.allow_tf32
    c = measure_ceilings()
    assert torch.backends.cuda.matmul.allow_tf32 == flag
    assert c.source == "measured" and c.bandwidth_gbps > 0 and c.peak("fp32") > 0


def test_a_time_at_or_under_its_floor_is_below_it():
    from optbench.measure.roofline import below_floor

    floor = floor_ms(0, 4e9, CEIL, "bf16")  # 4 ms
    assert below_floor(roofline(0, 4e9, 0.8 * floor, CEIL, "bf16").floor_ratio)
    # at the floor: not reachable either
    assert below_floor(roofline(0, 4e9, floor, CEIL, "bf16").floor_ratio)
    assert not below_floor(roofline(0, 4e9, 1.01 * floor, CEIL, "bf16").floor_ratio)
    # no floor known: nothing to say
    assert not below_floor(roofline(1e12, 1e9, 1.0, CEIL, "tf32").floor_ratio)
