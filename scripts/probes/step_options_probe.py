"""Probe (CUDA): time training steps of given StepOptions overrides (B8 S1024 bf16) with optbench's
timer.

Each NAME:KEY=VALUE,... spec builds ``models.step.build_step(CONFIGS[size],
BASELINE.replace(KEY=VALUE, ...))``, runs 3 steps (compile), then times it by
optbench.measure.timing.measure without a CUDA graph, for PROBE_REP_MS milliseconds (default 100,
the suite's); one JSON line each (build time, wall and device medians, samples).

Run from the repository root: ``python3 -m scripts.probes.step_options_probe 1B
master:optimizer=master,norm=triton``. Output of its 2026-11-24 runs (H100):
results/h100-sxm/steady-probe-2026-11-24/ (``call*.jsonl``).
"""

import json
import os
import sys
import time

import torch

from models.config import CONFIGS
from models.step import BASELINE, build_step
from optbench.measure.timing import measure


def parse_spec(spec: str) -> tuple[str, dict]:
    """``NAME:KEY=VALUE,...`` -> (NAME, {KEY: VALUE}); 'true' and 'false' become booleans."""
    name, _, kv = spec.partition(":")
    over = {}
    for item in kv.split(","):
        k, v = item.split("=")
        over[k] = {"true": True, "false": False}.get(v, v)
    return name, over


def main(size: str, specs: list[str]) -> None:
    for spec in specs:
        name, over = parse_spec(spec)
        t0 = time.time()
        step = build_step(CONFIGS[size], BASELINE.replace(**over), "cuda", 0)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        build_s = time.time() - t0
        rep_ms = float(os.environ.get("PROBE_REP_MS", "100"))  # 100: the suite's default
        m = measure(step, device="cuda", graph=False, rep_ms=rep_ms, max_reps=1000).to_dict()
        w, d = m["wall"], m["device"]
        print(
            json.dumps(
                {
                    "size": size,
                    "name": name,
                    "options": over,
                    "build_compile_s": round(build_s, 1),
                    "wall_ms": w["median_ms"],
                    "wall_iqr": w.get("iqr_ms"),
                    "device_ms": d and d["median_ms"],
                    "n": len(w.get("samples_ms", [])),
                    "samples": w.get("samples_ms"),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                }
            ),
            flush=True,
        )
        del step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
