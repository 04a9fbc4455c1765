"""kernels.numerics: the one error measure."""

from __future__ import annotations

import math

import torch

from kernels.numerics import rel_err


def _pairs(gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shapes = [(7,), (13, 5), (3, 1, 11), ()]
    pairs = []
    for shape in shapes:
        ref = torch.randn(shape, generator=gen, dtype=torch.float64)
        out = (ref + 1e-3 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(
            torch.bfloat16
        )
        pairs.append((out, ref.float()))
    return pairs


def test_rel_err_is_the_norm_ratio_in_float64():
    pairs = _pairs(torch.Generator().manual_seed(1))
    by_hand = [float((o.double() - r.double()).norm() / r.double().norm()) for o, r in pairs]
    assert all(
        math.isclose(rel_err(o, r), b, rel_tol=1e-12)
        for (o, r), b in zip(pairs, by_hand, strict=True)
    )
    assert all(e > 0 for e in by_hand)


def test_a_non_finite_element_is_an_infinite_error():
    out, ref = _pairs(torch.Generator().manual_seed(2))[1]
    assert math.isfinite(rel_err(out, ref))
    for bad in (math.nan, math.inf, -math.inf):
        poisoned = out.clone()
        poisoned[4, 2] = bad
        assert rel_err(poisoned, ref) == math.inf


def test_a_zero_reference_counts_as_tiny():
    assert rel_err(torch.zeros(3), torch.zeros(3)) == 0.0
    assert rel_err(torch.ones(3), torch.zeros(3)) > 1e29
