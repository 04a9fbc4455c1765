"""The ``compile`` kernel baselines are compiled for each shape alone, as a user compiles a model.

A recording backend stands in for inductor (optbench.suite.ops.COMPILE_BACKEND): it keeps each graph
dynamo hands it and runs it eagerly, so these tests are quick on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest
import torch

from kernels.rmsnorm import rms_norm_eager
from optbench.suite import ops as registry

# Small stand-ins for each op's grid: several shapes measured one after another in one process.
SHAPES = {
    "rmsnorm": [{"rows": r, "hidden": h} for r, h in [(8, 16), (12, 16), (8, 32), (16, 24)]],
    "qkv_rope": [
        {"tokens": 8 * s, "q_heads": hq, "kv_heads": hk, "head_dim": d}
        for s, hq, hk, d in [(2, 2, 1, 8), (3, 4, 2, 8), (2, 2, 1, 16)]
    ],
}


class Recorder:
    """A dynamo backend that keeps every graph it is given and runs it eagerly."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs.append(gm)
        return gm.forward


def symbolic_inputs(gm: torch.fx.GraphModule) -> list[str]:
    """The graph's inputs that are symbolic sizes, or tensors with a symbolic size (empty: all
    static)."""
    found = []
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value")
        sizes = [value] if isinstance(value, torch.SymInt) else list(getattr(value, "shape", ()))
        if any(isinstance(s, torch.SymInt) for s in sizes):
            found.append(f"{node.name}: {value}")
    return found


def unfair_compiles(
    build: Callable[[dict[str, int]], Callable], op: registry.Op, recorder: Recorder
) -> list[str]:
    """Measures ``build(dims)`` at every test shape of ``op`` in turn; returns what is not one
    static graph compiled for each shape alone (a symbolic size, or a shape that got no graph:
    dynamo ran it eagerly)."""
    problems = []
    gen = torch.Generator().manual_seed(0)
    for dims in SHAPES[op.name]:
        before = len(recorder.graphs)
        build(dims)(*op.make_inputs(dims, torch.float32, "cpu", gen))
        graphs = recorder.graphs[before:]
        if not graphs:
            problems.append(f"{dims}: no graph compiled (ran eagerly)")
        problems += [f"{dims}: symbolic {s}" for g in graphs for s in symbolic_inputs(g)]
    return problems


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(registry, "COMPILE_BACKEND", rec)
    torch._dynamo.reset()
    yield rec
    torch._dynamo.reset()


@pytest.mark.parametrize("op_name", list(SHAPES))
def test_each_shape_gets_its_own_static_graph(recorder: Recorder, op_name: str) -> None:
    op = registry.OPS[op_name]
    assert unfair_compiles(lambda dims: op.impl("compile", dims), op, recorder) == []


def test_more_shapes_than_the_recompile_limit(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the per-code-object recompile limit at 1, every shape still gets its own compiled
    graph."""
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    op = registry.OPS["rmsnorm"]
    assert unfair_compiles(lambda dims: op.impl("compile", dims), op, recorder) == []


def test_a_shared_compiled_function_is_caught(recorder: Recorder) -> None:
    """Mutation: the former baseline, one cached ``torch.compile`` of eager reused for every shape,
    recompiles the second shape with symbolic sizes."""
    shared = cache(lambda fn: torch.compile(fn, backend=recorder))
    op = registry.OPS["rmsnorm"]
    problems = unfair_compiles(lambda dims: shared(rms_norm_eager), op, recorder)
    assert any("symbolic" in p for p in problems), problems


def test_a_shared_code_object_is_caught(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutation: static per-shape compiles of one code object stop compiling at dynamo's recompile
    limit."""
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    op = registry.OPS["rmsnorm"]
    problems = unfair_compiles(
        lambda dims: torch.compile(rms_norm_eager, dynamic=False, backend=recorder), op, recorder
    )
    assert any("ran eagerly" in p for p in problems), problems
