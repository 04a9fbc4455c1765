import pytest
import torch

from optbench.measure import hardware
from optbench.measure.hardware import DTYPES, PROFILES, detect, key_for, lookup

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_profile_keys():
    assert set(PROFILES) == {
        "rtx5090",
        "t4",
        "a100-40gb",
        "a100-80gb",
        "h100-sxm",
        "h100-pcie",
        "h200",
        "cpu",
    }
    for key, profile in PROFILES.items():
        assert profile.key == key
        assert set(profile.peak_tflops) == set(DTYPES)


def test_vendor_peaks():
    h100 = PROFILES["h100-sxm"]
    assert (
        h100.peak_tflops["bf16"] == 989.4
        and h100.mem_bw_gbps == 3350.0
        and h100.compute_capability == (9, 0)
    )
    t4 = PROFILES["t4"]
    assert (
        t4.peak_tflops["bf16"] is None
        and t4.peak_tflops["tf32"] is None
        and t4.peak_tflops["fp16"] == 65.0
    )
    assert not (t4.supports_bf16 or t4.supports_tf32 or t4.flash_attention)
    assert PROFILES["rtx5090"].peak_tflops["bf16"] == 209.5
    assert PROFILES["h200"].mem_bw_gbps == 4800.0


def test_cpu_profile_has_no_peaks():
    cpu = PROFILES["cpu"]
    assert all(cpu.peak_tflops[d] is None for d in DTYPES) and cpu.mem_bw_gbps is None
    assert cpu.compute_capability is None and not cpu.triton


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb"),
        ("Tesla T4", "t4"),
        ("NVIDIA GeForce RTX 5090", "rtx5090"),
        ("NVIDIA H100 NVL", "nvidia-h100-nvl"),
        ("NVIDIA H200 NVL", "nvidia-h200-nvl"),
        ("NVIDIA GH200 480GB", "nvidia-gh200-480gb"),
        ("NVIDIA GeForce RTX 5090 D", "nvidia-geforce-rtx-5090-d"),
        ("NVIDIA L4", "nvidia-l4"),
    ],
)
def test_key_for_gpu_names(name, key):
    assert key_for(name) == key


def test_lookup():
    assert lookup("t4") is PROFILES["t4"]
    with pytest.raises(KeyError, match="h100-sxm"):
        lookup("v100")


def test_detect_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert detect() is PROFILES["cpu"]


def test_detect_known_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert detect() is PROFILES["h100-sxm"]


def test_detect_unknown_gpu_reads_capabilities_from_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "device", lambda device=None: _NullContext())
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device=None: type("P", (), {"total_memory": 24e9})(),
    )
    p = detect()
    assert p.key == "nvidia-l4" and p.name == "NVIDIA L4"
    assert all(p.peak_tflops[d] is None for d in DTYPES) and p.mem_bw_gbps is None
    assert p.compute_capability == (8, 9) and p.supports_bf16 and p.supports_tf32
    assert p.flash_attention and p.triton and p.mem_gb == 24.0


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_slugify():
    assert hardware.slugify("  NVIDIA GeForce RTX 5090 (ES) ") == "nvidia-geforce-rtx-5090-es"


@pytest.mark.gpu
@needs_cuda
def test_detect_real_gpu():
    p = detect()
    assert p.key != "cpu"
    assert p.compute_capability == torch.cuda.get_device_capability() or p.key in PROFILES
