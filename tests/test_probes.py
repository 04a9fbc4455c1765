"""scripts/probes/: the one-off device probes import (a probe that imports a module or name of the
project that no longer exists fails here, not on its next GPU run), import without running, and the
results folders their docstrings name (where their output is) exist."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re

import pytest

from optbench.store.store import REPO_ROOT

pytest.importorskip("torch")  # every probe needs torch; nothing else is a reason to skip

ROOT = REPO_ROOT
PROBES = sorted((ROOT / "scripts" / "probes").glob("*.py"))
FIRST_PARTY = ("optbench", "models", "kernels")


def test_there_are_probes_and_none_is_left_in_results():
    assert PROBES
    assert sorted((ROOT / "results").rglob("*.py")) == []  # results/ is neither linted nor tested


@pytest.mark.parametrize("path", PROBES, ids=[p.stem for p in PROBES])
def test_a_probe_imports_without_running(path, monkeypatch, capsys):
    # as `python3 -m scripts.probes.<name>` from the repository root
    monkeypatch.syspath_prepend(str(ROOT))
    spec = importlib.util.spec_from_file_location(f"probe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    # ImportError (ModuleNotFoundError) for a module or name that moved
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), (
        "a probe's work runs from main(), under __name__ == '__main__'"
    )
    assert capsys.readouterr().out == ""  # importing it measured nothing
    assert module.__doc__, "a probe says what it measures and where its output is"
    for folder in re.findall(r"results/[\w./-]+", module.__doc__):
        assert (ROOT / folder.rstrip(".")).exists(), folder


@pytest.mark.parametrize("path", PROBES, ids=[p.stem for p in PROBES])
def test_a_probes_imports_of_the_project_resolve_also_inside_functions(path, monkeypatch):
    """What a probe imports from optbench, models or kernels where it runs (inside main, say)
    exists."""
    monkeypatch.syspath_prepend(str(ROOT))
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in imported:
            if module.split(".")[0] not in FIRST_PARTY:
                continue
            found = importlib.import_module(module)  # ModuleNotFoundError for a module that moved
            assert (
                name is None or hasattr(found, name) or importlib.util.find_spec(f"{module}.{name}")
            ), f"{path.name}: from {module} import {name}"
