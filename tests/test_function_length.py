"""No function in optbench/ is over :data:`LIMIT` lines (from its ``def`` to its last line,
docstring included): a longer one hides its steps. The check can fail: a planted long function is
caught."""

from __future__ import annotations

import ast

from optbench.store.store import REPO_ROOT

LIMIT = 100


def long_functions(source: str, limit: int = LIMIT) -> list[str]:
    """'name (N lines)' of every function of ``source`` (methods and nested ones too) over
    ``limit`` lines."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_function_in_optbench_is_over_the_limit():
    found = {
        str(path.relative_to(REPO_ROOT)): long_functions(path.read_text())
        for path in sorted((REPO_ROOT / "optbench").rglob("*.py"))
    }
    assert {path: names for path, names in found.items() if names} == {}


def test_a_long_function_is_caught():
    """Mutation: a function of LIMIT + 1 lines is flagged, a method or a nested function too; one
    of LIMIT lines is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 1))
    assert long_functions(f"def f():\n{body}") == []
    assert long_functions(f"def g():\n{body}    return 0\n") == [f"g ({LIMIT + 1} lines)"]
    method = "class C:\n    def m(self):\n" + body.replace("    ", "        ") + "        pass\n"
    assert long_functions(method) == [f"m ({LIMIT + 1} lines)"]
    nested = f"def outer():\n    def inner():\n{body.replace('    ', '        ')}        pass\n"
    assert long_functions(nested) == [f"outer ({LIMIT + 2} lines)", f"inner ({LIMIT + 1} lines)"]
