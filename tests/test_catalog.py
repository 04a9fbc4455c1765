"""The catalog is the only place benchmarks are listed: asv's classes, the suites, the plan, the
pytest twin, the CLI and every name in the harness's code agree with it, and it imports without
torch."""

from __future__ import annotations

import importlib
import inspect
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from models.variants import ABLATED
from optbench.store.store import REPO_ROOT, record_key
from optbench.suite import catalog

ROOT = REPO_ROOT
BENCHMARK_NAME = re.compile(r"""["'`](bench_\w+\.[A-Z]\w*)(?![\w{])""")


@contextmanager
def _benchmark_package_imported_afresh():
    """Inside, no ``benchmarks`` module is imported (asv imports the package from its
    benchmark_dir); after, sys.modules and the import hooks hold what they held before."""

    def ours(name: str) -> bool:
        return name == "benchmarks" or name.startswith("benchmarks.")

    saved = {name: sys.modules.pop(name) for name in [k for k in sys.modules if ours(k)]}
    meta_path = list(sys.meta_path)
    try:
        yield
    finally:
        for name in [k for k in sys.modules if ours(k)]:
            del sys.modules[name]
        sys.modules.update(saved)
        sys.meta_path[:] = meta_path


def asv_classes(suite: str, monkeypatch, benchmark_dir: Path = ROOT / "benchmarks") -> dict:
    """Owner -> params of every benchmark asv discovers in ``benchmark_dir`` under the suite, by
    asv's own discovery (asv_runner.discovery.disc_benchmarks: every module of the package,
    recursively; in each, every public concrete class with a benchmark method and every benchmark
    function: time_, track_, mem_, peakmem_, timeraw_). The owner is ``module.Class`` for a method,
    ``module.function`` for a function; the modules are imported afresh with the suite set."""
    from asv_runner._aux import update_sys_path
    from asv_runner.discovery import disc_benchmarks

    monkeypatch.setenv("OPTBENCH_SUITE", suite)
    found = {}
    with _benchmark_package_imported_afresh():
        update_sys_path(str(benchmark_dir))  # as asv's list_benchmarks does
        for bench in disc_benchmarks(str(benchmark_dir)):
            owner = bench.name.rsplit(".", 1)[0] if inspect.ismethod(bench.func) else bench.name
            found[owner] = [list(p) for p in bench._params]
    return found


def disagreements(classes: dict[str, list[list[str]]]) -> list[str]:
    """Where asv's classes and the catalog differ: a name on one side only, or params other than
    the catalog's grid over every suite."""
    names = set(classes) ^ set(catalog.BENCHMARKS)
    return sorted(names) + [
        name
        for name, params in classes.items()
        if name in catalog.BENCHMARKS and params != catalog.benchmark(name).asv_params()
    ]


@pytest.mark.parametrize("suite", catalog.SUITE_NAMES)
def test_asv_classes_are_the_catalog_whatever_the_suite(suite, monkeypatch):
    """asv lists the same classes with the same params in every suite, so its list of benchmarks
    (results/asv/benchmarks.json) does not change with the suite a run measured."""
    assert disagreements(asv_classes(suite, monkeypatch)) == []


def test_a_class_the_catalog_lacks_is_caught(monkeypatch):
    """Mutation: an asv class without a catalog entry, or with a grid of its own, is a
    disagreement."""
    classes = asv_classes("quick", monkeypatch)
    assert disagreements({**classes, "bench_kernels.Extra": [["1x1"], ["eager"]]}) == [
        "bench_kernels.Extra"
    ]
    own = {**classes, "bench_kernels.SwiGLU": [["8192x2048"], ["eager", "triton"]]}
    assert disagreements(own) == ["bench_kernels.SwiGLU"]


EXTRA_MODULE = """
class Extra:
    params = [["a", "b"]]

    def track_x(self, p):
        return 1.0


def time_function():
    pass
"""


@pytest.mark.parametrize("where", ["bench_extra.py", "extra/bench_more.py"])
def test_a_benchmark_module_the_catalog_lacks_is_caught(where, tmp_path, monkeypatch):
    """Mutation: a new module in benchmarks/ (or in a package below it), whose class and function
    asv discovers though the catalog lists neither."""
    suite = tmp_path / "benchmarks"
    shutil.copytree(ROOT / "benchmarks", suite, ignore=shutil.ignore_patterns("__pycache__"))
    (suite / where).parent.mkdir(exist_ok=True)
    (suite / where).parent.joinpath("__init__.py").touch()
    (suite / where).write_text(EXTRA_MODULE)
    module = where.removesuffix(".py").replace("/", ".")
    found = asv_classes("quick", monkeypatch, suite)
    assert disagreements(found) == [f"{module}.Extra", f"{module}.time_function"]


def test_every_name_in_the_code_is_in_the_catalog():
    """Every benchmark named in the harness, the suites' glue and the report is one of the
    catalog's."""
    named = {}
    for path in [*(ROOT / "optbench").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]:
        for name in BENCHMARK_NAME.findall(path.read_text()):
            named.setdefault(name, path.relative_to(ROOT))
    assert named and {n: p for n, p in named.items() if n not in catalog.BENCHMARKS} == {}


