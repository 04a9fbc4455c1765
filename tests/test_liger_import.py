"""kernels.liger: Liger's optional peft import is skipped for the import of a Liger module, and only
then."""

import importlib
import sys

import pytest

from kernels.liger import SKIPPED, import_without, liger


@pytest.fixture
def packages(tmp_path, monkeypatch):
    """A package 'lib' that, like Liger, tries an optional heavy import ('heavy') and records
    whether it got it."""
    (tmp_path / "heavy.py").write_text("LOADED = True\n")
    (tmp_path / "lib.py").write_text(
        "try:\n    import heavy\n    HAS_HEAVY = True\nexcept ImportError:\n    HAS_HEAVY = False\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("lib", "heavy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("lib", "heavy"):
        sys.modules.pop(name, None)


def test_the_skipped_import_is_unavailable_during_the_import_only(packages):
    lib = import_without("lib", ["heavy"])
    # skipped, and not left marked unavailable
    assert lib.HAS_HEAVY is False and "heavy" not in sys.modules
    assert importlib.import_module("heavy").LOADED  # a later import works


def test_without_skipping_the_heavy_import_happens(packages):
    """The planted package does import 'heavy' when nothing is skipped: the test above can fail."""
    assert import_without("lib", []).HAS_HEAVY is True and "heavy" in sys.modules


def test_an_already_imported_module_is_left_alone(packages):
    heavy = importlib.import_module("heavy")
    assert import_without("lib", ["heavy"]).HAS_HEAVY is True and sys.modules["heavy"] is heavy


def test_liger_is_imported_without_peft():
    liger_kernel = pytest.importorskip(
        "liger_kernel.ops.swiglu", reason="liger-kernel is not installed"
    )
    assert SKIPPED == ("peft",)
    assert liger("ops.swiglu") is liger_kernel
    assert sys.modules.get("peft", 0) is not None  # not left marked unavailable
