"""Vendor peak numbers and capabilities of the GPUs optbench runs on, and detection of the running
one.

Peaks are dense (no 2:4 sparsity) tensor-core TFLOPS with FP32 accumulate for tf32/bf16/fp16, and
non-tensor FP32 TFLOPS for fp32; bandwidth is peak DRAM bandwidth in GB/s (1e9 bytes/s).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")
# Each precision name's torch dtype (tf32: fp32 tensors, TF32 matmuls) and each dtype's name, the
# one map of both.
_TORCH_DTYPE_NAMES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a precision name of :data:`DTYPES` ('tf32': torch.float32)."""
    return getattr(torch, _TORCH_DTYPE_NAMES[name])


def dtype_name(dtype: torch.dtype | str) -> str:
    """'fp32', 'bf16' or 'fp16' of a torch dtype or its string ('torch.bfloat16'); KeyError for any
    other."""
    text = str(dtype).removeprefix("torch.")
    return next(k for k, v in _TORCH_DTYPE_NAMES.items() if v == text and k != "tf32")


# Triton's README lists sm80+ as supported; Triton 3.x still compiles for sm75 (Turing) and PyTorch
# inductor accepts sm70+, so sm75 (T4) counts as usable here. bf16/tf32 kernels still need sm80.
_TRITON_MIN_CC = (7, 5)
# FP8 (e4m3/e5m2) tensor cores: Ada (sm89), Hopper (sm90), Blackwell (sm100, sm120); not Ampere or
# Turing.
_FP8_MIN_CC = (8, 9)


@dataclass(frozen=True)
class HardwareProfile:
    """Peaks of one device: TFLOPS per dtype (None = unsupported or unknown), GB/s, GB of device
    memory.

    The tables are data; a peak is looked up in one place,
    ``optbench.measure.roofline.Ceilings.from_profile(profile) .peak(dtype)`` (TFLOP/s, KeyError for
    a dtype not in :data:`DTYPES`) and ``.bandwidth_gbps`` (GB/s).
    """

    key: str
    name: str
    peak_tflops: dict[str, float | None]
    mem_bw_gbps: float | None
    mem_gb: float | None
    compute_capability: tuple[int, int] | None
    supports_bf16: bool
    supports_tf32: bool
    flash_attention: bool  # PyTorch SDPA flash kernels (sm80+)
    triton: bool  # Triton compiles for this architecture
    fp8: bool = False  # FP8 tensor cores (torch._scaled_mm, torchao float8 training): sm89+
    emulated_from: str | None = None


def _tflops(fp32: float | None, tf32: float | None, bf16: float | None, fp16: float | None) -> dict:
    return {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16}


def _gpu(
    key: str, name: str, tflops: dict, bw: float, mem: float, cc: tuple[int, int]
) -> HardwareProfile:
    ampere = cc >= (8, 0)
    return HardwareProfile(
        key=key,
        name=name,
        peak_tflops=tflops,
        mem_bw_gbps=bw,
        mem_gb=mem,
        compute_capability=cc,
        supports_bf16=ampere,
        supports_tf32=ampere,
        flash_attention=ampere,
        triton=cc >= _TRITON_MIN_CC,
        fp8=cc >= _FP8_MIN_CC,
    )


