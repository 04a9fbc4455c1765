"""Where a step check's high-precision reference waits while the candidate runs: on the device
where the memory estimate has room for it, on the host otherwise, and on the host while another
case's steps need the device."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from models.config import CONFIGS, param_count
from models.step import Baseline
from optbench.core.hardware import PROFILES
from optbench.suite import workloads
from optbench.suite.baseline import step_pair
from optbench.suite.memory_estimate import MEMORY_MARGIN, step_memory_bytes


def _home(monkeypatch, profile, size: str, variant: str) -> str:
    monkeypatch.setattr(workloads, "machine_profile", lambda device: profile)
    reference, options = step_pair(profile, size, variant)
    return workloads.reference_home(CONFIGS[size], reference, options, "cuda")


def test_a_1b_reference_stays_on_an_80gb_card_and_waits_on_the_host_of_a_40gb_one(monkeypatch):
    assert _home(monkeypatch, PROFILES["h100-sxm"], "1B", "best-kernels") == "cuda"
    assert _home(monkeypatch, PROFILES["a100-40gb"], "1B", "best-kernels") == "cpu"
    # a CPU has no device memory to free: the reference stays where the steps run
    monkeypatch.setattr(workloads, "machine_profile", lambda device: PROFILES["cpu"])
    reference, options = step_pair(PROFILES["cpu"], "tiny", "eager")
    assert workloads.reference_home(CONFIGS["tiny"], reference, options, "cpu") == "cpu"


def test_the_reference_counts_its_own_bytes_and_fp64_doubles_the_estimate(monkeypatch):
    h100 = PROFILES["h100-sxm"]
    reference, options = step_pair(h100, "1B", "eager")
    # the largest step built beside it: its own, the fp32 reference step, while it is copied
    steps = step_memory_bytes(CONFIGS["1B"], options.replace(precision="fp32"))
    own = 2 * param_count(CONFIGS["1B"]) * 4  # fp32 gradients and weights
    # a card where the steps fit but not beside the reference (mutation: its bytes left out)
    tight = dataclasses.replace(h100, mem_gb=(steps + own / 2) / (1 - MEMORY_MARGIN) / 1e9)
    assert _home(monkeypatch, tight, "1B", "eager") == "cpu"
    roomy = dataclasses.replace(h100, mem_gb=(steps + own * 1.1) / (1 - MEMORY_MARGIN) / 1e9)
    assert _home(monkeypatch, roomy, "1B", "eager") == "cuda"
    # an fp32 candidate's reference is float64: twice the bytes and a step twice the size
    fp32 = step_pair(h100, "1B", "fp32")[1]
    fp64 = fp32.replace(precision="fp64")
    assert step_memory_bytes(CONFIGS["1B"], fp64) == 2 * step_memory_bytes(CONFIGS["1B"], fp32)
    assert _home(monkeypatch, h100, "1B", "fp32") == "cpu"


@dataclasses.dataclass
class _Reference:
    where: str

    @property
    def device(self) -> torch.device:
        return SimpleNamespace(type=self.where)

    def copy_to(self, device: str) -> _Reference:
        return _Reference(str(device))


@pytest.mark.parametrize(
    ("home", "kept"),
    [("cuda", {"a": "cuda", "b": "cpu", "c": "cpu"}), ("cpu", dict.fromkeys("abc", "cpu"))],
)
def test_other_cases_references_move_to_the_host_before_a_case_is_built(monkeypatch, home, kept):
    cached = {
        key: Baseline(_Reference(where), "bf16", {}, 8)
        for key, where in (("a", "cuda"), ("b", "cuda"), ("c", "cpu"))
    }
    monkeypatch.setattr(workloads, "_REFERENCES", cached)
    workloads.park_references("a", home)
    assert {key: b.reference.where for key, b in cached.items()} == kept
    assert list(cached) == ["a", "b", "c"]  # the least recently used still goes first
