"""The step baseline of each machine: the options every variant of a size builds on (precision,
batch), why they depart from ``models.step.BASELINE``, and a variant's (reference, candidate)
options on top of them."""

from __future__ import annotations

from models.config import CONFIGS
from models.step import BASELINE, StepOptions, variant_options
from optbench.measure.hardware import HardwareProfile
from optbench.suite.memory_estimate import over_usable, step_memory_bytes, usable_bytes


def base_options(profile: HardwareProfile, size: str) -> StepOptions:
    """The step baseline on ``profile``: bf16 autocast where supported, else fp16 autocast +
    GradScaler (fp32 on a CPU, where autocast measures nothing users run); 'tiny' at B=2, S=128; the
    batch halved from 8 while the memory estimate does not fit (down to 1; see
    ``baseline_notes``)."""
    if not profile.compute_capability:
        base = BASELINE.replace(precision="fp32")
    else:
        base = BASELINE if profile.supports_bf16 else BASELINE.replace(precision="fp16")
    if size == "tiny":
        base = base.replace(batch_size=2, seq_len=128)
    usable = usable_bytes(profile)
    while (
        usable is not None
        and base.batch_size > 1
        and step_memory_bytes(CONFIGS[size], base) > usable
    ):
        base = base.replace(batch_size=base.batch_size // 2)
    return base


def baseline_notes(profile: HardwareProfile, size: str) -> list[str]:
    """Why ``base_options`` departs from models.step.BASELINE on ``profile`` (precision, batch
    size), or that even batch 1 does not fit (every case of the size then skips)."""
    base, usable, notes = base_options(profile, size), usable_bytes(profile), []
    if profile.compute_capability and base.precision == "fp16":
        notes.append(f"fp16 autocast + GradScaler baseline: {profile.name} has no bf16")
    if usable is None or size == "tiny":
        return notes
    need = step_memory_bytes(CONFIGS[size], base)
    if need > usable:
        notes.append(f"does not fit even at batch 1: {over_usable(need, usable, profile)}")
    elif base.batch_size < BASELINE.batch_size:
        larger = base.batch_size * 2
        need = step_memory_bytes(CONFIGS[size], base.replace(batch_size=larger))
        notes.append(
            f"batch {base.batch_size}: batch {larger} needs {over_usable(need, usable, profile)}"
        )
    return notes


def step_pair(profile: HardwareProfile, size: str, variant: str) -> tuple[StepOptions, StepOptions]:
    """(reference, candidate) options of ``variant`` on top of this machine's baseline."""
    return variant_options(variant, base_options(profile, size))
