"""Description of the machine a benchmark runs on, and the name of its results folder."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from functools import cache
from typing import Any

import torch

from optbench.measure import hardware

_CPU_NOISE = re.compile(r"\((r|tm)\)|\bcpu\b|\bprocessor\b|@.*$|\b\d+-core\b", re.IGNORECASE)
_CPU_SLUG_CHARS = 32
HOST_ID_CHARS = 6
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def machine_info() -> dict[str, Any]:
    """Hardware and software of this machine; GPU fields are None (gpu_count 0) without CUDA.

    Keys: gpu_name, gpu_count, gpu_uuid (tells lent machines of one kind apart), driver, cuda,
    torch, triton, python, cpu, num_cpu, ram_gb (GB, 1e9 bytes), os, hostname, profile (hardware
    profile key), sm_clock_mhz and mem_clock_mhz (GPU 0's clocks now, from nvidia-smi; None without
    it), date (ISO 8601, UTC), compile_cache (what the run's compile caches started from: 'cold',
    'restored <key>', 'prewarmed' (cold, then filled by the run's compile warm-up:
    ``optbench.suite.prewarm``), or 'local' where nothing says), runs_at_once (runs measuring on
    this host at the same time, this one among them: one per GPU under ``run --gpus``, sharing the
    host's CPUs, which host-bound figures feel), interconnect (how the GPUs reach one another,
    :func:`interconnect`: e.g. 'NV18'; None with one GPU or none). Multi-GPU figures are per world
    size (a parameter of their records), so gpu_count and interconnect say what they ran on; they
    are never compared with 1-GPU figures.
    """
    from optbench.store.settings import current

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
        "host_id": host_id(),
        "profile": hardware.detect(0).key,
        "sm_clock_mhz": _int_or_none(smi[1]) if smi else None,
        "mem_clock_mhz": _int_or_none(smi[2]) if smi else None,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "compile_cache": current().compile_cache or "local",
        "runs_at_once": int(current().runs_at_once or 1),
        "interconnect": interconnect() if has_gpu and torch.cuda.device_count() > 1 else None,
    }


# nvidia-smi topo -m's link kinds, the slowest first: a machine's interconnect is the slowest link
# between two of its GPUs (what a collective over all of them waits on); NV<n> (n bonded NVLinks)
# ranks by n.
_LINKS = ("SYS", "NODE", "PHB", "PXB", "PIX")


def interconnect(topo: str | None = None) -> str | None:
    """The slowest link between two GPUs in ``nvidia-smi topo -m`` (run here without ``topo``):
    'NV18' (18 bonded NVLinks, e.g. NVSwitch on an H100/H200 SXM host), 'PIX' (one PCIe switch),
    'SYS' (across CPU sockets), ...; None without nvidia-smi, with fewer than two GPUs, or where its
    matrix does not parse."""
    if topo is None:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return None
        try:
            topo = subprocess.run(
                [exe, "topo", "-m"], capture_output=True, text=True, timeout=10, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    # not the header
    rows = [line.split() for line in topo.splitlines() if re.match(r"GPU\d+\s", line)]
    links = []
    for i, row in enumerate(rows):
        cells = row[1 : 1 + len(rows)]
        links += [cell for j, cell in enumerate(cells) if j != i]
    known = [link for link in links if link in _LINKS or re.fullmatch(r"NV\d+", link)]
    if not known:
        return None

    def speed(link: str) -> int:
        return 100 + int(link[2:]) if link.startswith("NV") else _LINKS.index(link)

    return min(known, key=speed)


def gpu_state() -> dict[str, Any] | None:
    """GPU 0's state now: sm_clock_mhz, power_w (the driver's average over about the last second),
    power_instant_w (the draw now; None where the driver does not report it), temperature_c and
    clock_events (the active clock-event reasons as a hex mask: 0x4 a software power cap, 0x20/0x40
    thermal slowdown). Taken right after a timing, it tells whether the figure ran at boost or at a
    power- or heat-limited clock. Read through NVML in this process where nvidia-ml-py is installed
    (about a millisecond), else from nvidia-smi (a process of its own, ~0.1 s); None without
    either."""
    nvml = _nvml_device()
    if nvml is not None:
        try:
            return _nvml_state(*nvml)
        except Exception:  # noqa: BLE001 - NVML errors are its own classes; nvidia-smi reads the same values
            pass
    fields = ["clocks.sm", "power.draw", "temperature.gpu", "clocks_event_reasons.active"]
    # a driver whose nvidia-smi lacks power.draw.instant refuses the whole query: ask again without
    # it
    smi = _nvidia_smi([*fields, "power.draw.instant"]) or _nvidia_smi(fields)
    if smi is None:
        return None
    return {
        "sm_clock_mhz": _int_or_none(smi[0]),
        "power_w": _float_or_none(smi[1]),
        "temperature_c": _int_or_none(smi[2]),
        "clock_events": smi[3],
        "power_instant_w": _float_or_none(smi[4]) if len(smi) > 4 else None,
    }


def power_limit_w() -> float | None:
    """GPU 0's enforced power limit, W (NVML, else nvidia-smi); None without either."""
    nvml = _nvml_device()
    if nvml is not None:
        try:
            return nvml[0].nvmlDeviceGetEnforcedPowerLimit(nvml[1]) / 1e3
        except Exception:  # noqa: BLE001
            pass
    limit = _nvidia_smi(["power.limit"])
    return _float_or_none(limit[0]) if limit else None


