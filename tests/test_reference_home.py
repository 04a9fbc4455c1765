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
from optbench.measure.hardware import PROFILES
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
    # a card with room for the float64 steps and half the reference's 8 bytes a value, not all
    fp64_steps = step_memory_bytes(
        CONFIGS["1B"], step_pair(h100, "1B", "fp32")[0].replace(precision="fp64")
    )
    half = dataclasses.replace(h100, mem_gb=(fp64_steps + own * 1.5) / (1 - MEMORY_MARGIN) / 1e9)
    assert _home(monkeypatch, half, "1B", "fp32") == "cpu"


def test_what_the_process_already_holds_is_counted(monkeypatch):
    """Mutation: a card with room for the 1B reference and its steps, but not beside the bytes an
    earlier case of the process left allocated, keeps the reference on the host."""
    h100 = PROFILES["h100-sxm"]
    reference, options = step_pair(h100, "1B", "eager")
    steps = step_memory_bytes(CONFIGS["1B"], options.replace(precision="fp32"))
    own = 2 * param_count(CONFIGS["1B"]) * 4
    card = dataclasses.replace(h100, mem_gb=(steps + own + 4e9) / (1 - MEMORY_MARGIN) / 1e9)
    monkeypatch.setattr(workloads, "held_beside_references", lambda device: 0)
    assert _home(monkeypatch, card, "1B", "eager") == "cuda"
    monkeypatch.setattr(workloads, "held_beside_references", lambda device: 5e9)
    assert _home(monkeypatch, card, "1B", "eager") == "cpu"


def test_the_cached_references_are_not_counted_as_held(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 10_000)
    monkeypatch.setattr(workloads, "_REFERENCES", {"a": None, "b": None})
    monkeypatch.setattr(workloads, "reference_bytes", lambda key, device: 3_000)
    assert workloads.held_beside_references("cuda") == 4_000
    assert workloads.held_beside_references("cpu") == 0


@dataclasses.dataclass
class _Reference:
    """A reference that says where it is and counts its moves."""

    where: str
    moves: int = 0

    @property
    def device(self) -> torch.device:
        return SimpleNamespace(type=self.where)

    def copy_to(self, device: str) -> _Reference:
        _MOVES.append((self.where, str(device)))
        return _Reference(str(device), self.moves + 1)


_MOVES: list[tuple[str, str]] = []  # every copy_to of a _Reference: (from, to)


@pytest.mark.parametrize(
    ("key", "home", "kept"),
    [
        ("a", "cuda", {"a": "cuda", "b": "cpu", "c": "cpu"}),
        ("a", "cpu", dict.fromkeys("abc", "cpu")),
        ("c", "cuda", {"a": "cpu", "b": "cpu", "c": "cuda"}),  # back from the host, once
    ],
)
def test_a_case_s_reference_goes_home_and_the_others_to_the_host(monkeypatch, key, home, kept):
    """Mutations: a reference moved where it already is (a copy for nothing: ~7 s at 1B), or one
    left on the host where its home is the device (every check then copies it back)."""
    cached = {
        name: Baseline(_Reference(where), "bf16", {}, 8)
        for name, where in (("a", "cuda"), ("b", "cuda"), ("c", "cpu"))
    }
    monkeypatch.setattr(workloads, "_REFERENCES", cached)
    workloads.place_references(key, home)
    assert {name: b.reference.where for name, b in cached.items()} == kept
    moved = {
        name
        for name, (_, where) in zip(cached, (("a", "cuda"), ("b", "cuda"), ("c", "cpu")))
        if where != kept[name]
    }
    assert {name: b.reference.moves for name, b in cached.items()} == {
        name: int(name in moved) for name in cached
    }
    assert list(cached) == ["a", "b", "c"]  # the least recently used still goes first


def test_step_work_builds_the_reference_at_its_home_and_evicts_before_moving(monkeypatch):
    """The wiring: the baseline is built with ``host`` as its home says, a case with another
    reference sends the first to the host, and the least recently used reference is dropped before
    any move (not copied to the host first). Mutations: ``host=True`` always, no placement, or
    placing before evicting."""
    from models import step as step_mod

    built = []

    def baseline_of(build, reference, precision, host=False):
        built.append(host)
        return Baseline(_Reference("cpu" if host else "cuda"), precision, {}, 8)

    monkeypatch.setattr(step_mod, "baseline_of", baseline_of)
    monkeypatch.setattr(workloads, "_REFERENCES", {})
    monkeypatch.setattr(workloads, "_KEEP_REFERENCES", 2)
    monkeypatch.setattr(workloads, "reference_home", lambda *args: "cuda")
    workloads.step_work("tiny", "checkpoint", "cpu")
    (first,) = workloads._REFERENCES
    assert built == [False] and workloads._REFERENCES[first].reference.where == "cuda"
    workloads.step_work("tiny", "qknorm", "cpu")  # another reference (a QK-norm model)
    assert built == [False, False] and len(workloads._REFERENCES) == 2
    assert workloads._REFERENCES[first].reference.where == "cpu"
    (second,) = (b for k, b in workloads._REFERENCES.items() if k != first)
    assert second.reference.where == "cuda"
    monkeypatch.setattr(workloads, "_KEEP_REFERENCES", 1)
    _MOVES.clear()
    workloads.step_work("tiny", "fp16-scaler", "cpu")  # a third, with room for one: both go
    assert len(workloads._REFERENCES) == 1 and _MOVES == []  # dropped unmoved
    monkeypatch.setattr(workloads, "reference_home", lambda *args: "cpu")
    workloads._REFERENCES.clear()
    workloads.step_work("tiny", "checkpoint", "cpu")
    assert built[-1] is True


def test_a_step_checked_in_an_earlier_run_builds_no_reference_and_no_check(monkeypatch):
    """OPTBENCH_CHECKED_IN (ab's later rounds of one side): no baseline built, no check, the run
    named on the Work; without it, both. Mutation: a step that ignores the setting builds the
    1B reference (8.8 GB, seconds) in every round."""
    from models import step as step_mod

    built = []

    def baseline_of(build, reference, precision, host=False):
        built.append(host)
        return Baseline(_Reference("cpu"), precision, {}, 8)

    monkeypatch.setattr(step_mod, "baseline_of", baseline_of)
    monkeypatch.setattr(workloads, "_REFERENCES", {})
    monkeypatch.setenv("OPTBENCH_CHECKED_IN", "20261128T000000Z-abcdef")
    work = workloads.step_work("tiny", "checkpoint", "cpu")
    assert built == [] and workloads._REFERENCES == {}
    assert work.check is None and work.checked_in == "20261128T000000Z-abcdef"
    monkeypatch.delenv("OPTBENCH_CHECKED_IN")
    work = workloads.step_work("tiny", "checkpoint", "cpu")
    assert len(built) == 1 and work.check is not None and work.checked_in is None
