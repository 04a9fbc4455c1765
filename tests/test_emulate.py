"""optbench.measure.emulate: the emulated profile, the environment of an emulated run, and what
apply_emulation does to a CUDA process (here with torch.cuda faked) or, without CUDA, does not."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from optbench.measure import emulate as E
from optbench.measure.hardware import PROFILES
from optbench.suite import plan as P


def test_active_profile_without_emulation(monkeypatch):
    monkeypatch.delenv(E.EMULATE_ENV, raising=False)
    monkeypatch.setattr(E, "detect", lambda: PROFILES["h100-sxm"])
    assert E.active_profile() == PROFILES["h100-sxm"]


def test_active_profile_emulates(monkeypatch):
    monkeypatch.setenv(E.EMULATE_ENV, "t4")
    monkeypatch.setattr(E, "detect", lambda: PROFILES["h100-sxm"])
    profile = E.active_profile()
    assert profile.key == "t4" and profile.emulated_from == "h100-sxm"
    assert dataclasses.replace(profile, emulated_from=None) == PROFILES["t4"]
    # the skips see the emulated card
    assert P.plan(profile, "quick") == P.plan(PROFILES["t4"], "quick")


def test_emulate_env():
    assert E.emulate_env("t4") == {E.EMULATE_ENV: "t4"}
    with pytest.raises(KeyError):
        E.emulate_env("v100")
    with pytest.raises(ValueError):
        E.emulate_env("cpu")


def test_memory_fraction():
    assert E.memory_fraction(PROFILES["t4"], int(80e9)) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="only shrinks"):
        E.memory_fraction(PROFILES["h200"], int(85e9))


def test_apply_emulation_without_cuda_does_nothing(monkeypatch):
    monkeypatch.setenv(E.EMULATE_ENV, "t4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", pytest.fail)
    flags = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.matmul.allow_tf32)
    assert E.apply_emulation() is None
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.matmul.allow_tf32) == flags


def test_apply_emulation_without_target_does_nothing(monkeypatch):
    monkeypatch.delenv(E.EMULATE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", pytest.fail)
    assert E.apply_emulation() is None


def _fake_cuda(monkeypatch, total_bytes: int) -> dict:
    """torch.cuda on one device of total_bytes, recording what apply_emulation sets."""
    calls: dict = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    properties = SimpleNamespace(total_memory=total_bytes)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
    monkeypatch.setattr(
        torch.cuda,
        "set_per_process_memory_fraction",
        lambda fraction, device: calls.update(fraction=fraction, device=device),
    )
    monkeypatch.setattr(torch.backends.cuda, "enable_flash_sdp", lambda on: calls.update(flash=on))
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", lambda on: calls.update(cudnn=on))
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)  # restored after the test
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(E, "detect", lambda: PROFILES["h100-sxm"])
    return calls


def test_apply_emulation_caps_memory_and_features(monkeypatch):
    calls = _fake_cuda(monkeypatch, int(85e9))
    monkeypatch.setenv(E.EMULATE_ENV, "t4")
    assert E.apply_emulation().key == "t4"
    assert calls == {
        "fraction": pytest.approx(16e9 / 85e9),
        "device": 0,
        "flash": False,
        "cudnn": False,
    }
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32


def test_apply_emulation_keeps_what_the_target_has(monkeypatch):
    calls = _fake_cuda(monkeypatch, int(85e9))
    monkeypatch.setenv(E.EMULATE_ENV, "a100-40gb")
    assert E.apply_emulation().key == "a100-40gb"
    assert calls == {"fraction": pytest.approx(40e9 / 85e9), "device": 0}
    assert torch.backends.cuda.matmul.allow_tf32


def test_apply_emulation_refuses_a_larger_target(monkeypatch):
    _fake_cuda(monkeypatch, int(85e9))
    monkeypatch.setenv(E.EMULATE_ENV, "h200")
    with pytest.raises(ValueError):
        E.apply_emulation()
