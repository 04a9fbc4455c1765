"""Liger-Kernel, the reference our kernels are measured against, imported without its optional peft
import.

Liger's package imports peft on its first import (``liger_kernel.utils``: to recognise PEFT-wrapped
LM heads in its HuggingFace monkey patches, which optbench does not use), and peft imports
transformers: on a runner with the HF stack, nearly all of what ``import liger_kernel.ops.swiglu``
takes (``python -X importtime``).
:func:`liger` imports a Liger module with peft reading as not installed for that import only; Liger
then takes the path it takes wherever peft is absent, and a later ``import peft`` works as usual.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from types import ModuleType

SKIPPED = ("peft",)  # optional imports of Liger's that optbench's use of it does not need


def import_without(module: str, skipped: Iterable[str]) -> ModuleType:
    """Import ``module`` while each of ``skipped`` not yet imported raises ImportError (a None entry
    in ``sys.modules``, Python's way of marking a module unavailable); afterwards they import as
    usual."""
    blocked = [name for name in skipped if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        return importlib.import_module(module)
    finally:
        for name in blocked:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


def liger(module: str) -> ModuleType:
    """``liger_kernel.<module>`` ('ops.swiglu', 'transformers', ...) without peft (module
    docstring)."""
    return import_without(f"liger_kernel.{module}", SKIPPED)