PROFILES: dict[str, HardwareProfile] = {
    p.key: p
    for p in (
        # NVIDIA RTX Blackwell GPU Architecture whitepaper, GeForce RTX 5090 column: 104.8 FP32,
        # 104.8 TF32, 209.5 FP16/BF16 with FP32 accumulate (dense); 32 GB GDDR7 at 1792 GB/s.
        _gpu(
            "rtx5090",
            "NVIDIA GeForce RTX 5090",
            _tflops(104.8, 104.8, 209.5, 209.5),
            1792.0,
            32.0,
            (12, 0),
        ),
        # NVIDIA T4 datasheet: 8.1 FP32, 65 FP16/FP32 mixed-precision tensor; no bf16/tf32 hardware
        # (Turing); 16 GB GDDR6 at 320 GB/s.
        _gpu("t4", "Tesla T4", _tflops(8.1, None, None, 65.0), 320.0, 16.0, (7, 5)),
        # NVIDIA A100 datasheet (40GB SXM/PCIe): 19.5 FP32, 156 TF32, 312 BF16/FP16 dense; 1555 GB/s
        # HBM2.
        _gpu(
            "a100-40gb",
            "NVIDIA A100 40GB",
            _tflops(19.5, 156.0, 312.0, 312.0),
            1555.0,
            40.0,
            (8, 0),
        ),
        # NVIDIA A100 datasheet (80GB SXM): same peaks, 2039 GB/s HBM2e. The 80GB PCIe card maps
        # here too although its datasheet bandwidth is 1935 GB/s.
        _gpu(
            "a100-80gb",
            "NVIDIA A100 80GB",
            _tflops(19.5, 156.0, 312.0, 312.0),
            2039.0,
            80.0,
            (8, 0),
        ),
        # NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5): 66.9 FP32, 494.7 TF32,
        # 989.4 BF16/FP16 dense; H100 datasheet: 80 GB HBM3 at 3350 GB/s.
        _gpu(
            "h100-sxm", "NVIDIA H100 SXM", _tflops(66.9, 494.7, 989.4, 989.4), 3350.0, 80.0, (9, 0)
        ),
        # NVIDIA H100 datasheet (PCIe): 51 FP32, 756 TF32 / 1513 BF16,FP16 with sparsity, halved for
        # dense; 80 GB HBM2e at 2000 GB/s.
        _gpu(
            "h100-pcie",
            "NVIDIA H100 PCIe",
            _tflops(51.0, 378.0, 756.0, 756.0),
            2000.0,
            80.0,
            (9, 0),
        ),
        # NVIDIA H200 datasheet (SXM): same GH100 compute as H100 SXM (1979 BF16 with sparsity);
        # 141 GB HBM3e at 4800 GB/s.
        _gpu("h200", "NVIDIA H200", _tflops(66.9, 494.7, 989.4, 989.4), 4800.0, 141.0, (9, 0)),
        # Host CPU: no vendor peaks tracked; torch runs bf16 on CPU, Triton only through its
        # interpreter.
        HardwareProfile(
            key="cpu",
            name="CPU",
            peak_tflops=_tflops(None, None, None, None),
            mem_bw_gbps=None,
            mem_gb=None,
            compute_capability=None,
            supports_bf16=True,
            supports_tf32=False,
            flash_attention=False,
            triton=False,
        ),
    )
}

# First match wins; a GPU name that matches none is "unknown". Variants with different specs
# (H100 NVL, H200 NVL, RTX 5090 D / Laptop, GH200) deliberately do not match.
_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"\bh100\b.*\bpcie\b", "h100-pcie"),
    (r"\bh100\b(?!.*\bnvl\b)", "h100-sxm"),
    (r"\bh200\b(?!.*\bnvl\b)", "h200"),
    (r"\ba100\b.*\b80gb\b", "a100-80gb"),
    (r"\ba100\b", "a100-40gb"),
    (r"\bt4\b", "t4"),
    (r"\brtx 5090$", "rtx5090"),
)


def slugify(text: str) -> str:
    """Lower-case text with runs of other characters than [a-z0-9] replaced by '-'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def key_for(gpu_name: str) -> str:
    """Profile key for a GPU name as torch reports it: a PROFILES key, or the name's slug if
    unknown."""
    name = gpu_name.strip().lower().replace("-", " ")
    for pattern, key in _NAME_RULES:
        if re.search(pattern, name):
            return key
    return slugify(gpu_name)


def lookup(key: str) -> HardwareProfile:
    """The profile stored under key; KeyError lists the known keys."""
    try:
        return PROFILES[key]
    except KeyError:
        raise KeyError(f"unknown hardware profile {key!r}; known: {', '.join(PROFILES)}") from None


def detect(device: int | str | torch.device | None = None) -> HardwareProfile:
    """Profile of the CUDA device (default: current); PROFILES['cpu'] without CUDA.

    An unknown GPU gets peaks None, with capabilities read from torch.
    """
    if not torch.cuda.is_available():
        return PROFILES["cpu"]
    name = torch.cuda.get_device_name(device)
    key = key_for(name)
    if key in PROFILES:
        return PROFILES[key]
    cc = torch.cuda.get_device_capability(device)
    with torch.cuda.device(device):
        bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    return HardwareProfile(
        key=key,
        name=name,
        peak_tflops=_tflops(None, None, None, None),
        mem_bw_gbps=None,
        mem_gb=torch.cuda.get_device_properties(device).total_memory / 1e9,
        compute_capability=cc,
        supports_bf16=bf16,
        supports_tf32=cc >= (8, 0),
        flash_attention=cc >= (8, 0),
        triton=cc >= _TRITON_MIN_CC,
        fp8=cc >= _FP8_MIN_CC,
    )
