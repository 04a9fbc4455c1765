"""Probe (CUDA): the check of an FP8 step variant with option overrides, per parameter.

Builds the variant's baseline once (its high-precision reference and eager step, as the suite
does), then each candidate: the variant itself and the variant with each ``KEY=VALUE,...``
override; prints, per candidate, its errors against the reference, the tolerance, and the five
parameters of the largest gradient errors. Run from the repository root:

    python3 -m scripts.probes.fp8_check_probe 1B best-kernels-fp8-rowwise fused_proj=false
"""

from __future__ import annotations

import sys

import torch

from models.config import CONFIGS
from models.step import (
    FP8_CHECK_TOLERANCE,
    _errors,
    _record,
    _tolerance,
    baseline_of,
    build_step,
    rel_err,
)
from optbench.suite.workloads import machine_profile, step_options


def main(size: str, variant: str, specs: list[str]) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    profile = machine_profile(device)
    reference, options = step_options(size, variant, device)
    config = CONFIGS[size]
    build = lambda opts: build_step(config, opts, device, 0, profile=profile)  # noqa: E731
    baseline = baseline_of(build, reference, options.precision, host=True)
    for spec in ["", *specs]:
        over = {}
        for item in filter(None, spec.split(",")):
            key, value = item.split("=")
            over[key] = {"true": True, "false": False}.get(value, value)
        got = _record(build(options.replace(**over)))
        errors, _ = _errors(baseline.reference, got)
        tolerance = _tolerance(baseline.eager, baseline.precision, baseline.tokens)
        tolerance = {q: max(t, FP8_CHECK_TOLERANCE) for q, t in tolerance.items()}
        ok = all(errors[q] <= t for q, t in tolerance.items())
        print(f"== {variant} {spec or '(as in the catalog)'}: ok {ok}", flush=True)
        print(f"   errors {errors}\n   eager {baseline.eager}", flush=True)
        per = {
            name: rel_err(got.grads[name].float().cpu(), ref)
            for name, ref in baseline.reference.grads.items()
        }
        for name in sorted(per, key=per.__getitem__, reverse=True)[:5]:
            print(f"   grads {name}: {per[name]:.3g}", flush=True)
        del got


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
