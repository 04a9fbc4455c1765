"""Probe: the check of an FP8 step variant with option overrides, per parameter.

Builds the variant's baseline once (its high-precision reference and eager step, as the suite
does), then each candidate: the variant itself and the variant with each ``KEY=VALUE,...``
override (``true``, ``false`` and ``none`` read as such); prints, per candidate, its errors
against the reference, the tolerance, and the five parameters of the largest gradient errors. Run
from the repository root, on a GPU:

    python3 -m scripts.probes.fp8_check_probe 1B best-kernels-fp8-rowwise cuda_graph=false

(``TORCHINDUCTOR_EMULATE_PRECISION_CASTS=1`` in the environment: inductor rounds where eager does;
``--backend aot_eager``: the compiled steps' graphs with eager kernels), or on a CPU, through
torchao's emulation (FP8 rounding, matmuls in high precision; what tests/test_fp8.py runs), at a
model shape of the size's config changed by ``--config`` and a batch of ``--tokens B,S``; the
steps a CPU cannot run (CUDA graphs) need their overrides:

    python3 -m scripts.probes.fp8_check_probe 1B fp8-rowwise fused_proj=true --cpu \\
        --config d_model=768,n_layers=12,n_heads=12,vocab_size=4096 --tokens 2,128
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

import models.step
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


def _values(spec: str) -> dict[str, object]:
    """``KEY=VALUE,...`` as a dict: true, false, none and integers read as such."""
    out: dict[str, object] = {}
    for item in filter(None, spec.split(",")):
        key, value = item.split("=")
        words = {"true": True, "false": False, "none": None}
        out[key] = words[value] if value in words else int(value) if value.isdigit() else value
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("size")
    p.add_argument("variant")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE,... per candidate")
    p.add_argument("--cpu", action="store_true", help="torchao's emulation on the CPU")
    p.add_argument("--config", default="", help="KEY=VALUE,... changes to the size's config")
    p.add_argument("--tokens", default="", help="B,S: the batch of reference and candidates")
    p.add_argument(
        "--backend",
        help="torch.compile's backend for the steps, its mode dropped (aot_eager: the same graph "
        "capture and autograd, eager kernels); default: inductor with the variant's mode",
    )
    args = p.parse_intermixed_args(argv)
    if args.backend:
        compile_ = torch.compile
        torch.compile = lambda fn, mode=None, **kw: compile_(fn, backend=args.backend, **kw)
    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    if device == "cpu":  # validate keeps FP8 off CPUs; the emulation is what the tests run
        models.step.validate = lambda *_, **__: None
    profile = machine_profile(device)
    reference, options = step_options(args.size, args.variant, device)
    if args.tokens:
        batch, seq = (int(x) for x in args.tokens.split(","))
        reference = reference.replace(batch_size=batch, seq_len=seq)
        options = options.replace(batch_size=batch, seq_len=seq)
    config = dataclasses.replace(CONFIGS[args.size], **_values(args.config))
    build = lambda opts: build_step(config, opts, device, 0, profile=profile)  # noqa: E731
    baseline = baseline_of(build, reference, options.precision, host=True)
    for spec in ["", *args.overrides]:
        got = _record(build(options.replace(**_values(spec))))
        errors, _ = _errors(baseline.reference, got)
        tolerance = _tolerance(baseline.eager, baseline.precision, baseline.tokens)
        tolerance = {q: max(t, FP8_CHECK_TOLERANCE) for q, t in tolerance.items()}
        ok = all(errors[q] <= t for q, t in tolerance.items())
        print(f"== {args.variant} {spec or '(as in the catalog)'}: ok {ok}", flush=True)
        print(f"   errors {errors}\n   eager {baseline.eager}", flush=True)
        per = {
            name: rel_err(got.grads[name].float().cpu(), ref)
            for name, ref in baseline.reference.grads.items()
        }
        for name in sorted(per, key=per.__getitem__, reverse=True)[:5]:
            print(f"   grads {name}: {per[name]:.3g}", flush=True)
        del got


if __name__ == "__main__":
    main()
