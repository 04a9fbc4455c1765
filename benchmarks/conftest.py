"""pytest-benchmark's saved runs carry optbench's machine record (GPU name, driver, CUDA, torch, triton),
which its own ``machine_info`` (CPU and Python only) lacks."""

from __future__ import annotations

from typing import Any


def pytest_benchmark_update_machine_info(config: Any, machine_info: dict[str, Any]) -> None:
    from optbench.machine import machine_info as optbench_machine_info

    machine_info["optbench"] = optbench_machine_info()
