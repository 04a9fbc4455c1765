"""kernels.numerics: the one error measure, one pair at a time and many at once."""

from __future__ import annotations

import math

import torch

from kernels.numerics import rel_err, rel_errs


def _pairs(gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shapes = [(7,), (13, 5), (3, 1, 11), ()]
    pairs = []
    for shape in shapes:
        ref = torch.randn(shape, generator=gen, dtype=torch.float64)
        out = (ref + 1e-3 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(torch.bfloat16)
        pairs.append((out, ref.float()))
    return pairs


def test_rel_errs_is_rel_err_of_each_pair_in_float64():
    pairs = _pairs(torch.Generator().manual_seed(1))
    by_hand = [float((o.double() - r.double()).norm() / r.double().norm()) for o, r in pairs]
    assert rel_errs(pairs) == [rel_err(o, r) for o, r in pairs]
    assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(rel_errs(pairs), by_hand, strict=True))
    assert all(e > 0 for e in by_hand)


def test_a_non_finite_element_is_an_infinite_error_in_its_own_pair_only():
    pairs = _pairs(torch.Generator().manual_seed(2))
    for bad in (math.nan, math.inf, -math.inf):
        out = pairs[1][0].clone()
        out[4, 2] = bad
        errors = rel_errs([pairs[0], (out, pairs[1][1]), pairs[2]])
        assert errors[1] == math.inf and math.isfinite(errors[0]) and math.isfinite(errors[2])


def test_a_zero_reference_counts_as_tiny():
    assert rel_err(torch.zeros(3), torch.zeros(3)) == 0.0
    assert rel_err(torch.ones(3), torch.zeros(3)) > 1e29
    assert rel_errs([]) == []
