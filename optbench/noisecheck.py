"""``optbench noisecheck``: does the regression gate stay quiet on noise and catch a real slowdown?

Measures the selected benchmark cases three times on this machine, into a scratch store under the
labels ``run-a``, ``run-b`` and ``run-planted`` (the last with ``OPTBENCH_PLANT_SLOWDOWN``, which makes one
kernel 10% slower on the device), then compares a with b (an A/A run: nothing may be flagged) and a with
planted (only the planted kernel's records may be flagged). Exits 1 when either expectation fails.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from optbench.compare import compare
from optbench.runner import current_commit, current_machine, run_grid
from optbench.store import ResultStore, record_key
from optbench.workloads import PLANT_ENV


def measure_into(store: ResultStore, label: str, select: str) -> None:
    """Runs every selected case of the kernel suite and files the records under ``label``."""
    module = importlib.import_module("benchmarks.bench_kernels")
    for cls in (getattr(module, n) for n in ("RMSNorm", "SwiGLU", "QKNorm", "LinearCrossEntropy", "GradStats")):
        name = cls.benchmark_name()
        cases = [c for c in cls().cases() if re.search(select, record_key(name, c.params))]
        if cases:
            run_grid(name, cases, store=store)
    machine, commit = current_machine(), current_commit()
    src = store.path(machine, commit)
    shutil.move(src, store.path(machine, label))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="optbench noisecheck", description=__doc__.splitlines()[0])
    p.add_argument("--select", default=r"bench_kernels\.(RMSNorm|SwiGLU)\|shape=16384x2048|8192x5632",
                   help="regex on record keys of bench_kernels")
    p.add_argument("--plant", default="rmsnorm/triton=0.10", help="op/impl=fraction slowed down in the third run")
    p.add_argument("--keep", help="directory to keep the scratch store in")
    args = p.parse_args(argv)
    root = Path(args.keep or tempfile.mkdtemp(prefix="optbench-noise-"))
    store = ResultStore(root)
    measure_into(store, "run-a", args.select)
    measure_into(store, "run-b", args.select)
    os.environ[PLANT_ENV] = args.plant
    try:
        measure_into(store, "run-planted", args.select)
    finally:
        os.environ.pop(PLANT_ENV)
    op, impl = args.plant.split("=")[0].split("/")
    aa = [c for c in compare(store, "run-a", "run-b") if c.significant]
    planted = [c for c in compare(store, "run-a", "run-planted") if c.significant]
    planted_key = re.compile(rf"\|impl={re.escape(impl)}$")
    expected = [c for c in planted if planted_key.search(c.key) and op in c.key.lower() and c.regression]
    stray = [c for c in planted if c not in expected]
    print(f"A/A: {len(aa)} significant changes (expected 0): {[(c.key, c.metric, round(c.ratio or 0, 3)) for c in aa]}")
    print(f"planted {args.plant}: flagged {[(c.key, c.metric, round(c.ratio or 0, 3)) for c in expected]}; "
          f"elsewhere {[(c.key, c.metric, round(c.ratio or 0, 3)) for c in stray]}")
    print(f"scratch store: {root}")
    return 0 if not aa and expected and not stray else 1