METHODS = ("track_step_ms", "time_fwdbwd")


def _asv_selection(pattern: str) -> dict[str, set[tuple[str, ...]]]:
    """What asv's own ``--bench`` matching (``asv.benchmarks.Benchmarks``) selects under
    ``pattern`` from every catalog benchmark, two methods each (and a benchmark named by each
    name plus 'X', which must never match): the combinations of its asv grid asv would start a
    process for, by benchmark; each method selecting the same ones."""
    from types import SimpleNamespace

    from asv.benchmarks import Benchmarks

    grids = {n: list(itertools.product(*e.asv_params())) for n, e in catalog.BENCHMARKS.items()}
    listed = [
        {"name": f"{name}{suffix}.{method}", "params": [[repr(v) for v in axis] for axis in axes]}
        for name, entry in catalog.BENCHMARKS.items()
        for axes in [entry.asv_params()]
        for suffix in ("", "X")
        for method in METHODS
    ]
    found = Benchmarks(SimpleNamespace(benchmark_dir="benchmarks"), listed, regex=[pattern])
    chosen: dict[str, set[tuple[str, ...]]] = {}
    for full in found:
        name, method = full.rsplit(".", 1)
        combos = {grids[name][i] for i in found.benchmark_selection[full]}
        assert chosen.setdefault(name, combos) == combos, (full, "methods differ")
    assert set(found) == {f"{name}.{m}" for name in chosen for m in METHODS}
    return chosen


def test_suites_pick_their_benchmarks_and_combinations():
    """asv's own matching under a suite's regex selects each combination the suite measures, and
    no other: not another suite's, not a benchmark named by a prefix of another."""
    for suite, names in catalog.SUITES.items():
        ours = {
            name: {tuple(c.values()) for c in catalog.BENCHMARKS[name].cases(suite)}
            for name in names
        }
        assert _asv_selection(catalog.asv_pattern(suite)) == ours, suite
    assert _asv_selection(catalog.asv_pattern("cpu", "nosuchcase")) == {}


@pytest.mark.parametrize("select", [None, r"variant=eager$", r"impl=triton$", r"Step1B"])
def test_asv_runs_what_skip_params_keep(select, monkeypatch):
    """The combinations ``optbench run``'s regex selects are those the grid classes' skip_params
    (``optbench.suite.grids.unmeasured``, what plain ``asv run`` skips by) keep, under the same
    suite and selection."""
    from optbench.suite.grids import unmeasured

    for suite in ("full", "cpu", "sweep"):
        monkeypatch.setenv("OPTBENCH_SUITE", suite)
        if select:
            monkeypatch.setenv("OPTBENCH_SELECT", select)
        kept = {
            name: combos
            for name, entry in catalog.BENCHMARKS.items()
            if (combos := set(itertools.product(*entry.asv_params())) - set(unmeasured(name)))
        }
        assert _asv_selection(catalog.asv_pattern(suite, select)) == kept, (suite, select)


def test_suites_name_their_benchmarks():
    """The CPU suite has the tiny step, quick no kernel grids, and quick's steps are its grid's."""
    assert (
        "bench_step.StepTiny" in catalog.SUITES["cpu"]
        and "bench_kernels.RMSNorm" not in catalog.SUITES["quick"]
    )
    quick_steps = catalog.benchmark("bench_step.Step100M").params["quick"][0]
    assert quick_steps == catalog.STEP_GRIDS["quick"]


def test_quick_is_in_full_and_full_in_the_sweep():
    """Each per-commit suite is a part of the next: what quick measures, full does, and the sweep
    holds every case of both, so a sweep run with --skip-existing after them adds only what they
    leave out."""
    cases = {s: set(map(str, catalog.suite_cases(s))) for s in ("quick", "full", "sweep")}
    assert cases["quick"] < cases["full"] < cases["sweep"]
    assert set(catalog.SUITE_DOCS) == set(catalog.SUITE_NAMES)
    for name in ("bench_step.Step500M", "bench_anchors.HFCompileStep"):  # the sweep's alone
        assert name in catalog.SUITES["sweep"] and name not in catalog.SUITES["full"]


def test_cli_and_pytest_twin_read_the_catalog(monkeypatch):
    from optbench import cli

    assert cli.SUITES is catalog.SUITES
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setenv("OPTBENCH_SUITE", "quick")
    monkeypatch.delitem(sys.modules, "benchmarks.test_pytest_kernels", raising=False)
    twin = importlib.import_module("benchmarks.test_pytest_kernels")
    assert len(twin.CASES) == sum(
        len(b.cases("quick")) for b in catalog.BENCHMARKS.values() if b.kind == "kernel"
    )


