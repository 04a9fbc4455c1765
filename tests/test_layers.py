"""The harness in layers: every import (module level or inside a function) points down, never up,
and no modules import each other in a circle.

store <- measure <- run <- asv, the rooms under optbench's other layers; store, measure and run <-
suite <- gate <- reporting, profiling <- cli (asv: reporting and cli); kernels <- models <- suite;
benchmarks (asv) read store, measure, run and the suite. A planted upward import and a planted
cycle are caught (the checks can fail).
"""

from __future__ import annotations

import ast
from pathlib import Path

from optbench.store.store import REPO_ROOT

ROOT = REPO_ROOT

# package (a module path prefix) -> the prefixes its modules may import from this repository
LOW = ("optbench.store", "optbench.measure", "optbench.run")  # the rooms every upper layer reads
ALLOWED: dict[str, tuple[str, ...]] = {
    "kernels": ("kernels",),
    "models": ("kernels", "models"),
    "optbench.store": ("optbench.store",),
    "optbench.measure": ("optbench.store", "optbench.measure"),
    "optbench.run": LOW,
    "optbench.asv": (*LOW, "optbench.asv"),
    "optbench.suite": (*LOW, "optbench.suite", "kernels", "models"),
    "optbench.gate": (*LOW, "optbench.suite", "optbench.gate"),
    "optbench.reporting": (
        *LOW,
        "optbench.asv",
        "optbench.suite",
        "optbench.gate",
        "optbench.reporting",
        "models",
    ),
    "optbench.profiling": (*LOW, "optbench.suite", "optbench.profiling", "kernels", "models"),
    "optbench.cli": ("optbench",),
    "optbench.__main__": ("optbench.cli",),
    "benchmarks": (*LOW, "optbench.suite", "kernels", "models", "benchmarks"),
}
OURS = ("kernels", "models", "optbench", "benchmarks")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports(source: str, module: str) -> set[str]:
    """Absolute names from the repository that ``source`` (module ``module``) imports anywhere:
    modules, and ``package.name`` for ``from package import name`` (a module or a name in one)."""
    found = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in OURS}


def _layer(module: str) -> str:
    return max((p for p in ALLOWED if module == p or module.startswith(p + ".")), key=len)


def violations(sources: dict[str, str]) -> list[str]:
    """'module -> imported' for every import of a layer from one it may not import."""
    bad = []
    for module, source in sources.items():
        allowed = ALLOWED[_layer(module)]
        for name in sorted(imports(source, module)):
            if not any(name == p or name.startswith(p + ".") for p in allowed):
                bad.append(f"{module} -> {name}")
    return bad


def module_of(name: str, modules: set[str]) -> str | None:
    """The module of ``modules`` that the imported ``name`` is or is in (its longest prefix), or
    None."""
    parts = name.split(".")
    prefixes = (".".join(parts[:i]) for i in range(len(parts), 0, -1))
    return next((m for m in prefixes if m in modules), None)


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the other modules of ``sources`` it imports (module level or inside a function)."""
    modules = set(sources)
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        found = {module_of(name, modules) for name in imports(source, module)}
        graph[module] = {m for m in found if m is not None and m != module}
    return graph


def cycles(sources: dict[str, str]) -> list[list[str]]:
    """The modules that import each other in a circle, as sorted groups: each module with every
    module that it reaches through imports and that reaches it back."""
    graph = import_graph(sources)

    def reached(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for m in graph[todo.pop()] - seen:
                seen.add(m)
                todo.append(m)
        return seen

    reach = {m: reached(m) for m in graph}
    groups = {
        tuple(sorted({m} | {n for n in reach[m] if m in reach[n]})) for m in graph if m in reach[m]
    }
    return sorted(list(g) for g in groups)


def _sources() -> dict[str, str]:
    files = [
        p for d in ("kernels", "models", "optbench", "benchmarks") for p in (ROOT / d).rglob("*.py")
    ]
    return {_module(p): p.read_text() for p in files if _module(p) != "optbench"}


def test_every_import_points_down():
    assert violations(_sources()) == []


def test_an_upward_import_is_caught():
    """Mutation: each kind of arrow the issue found running the wrong way is flagged, and each room
    of store <- measure <- run <- asv importing a room above it; the arrows down are not."""
    planted = {
        "optbench.store.store": "from optbench.gate import compare\n",
        "optbench.gate.compare": "from optbench.reporting.site import publish\n",
        "optbench.suite.plan": "def f():\n    from optbench.cli import main\n",
        "kernels.rmsnorm": "import models.config\n",
        "optbench.gate.noisecheck": "from benchmarks.bench_kernels import RMSNorm\n",
        "optbench.reporting.site": "from optbench import cli\n",
        "benchmarks.bench_step": "from optbench.reporting.site import publish\n",
        "optbench.store.settings": "from optbench.measure.hardware import detect\n",
        "optbench.measure.timing": "def f():\n    from optbench.run.runner import Work\n",
        "optbench.run.progress": "from optbench.asv import asv_timed\n",
        "optbench.asv.asv_timed": "from optbench.suite.catalog import SUITES\n",
        "optbench.run.runner": "from optbench.gate.changepoints import gpu_unit\n",
        "optbench.gate.ab": "from optbench.asv.asv_atomic import asv\n",
    }
    assert len(violations(planted)) == len(planted)
    down = {
        "optbench.suite.plan": "from optbench.store.store import ResultStore\n",
        "optbench.measure.emulate": "from optbench.store.settings import current\n",
        "optbench.run.runner": "from optbench.measure.lockstep import partner\n",
        "optbench.asv.asv_timed": "from optbench.run.progress import milliseconds\n",
        "optbench.reporting.site": "from optbench.asv.asv_atomic import asv\n",
        "optbench.reporting.data": "from optbench.gate.changepoints import unit_of\n",
    }
    assert violations(down) == []


def test_no_import_cycle():
    assert cycles(_sources()) == []


def test_a_planted_cycle_is_caught():
    """Mutation: a circle through a function-level import, through a package's submodule and
    through three modules is flagged, in the repository's own modules too; a diamond (two paths to
    one module) is none."""
    two = {
        "optbench.suite.plan": "from optbench.suite import distributed\n",
        "optbench.suite.distributed": "def f():\n    from optbench.suite.plan import VARIANTS\n",
    }
    assert cycles(two) == [["optbench.suite.distributed", "optbench.suite.plan"]]
    three = {
        "models.a": "import models.b\n",
        "models.b": "from models.c import x\n",
        "models.c": "from . import a\n",
        "models.d": "import models.a\n",
    }
    assert cycles(three) == [["models.a", "models.b", "models.c"]]
    diamond = {
        "kernels.a": "import kernels.b, kernels.c\n",
        "kernels.b": "import kernels.d\n",
        "kernels.c": "from kernels.d import y\n",
        "kernels.d": "",
    }
    assert cycles(diamond) == []
    sources = _sources()
    planted = "\n\ndef planted():\n    from optbench.suite.workloads import step_options\n"
    sources["optbench.suite.baseline"] += planted
    circle = {"optbench.suite.baseline", "optbench.suite.workloads"}
    assert any(circle <= set(group) for group in cycles(sources))
