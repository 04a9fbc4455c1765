"""``optbench noisecheck``: does the regression gate stay quiet on noise and catch a real slowdown?

Measures the selected benchmark cases three times on this machine, into a scratch store under the
labels ``run-a``, ``run-b`` and ``run-planted`` (the last with ``OPTBENCH_PLANT_SLOWDOWN``, which makes one
kernel 10% slower on the device), then compares a with b (an A/A run: the gate may flag no regression) and
a with planted (the gate must flag the planted kernel's records and nothing else). Exits 1 when either
expectation fails. Changes that the rank test finds significant but that stay within the threshold are
listed too: they show how small a difference the test resolves.
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
    p.add_argument("--threshold", type=float, default=0.05, help="the gate's threshold (as optbench compare)")
    p.add_argument("--keep", help="directory to keep the scratch store in")
    p.add_argument("--from", dest="from_", help="re-judge a kept scratch store instead of measuring")
    args = p.parse_args(argv)
    root = Path(args.from_ or args.keep or tempfile.mkdtemp(prefix="optbench-noise-"))
    store = ResultStore(root)
    if not args.from_:
        measure_into(store, "run-a", args.select)
        measure_into(store, "run-b", args.select)
        os.environ[PLANT_ENV] = args.plant
        try:
            measure_into(store, "run-planted", args.select)
        finally:
            os.environ.pop(PLANT_ENV)
    op, impl = args.plant.split("=")[0].split("/")
    planted_key = re.compile(rf"{re.escape(op)}\|.*\|impl={re.escape(impl)}$", re.IGNORECASE)
    fine = lambda cs: [(c.key, c.metric, c.quantity, round(c.ratio or 0, 4)) for c in cs]  # noqa: E731
    ok = True
    for label, head in (("A/A", "run-b"), ("planted " + args.plant, "run-planted")):
        changes = compare(store, "run-a", head, threshold=args.threshold)
        flagged = [c for c in changes if c.regression]
        wanted = [] if head == "run-b" else [c for c in flagged if planted_key.search(c.key)]
        stray = [c for c in flagged if c not in wanted]
        ok &= not stray and (head == "run-b" or bool(wanted))
        print(f"{label}: gate flags {fine(wanted)} as expected, {fine(stray)} unexpectedly; "
              f"within the threshold but significant: {fine(c for c in changes if c.significant and not c.regression)}")
    print(f"scratch store: {root}")
    return 0 if ok else 1
