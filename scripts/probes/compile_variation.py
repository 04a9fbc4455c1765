"""Does torch.compile's kernel differ from one fresh process to the next? One kernel case, compiled
and timed (cold-L2 device time, as the suite times it) in several fresh processes, each with an
empty inductor cache of its own, half of them running the eager implementation first. Prints one
JSON line per process: device ms per call of each metric and the launch configs inductor's autotuner
picked (its ``*.best_config`` files).

    python3 scripts/probes/compile_variation.py --op qkv_rope --shape 8192x32+4x64 --trials 6
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def trial(op: str, shape: str, eager_first: bool) -> dict:
    """In this process: (the eager case,) then the compile case of ``op`` at ``shape``; device ms
    per metric."""
    from optbench.measure.timing import measure
    from optbench.suite.workloads import kernel_work

    if eager_first:
        eager = kernel_work(op, shape, "eager", "cuda")
        eager.check()
        for fns in eager.rotation.values():
            measure(fns, device="cuda")
    work = kernel_work(op, shape, "compile", "cuda")
    work.check()
    return {m: measure(fns, device="cuda").device.median_ms for m, fns in work.rotation.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--op", default="qkv_rope")
    p.add_argument("--shape", default="8192x32+4x64")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--one", choices=["eager-first", "compile-only"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(trial(args.op, args.shape, args.one == "eager-first")))
        return 0
    for i in range(args.trials):
        mode = "eager-first" if i % 2 else "compile-only"
        with tempfile.TemporaryDirectory() as cache:
            env = dict(
                os.environ,
                TORCHINDUCTOR_CACHE_DIR=cache,
                TRITON_CACHE_DIR=f"{cache}/triton",
                PYTHONPATH=str(ROOT),
            )
            out = subprocess.run(
                [sys.executable, __file__, "--op", args.op, "--shape", args.shape, "--one", mode],
                env=env,
                capture_output=True,
                text=True,
            )
            configs = sorted({f.read_text() for f in Path(cache).rglob("*.best_config")})
        lines = out.stdout.strip().splitlines()
        result = (
            json.loads(lines[-1]) if out.returncode == 0 and lines else {"error": out.stderr[-500:]}
        )
        print(
            json.dumps({"trial": i, "mode": mode, "ms": result, "best_configs": configs}),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
