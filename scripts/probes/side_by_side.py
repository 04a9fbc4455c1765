"""Probe (CUDA): optbench's training step of one size and variants, measured as the suite measures
it, for a side-by-side with the HuggingFace anchor (hf_compile_step_steady.py) in the same device
call.

For each variant, ``optbench.run.runner.run_grid`` of ``bench_step.Step<size>|variant=<variant>``
(``optbench.suite.workloads.step_work``: built, checked against the eager step, timed by
``optbench.measure.timing.measure``) into a scratch store (/tmp/side); prints one JSON summary line
per record.

Run from the repository root: ``python3 -m scripts.probes.side_by_side 1B best-fused``. Output of
its runs (H100): results/h100-sxm/anchors/2026-11-23-100M-side-by-side/ (``100M
best-compile-graph``) and results/h100-sxm/anchors/2026-11-24-side-by-side/ (``1B best-fused``).
"""

import json
import sys
import time
from functools import partial

from optbench.run.runner import Case, run_grid
from optbench.store.store import ResultStore
from optbench.suite.workloads import step_work

SCRATCH_STORE = "/tmp/side"


def main(size: str, variants: list[str]) -> None:
    t0 = time.time()
    for variant in variants:
        case = Case({"variant": variant}, partial(step_work, size, variant, "cuda"))
        recs = run_grid(f"bench_step.Step{size}", [case], store=ResultStore(SCRATCH_STORE))
        for k, r in recs.items():
            m = (r.get("metrics") or {}).get("step", {})
            print(
                json.dumps(
                    {
                        "key": k,
                        "status": r["status"],
                        "check_seconds": r.get("check_seconds"),
                        "step_wall": (m.get("wall") or {}).get("median_ms"),
                        "step_wall_iqr": (m.get("wall") or {}).get("iqr_ms"),
                        "step_device": (m.get("device") or {}).get("median_ms"),
                        "seconds": round(time.time() - t0, 1),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
