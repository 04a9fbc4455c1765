"""Description of the machine a benchmark runs on, and the name of its results folder."""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from datetime import datetime, timezone
from typing import Any

import torch

from optbench.core import hardware

_CPU_NOISE = re.compile(r"\((r|tm)\)|\bcpu\b|\bprocessor\b|@.*$|\b\d+-core\b", re.IGNORECASE)
_CPU_SLUG_CHARS = 32


def machine_info() -> dict[str, Any]:
    """Hardware and software of this machine; GPU fields are None (gpu_count 0) without CUDA.

    Keys: gpu_name, gpu_count, gpu_uuid (tells lent machines of one kind apart), driver, cuda, torch, triton,
    python, cpu, num_cpu, ram_gb (GB, 1e9 bytes), os, hostname, profile (hardware profile key), sm_clock_mhz and
    mem_clock_mhz (GPU 0's clocks now, from nvidia-smi; None without it), date (ISO 8601, UTC), compile_cache
    (what the run's compile caches started from: 'cold', 'restored <key>', or 'local' where nothing says),
    interconnect (how the GPUs reach one another, :func:`interconnect`: e.g. 'NV18'; None with one GPU or none).
    Multi-GPU figures are per world size (a parameter of their records), so gpu_count and interconnect say what
    they ran on; they are never compared with 1-GPU figures.
    """
    from optbench.core.settings import current

    has_gpu = torch.cuda.is_available()
    smi = _nvidia_smi(["driver_version", "clocks.sm", "clocks.mem"]) if has_gpu else None
    return {
        "gpu_name": torch.cuda.get_device_name(0) if has_gpu else None,
        "gpu_count": torch.cuda.device_count() if has_gpu else 0,
        "gpu_uuid": f"GPU-{torch.cuda.get_device_properties(0).uuid}" if has_gpu else None,
        "driver": smi[0] if smi else (_torch_driver() if has_gpu else None),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": _triton_version(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "num_cpu": os.cpu_count(),
        "ram_gb": _ram_gb(),
        "os": platform.platform(),
        "hostname": socket.gethostname(),
        "profile": hardware.detect(0).key,
        "sm_clock_mhz": _int_or_none(smi[1]) if smi else None,
        "mem_clock_mhz": _int_or_none(smi[2]) if smi else None,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "compile_cache": current().compile_cache or "local",
        "interconnect": interconnect() if has_gpu and torch.cuda.device_count() > 1 else None,
    }


# nvidia-smi topo -m's link kinds, the slowest first: a machine's interconnect is the slowest link between two of
# its GPUs (what a collective over all of them waits on); NV<n> (n bonded NVLinks) ranks by n.
_LINKS = ("SYS", "NODE", "PHB", "PXB", "PIX")


def interconnect(topo: str | None = None) -> str | None:
    """The slowest link between two GPUs in ``nvidia-smi topo -m`` (run here without ``topo``): 'NV18' (18
    bonded NVLinks, e.g. NVSwitch on an H100/H200 SXM host), 'PIX' (one PCIe switch), 'SYS' (across CPU
    sockets), ...; None without nvidia-smi, with fewer than two GPUs, or where its matrix does not parse."""
    if topo is None:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return None
        try:
            topo = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=10,
                                  check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    rows = [line.split() for line in topo.splitlines() if re.match(r"GPU\d+\s", line)]  # not the header
    links = []
    for i, row in enumerate(rows):
        cells = row[1:1 + len(rows)]
        links += [cell for j, cell in enumerate(cells) if j != i]
    known = [link for link in links if link in _LINKS or re.fullmatch(r"NV\d+", link)]
    if not known:
        return None

    def speed(link: str) -> int:
        return 100 + int(link[2:]) if link.startswith("NV") else _LINKS.index(link)

    return min(known, key=speed)


def gpu_state() -> dict[str, Any] | None:
    """GPU 0's state now, from nvidia-smi: sm_clock_mhz, power_w, temperature_c and clock_events (the active
    clock-event reasons as a hex mask: 0x4 a software power cap, 0x20/0x40 thermal slowdown). Taken right after
    a timing, it tells whether the figure ran at boost or at a power- or heat-limited clock. None without it."""
    smi = _nvidia_smi(["clocks.sm", "power.draw", "temperature.gpu", "clocks_event_reasons.active"])
    if smi is None:
        return None
    return {"sm_clock_mhz": _int_or_none(smi[0]), "power_w": _float_or_none(smi[1]),
            "temperature_c": _int_or_none(smi[2]), "clock_events": smi[3]}


def machine_name(info: dict[str, Any] | None = None, emulate: str | None = None) -> str:
    """Results-folder name: the profile key of the GPU ('h100-sxm', 't4', or the slug of an unknown
    GPU's name), 'cpu-<short cpu slug>' without a GPU, plus '-emulating-<key>' when emulating a profile.
    """
    info = machine_info() if info is None else info
    if info.get("gpu_name"):
        name = hardware.key_for(info["gpu_name"])
    else:
        cpu = hardware.slugify(_CPU_NOISE.sub(" ", info.get("cpu") or ""))
        name = f"cpu-{cpu[:_CPU_SLUG_CHARS].rstrip('-') or 'unknown'}"
    return f"{name}-emulating-{hardware.lookup(emulate).key}" if emulate else name


def _nvidia_smi(fields: list[str]) -> list[str] | None:
    """nvidia-smi's values of fields for CUDA device 0 (matched by UUID, else the first GPU listed).

    None without nvidia-smi or when it fails.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    cmd = [exe, f"--query-gpu=uuid,{','.join(fields)}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[v.strip() for v in line.split(",")] for line in out.strip().splitlines()]
    rows = [row for row in rows if len(row) == len(fields) + 1]
    if not rows:
        return None
    uuid = f"GPU-{getattr(torch.cuda.get_device_properties(0), 'uuid', '')}"
    return next((row for row in rows if row[0] == uuid), rows[0])[1:]


def _float_or_none(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:  # '[N/A]', '[Not Supported]'
        return None


def _int_or_none(value: str) -> int | None:
    number = _float_or_none(value)
    return None if number is None else int(number)


def _torch_driver() -> str | None:
    """CUDA driver API version torch sees, e.g. 'cuda-driver 13.0' (not the NVIDIA driver version)."""
    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    if get is None:
        return None
    version = get()
    return f"cuda-driver {version // 1000}.{version % 1000 // 10}"


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (AttributeError, ValueError, OSError):
        return None
