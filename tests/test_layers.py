"""The harness in layers: every import (module level or inside a function) points down, never up.

core <- suite <- gate <- reporting, profiling <- cli; kernels <- models <- suite; benchmarks (asv) read the core and the
suite. A planted upward import is caught (the check can fail).
"""

from __future__ import annotations

import ast
from pathlib import Path

from optbench.core.store import REPO_ROOT

ROOT = REPO_ROOT

# package (a module path prefix) -> the prefixes its modules may import from this repository
ALLOWED: dict[str, tuple[str, ...]] = {
    "kernels": ("kernels",),
    "models": ("kernels", "models"),
    "optbench.core": ("optbench.core",),
    "optbench.suite": ("optbench.core", "optbench.suite", "kernels", "models"),
    "optbench.gate": ("optbench.core", "optbench.suite", "optbench.gate"),
    "optbench.reporting": ("optbench.core", "optbench.suite", "optbench.gate", "optbench.reporting", "models"),
    "optbench.profiling": ("optbench.core", "optbench.suite", "optbench.profiling", "kernels", "models"),
    "optbench.cli": ("optbench",),
    "optbench.__main__": ("optbench.cli",),
    "benchmarks": ("optbench.core", "optbench.suite", "kernels", "models", "benchmarks"),
}
OURS = ("kernels", "models", "optbench", "benchmarks")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports(source: str, module: str) -> set[str]:
    """Absolute names of the repository's modules that ``source`` (module ``module``) imports anywhere."""
    found = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{alias.name}" for alias in node.names} if base in ("optbench", "optbench.core") \
                else {base}
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


def _sources() -> dict[str, str]:
    files = [p for d in ("kernels", "models", "optbench", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    return {_module(p): p.read_text() for p in files if _module(p) != "optbench"}


def test_every_import_points_down():
    assert violations(_sources()) == []


def test_an_upward_import_is_caught():
    """Mutation: each kind of arrow the issue found running the wrong way is flagged."""
    planted = {
        "optbench.core.store": "from optbench.gate import compare\n",
        "optbench.gate.compare": "from optbench.reporting.site import publish\n",
        "optbench.suite.plan": "def f():\n    from optbench.cli import main\n",
        "kernels.rmsnorm": "import models.config\n",
        "optbench.gate.noisecheck": "from benchmarks.bench_kernels import RMSNorm\n",
        "optbench.reporting.site": "from optbench import cli\n",
        "benchmarks.bench_step": "from optbench.reporting.site import publish\n",
    }
    assert len(violations(planted)) == len(planted)
    assert violations({"optbench.suite.plan": "from optbench.core.store import ResultStore\n"}) == []