def test_every_kernel_op_has_its_implementations():
    from optbench.suite.ops import OPS

    assert set(OPS) == set(catalog.KERNELS)
    for op in catalog.KERNELS.values():
        assert catalog.benchmark(op.benchmark).op == op.name
        assert op.shape_1b in op.shapes and op.impls


def test_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None; import optbench.suite.catalog as c; "
        "print(len(c.BENCHMARKS))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and int(out.stdout) == len(catalog.BENCHMARKS), out.stderr


def _import_as_asv_does(root: Path, package: str) -> subprocess.CompletedProcess:
    """Import ``package`` (under ``root``) and every module in it, recursively, as asv's discovery
    and forkserver do (asv_runner.discovery.disc_modules: pkgutil over the package path), with torch
    made unimportable."""
    code = (
        "import importlib, pkgutil, sys; sys.modules['torch'] = None\n"
        "def walk(name):\n"
        "    module = importlib.import_module(name)\n"
        "    for _, sub, _ in pkgutil.iter_modules(getattr(module, '__path__', []), name + '.'):\n"
        "        walk(sub)\n"
        f"walk({package!r})"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)


def test_asv_lists_the_benchmarks_without_importing_torch():
    """asv imports every module of benchmarks/ twice per run (its discovery and its forkserver), the
    pytest twin and conftest.py too, before any case runs: neither pays for torch (2-4 s each on a
    GPU runner)."""
    out = _import_as_asv_does(ROOT, "benchmarks")
    assert out.returncode == 0, out.stderr


def test_a_benchmark_module_importing_torch_is_caught(tmp_path):
    """Mutation: a module beside the suites (as the pytest twin once was) that imports torch at its
    top."""
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "__init__.py").write_text("")
    (tmp_path / "suite" / "bench_ok.py").write_text("import json\n")
    (tmp_path / "suite" / "test_twin.py").write_text("import torch\n")
    out = _import_as_asv_does(tmp_path, "suite")
    assert out.returncode != 0 and "torch" in out.stderr


def test_the_committed_asv_list_is_what_asv_discovers(tmp_path):
    """results/asv/benchmarks.json, which asv rewrites on every run and ``asv publish`` reads, is
    what asv discovers from this code: a run leaves git clean, whatever its suite and machine."""
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    conf.update(
        repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir=str(tmp_path / "asv")
    )
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTBENCH_", "ASV"))}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    for args in (
        ["machine", "--yes", "--machine", "discovery"],
        ["run", "--config", str(tmp_path / "asv.conf.json"), "--python=same"]
        + ["--machine", "discovery", "--bench", "just-discover"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "asv", *args], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads((tmp_path / "asv" / "benchmarks.json").read_text())
    committed = json.loads((ROOT / "results" / "asv" / "benchmarks.json").read_text())
    assert found == committed, (
        "results/asv/benchmarks.json is stale: commit the one `asv run --python=same --bench "
        "just-discover` writes (docs/architecture.md)"
    )


@pytest.mark.parametrize(
    "name, params, expected",
    [
        ("bench_step.Step100M", {"variant": "triton-norm"}, [{"variant": "eager"}]),
        ("bench_step.Step100M", {"variant": "cuda-graph"}, [{"variant": "graph-prereqs"}]),
        ("bench_precision.Step100M", {"variant": "tf32"}, [{"variant": "fp32"}]),
        ("bench_step.Step100M", {"variant": "eager"}, []),
        ("bench_step.Ablation1B", {"variant": "eager"}, [{"variant": ABLATED}]),
        ("bench_step.Ablation1B", {"variant": ABLATED}, []),
        (
            "bench_kernels.GradStats",
            {"shape": "1B", "impl": "foreach"},
            [{"shape": "1B", "impl": "loop"}],
        ),
        (
            "bench_distributed.DistributedStep1B",
            {"variant": "ddp", "world_size": "4"},
            [{"variant": "ddp", "world_size": "1"}],
        ),
        ("bench_anchors.HFCompileStep", {"size": "1B"}, []),
        ("bench_nothing.Here", {"variant": "eager"}, []),
    ],
)
def test_each_case_names_the_cases_a_report_sets_it_beside(name, params, expected):
    assert catalog.references(name, params) == expected


def test_with_references_adds_the_references_that_are_among_the_planned_in_their_order():
    variants = ("eager", "graph-prereqs", "cuda-graph", "triton-norm")
    key = {v: record_key("bench_step.Step100M", {"variant": v}) for v in variants}
    planned = [key["eager"], key["graph-prereqs"], key["cuda-graph"], key["triton-norm"]]
    # cuda-graph's reference is graph-prereqs, whose reference is eager
    assert catalog.with_references([key["cuda-graph"]], planned) == planned[:3]
    assert catalog.with_references([key["triton-norm"], key["cuda-graph"]], planned) == planned
    # a reference the run does not plan (not selected) is not added
    assert catalog.with_references([key["triton-norm"]], planned[1:]) == [key["triton-norm"]]
    assert catalog.with_references([key["cuda-graph"]], planned[1:]) == planned[1:3]