@cache
def _nvml_device() -> tuple[Any, Any] | None:
    """(pynvml, handle of CUDA device 0, matched by UUID), or None without nvidia-ml-py, a driver or
    a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
        if uuid is not None:
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # noqa: BLE001 - not installed, no driver, no GPU: nvidia-smi is the fallback
        return None


def _nvml_state(pynvml: Any, handle: Any) -> dict[str, Any]:
    reasons = (
        getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return {
        "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
        "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        "clock_events": f"0x{reasons(handle):016x}",
        "power_instant_w": _nvml_instant_power_w(pynvml, handle),
    }


# nvmlValueType_t -> the member of nvmlValue_t holding such a value
_NVML_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _nvml_instant_power_w(pynvml: Any, handle: Any) -> float | None:
    """The draw now (NVML_FI_DEV_POWER_INSTANT), W; None where the driver does not report it."""
    try:
        value = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_POWER_INSTANT])[0]
        if value.nvmlReturn != 0:  # NVML_SUCCESS
            return None
        return getattr(value.value, _NVML_VALUE_MEMBERS[value.valueType]) / 1e3
    except Exception:  # noqa: BLE001 - an older driver or nvidia-ml-py
        return None


# Clock-event reasons that mean the SM clock is held below what the load would get: a software power
# cap (0x4), hardware slowdown (0x8), software and hardware thermal slowdown (0x20, 0x40), the
# hardware power brake (0x80).
LIMITING_CLOCK_EVENTS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


class PowerSettle:
    """When a step's warm-up may end early (``optbench.measure.timing.measure(settled=...)``): once
    the GPU is not held back.

    Called with the warm-up's elapsed ms after each warm-up call. True once two consecutive polls of
    GPU 0 (:func:`gpu_state`, in a background thread every ``poll_s``, so that the load has no
    gaps), both begun at least ``min_ms`` into the warm-up, show no limiting clock event
    (:data:`LIMITING_CLOCK_EVENTS`) and a draw now (``power_instant_w``: the average over the last
    second still holds the idle time before the warm-up) under ``margin`` of the enforced power
    limit: a load that stays there runs at the clock it has now, so a longer warm-up would not
    change its figure. A load at the cap or near it, or a GPU without those readings, is never
    settled: its warm-up runs its full length. ``on_settled(elapsed_ms)`` is called once, where it
    ends early. Polls stop once settled, or after ``max_s``."""

    def __init__(
        self,
        min_ms: float = 500.0,
        poll_s: float = 0.15,
        margin: float = 0.85,
        max_s: float = 10.0,
        on_settled: Callable[[float], Any] | None = None,
    ):
        self.min_ms, self.poll_s, self.margin, self.max_s = min_ms, poll_s, margin, max_s
        self.on_settled = on_settled
        self._start: float | None = None  # perf_counter at the warm-up's start
        # (ms into the warm-up at the poll's start, state)
        self._polls: list[tuple[float, dict[str, Any] | None]] = []
        self._limit_w: float | None = None
        self._done = threading.Event()
        self.settled_ms: float | None = None

    def __call__(self, elapsed_ms: float) -> bool:
        if self.settled_ms is not None:
            return True
        if self._start is None:
            self._start = time.perf_counter() - elapsed_ms / 1e3
            threading.Thread(target=self._poll, name="optbench-power-settle", daemon=True).start()
        polls = [state for at, state in list(self._polls) if at >= self.min_ms]
        if len(polls) >= 2 and all(self._unlimited(state) for state in polls[-2:]):
            self.settled_ms = elapsed_ms
            self._done.set()
            if self.on_settled is not None:
                self.on_settled(elapsed_ms)
            return True
        return False

    def _unlimited(self, state: dict[str, Any] | None) -> bool:
        if not state or self._limit_w is None or state.get("power_instant_w") is None:
            return False
        try:
            events = int(str(state.get("clock_events")), 16)
        except ValueError:
            return False
        return (
            not events & LIMITING_CLOCK_EVENTS
            and state["power_instant_w"] < self.margin * self._limit_w
        )

    def _poll(self) -> None:
        self._limit_w = power_limit_w()
        while not self._done.is_set() and self._start is not None:
            at_ms = (time.perf_counter() - self._start) * 1e3
            if at_ms > self.max_s * 1e3:
                return
            self._polls.append((at_ms, gpu_state()))
            self._done.wait(self.poll_s)


def host_id() -> str:
    """A short id of this host, stable across reboots: the first :data:`HOST_ID_CHARS` hex digits of
    the SHA-256 of the first non-empty file of :data:`MACHINE_ID_FILES` (systemd's machine id), else
    of the host's name."""
    for path in MACHINE_ID_FILES:
        try:
            with open(path) as f:
                ident = f.read().strip()
        except OSError:
            continue
        if ident:
            break
    else:
        ident = socket.gethostname()
    return hashlib.sha256(ident.encode()).hexdigest()[:HOST_ID_CHARS]


def machine_name(info: dict[str, Any] | None = None, emulate: str | None = None) -> str:
    """Results-folder name: the profile key of the GPU ('h100-sxm', 't4', or the slug of an unknown
    GPU's name); without a GPU 'cpu-<short cpu slug>-<host_id>' (two hosts with one CPU model never
    share a name; an info without ``host_id`` gets none); plus '-emulating-<key>' when emulating a
    profile.
    """
    info = machine_info() if info is None else info
    if info.get("gpu_name"):
        name = hardware.key_for(info["gpu_name"])
    else:
        cpu = hardware.slugify(_CPU_NOISE.sub(" ", info.get("cpu") or ""))
        name = "-".join(
            filter(
                None, ["cpu", cpu[:_CPU_SLUG_CHARS].rstrip("-") or "unknown", info.get("host_id")]
            )
        )
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
    """CUDA driver API version torch sees, e.g. 'cuda-driver 13.0' (not the NVIDIA driver
    version)."""
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
