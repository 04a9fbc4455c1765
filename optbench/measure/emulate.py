"""Emulating a smaller GPU on a larger one: ``optbench run --emulate t4`` on an H100.

What is emulated: the target's memory (the process's CUDA allocator is capped at the target's size),
its missing features (FlashAttention and cuDNN attention need sm80+, TF32 needs sm80+: switched
off), and its dtype restrictions, through the skip functions of ``optbench.suite.plan``, which see
the emulated profile from ``active_profile()``. What is not: speed (SM count, clocks, bandwidth),
the kernels cuBLAS, Triton and Liger-Kernel choose for the real architecture, and the CUDA context
that the real card's memory also holds. An emulated run's timings are the host GPU's; its results
are stored as '<real>-emulating-<target>'.
"""

from __future__ import annotations

import dataclasses

import torch

from optbench.measure.hardware import HardwareProfile, detect, lookup
from optbench.store.settings import VARIABLES, current

EMULATE_ENV = VARIABLES["emulate"]


def active_profile() -> HardwareProfile:
    """The profile benchmarks run under: the emulated one (``emulated_from`` = the real device's
    key) when $OPTBENCH_EMULATE names one, else the detected device's."""
    real, key = detect(), current().emulate
    return dataclasses.replace(lookup(key), emulated_from=real.key) if key else real


def _require_gpu(target: HardwareProfile) -> None:
    if target.mem_gb is None or not target.compute_capability:
        raise ValueError(
            f"{target.key!r} is not a GPU profile with a memory size; it cannot be emulated"
        )


def memory_fraction(target: HardwareProfile, total_bytes: int) -> float:
    """Share of a device of ``total_bytes`` that holds the target's memory; ValueError if it holds
    less."""
    _require_gpu(target)
    fraction = target.mem_gb * 1e9 / total_bytes
    if fraction > 1:
        raise ValueError(
            f"cannot emulate {target.key} ({target.mem_gb:g} GB) on a device of "
            f"{total_bytes / 1e9:.1f} GB: emulation only shrinks"
        )
    return fraction


def apply_emulation() -> HardwareProfile | None:
    """Restrict this process's GPU to the emulated profile; returns it, or None (nothing done)
    without CUDA or without $OPTBENCH_EMULATE. Call before the first CUDA allocation of every
    benchmark process."""
    if not torch.cuda.is_available() or not current().emulate:
        return None
    target = active_profile()
    device = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(memory_fraction(target, total), device)
    if not target.flash_attention:
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
    if not target.supports_tf32:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return target


def emulate_env(key: str) -> dict[str, str]:
    """Environment of an emulated run's benchmark processes; refuses (KeyError, ValueError) a target
    that is unknown, not a GPU, or larger than this machine's GPU."""
    target = lookup(key)
    _require_gpu(target)
    if torch.cuda.is_available():
        memory_fraction(target, torch.cuda.get_device_properties(0).total_memory)
    return {EMULATE_ENV: target.key}
