"""rng_guard: a test that draws from a global random generator it did not seed fails; one that
seeded it, in any code it runs, or drew from a generator of its own passes."""

from __future__ import annotations

import pytest
from kernel_numerics import requires_cuda

UNSEEDED = "drew from torch's default cpu generator with no seed set"


@pytest.fixture(autouse=True)
def _guard_alone(monkeypatch):
    """The inner runs load rng_guard and no installed plugin (loading those took 2.5 s a run)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def failures(pytester: pytest.Pytester, source: str, passed: int) -> dict[str, str]:
    """Run ``source``'s tests under the guard: check that ``passed`` of them pass, and return the
    message of each failure by test name."""
    pytester.makepyfile(source)
    run = pytester.inline_run("-p", "rng_guard", "-p", "no:cacheprovider")
    failed = run.getfailures()
    run.assertoutcome(passed=passed, failed=len(failed))
    return {report.nodeid.split("::")[-1]: str(report.longrepr) for report in failed}


def test_a_draw_from_torchs_generator_needs_a_seed(pytester):
    failed = failures(
        pytester,
        """
        import torch

        def seed_for_the_model():
            torch.manual_seed(3)

        def test_unseeded():
            torch.randn(3)

        def test_seeded():
            torch.manual_seed(0)
            torch.randn(3)

        def test_seeded_by_the_code_it_calls():
            seed_for_the_model()
            torch.randn(3)

        def test_a_generator_of_its_own():
            torch.randn(3, generator=torch.Generator().manual_seed(0))

        def test_draws_nothing():
            torch.zeros(3)
        """,
        passed=4,
    )
    assert list(failed) == ["test_unseeded"] and UNSEEDED in failed["test_unseeded"]


def test_a_seed_lasts_one_test(pytester):
    """The generators are seeded anew before each test: an earlier test's seed does not count."""
    failed = failures(
        pytester,
        """
        import torch

        def test_seeds_and_draws():
            torch.manual_seed(0)
            torch.randn(3)

        def test_draws_after_it():
            torch.randn(3)
        """,
        passed=1,
    )
    assert list(failed) == ["test_draws_after_it"] and UNSEEDED in failed["test_draws_after_it"]


def test_a_fixture_draws_for_its_test(pytester):
    """A module fixture's draw fails the test that sets it up; a test's own failure stays its
    own."""
    failed = failures(
        pytester,
        """
        import pytest
        import torch

        @pytest.fixture(scope="module")
        def weights():
            return torch.randn(3)

        def test_first(weights):
            pass

        def test_fails_on_its_own():
            torch.randn(3)
            assert False, "its own failure"
        """,
        passed=0,
    )
    assert UNSEEDED in failed["test_first"]
    assert "its own failure" in failed["test_fails_on_its_own"]
    assert UNSEEDED not in failed["test_fails_on_its_own"]


def test_pythons_random_needs_a_seed(pytester):
    failed = failures(
        pytester,
        """
        import random

        def test_unseeded():
            random.random()

        def test_seeded():
            random.seed(0)
            random.random()

        def test_an_instance_of_its_own():
            random.Random(0).random()
        """,
        passed=2,
    )
    assert list(failed) == ["test_unseeded"]
    assert "drew from Python's global random with no seed set" in failed["test_unseeded"]


@pytest.mark.gpu
@requires_cuda
def test_a_draw_on_cuda_needs_a_seed(pytester):
    failed = failures(
        pytester,
        """
        import torch

        def test_unseeded():
            torch.randn(3, device="cuda")

        def test_seeded_on_cuda_alone():
            torch.cuda.manual_seed(0)
            torch.randn(3, device="cuda")
        """,
        passed=1,
    )
    assert list(failed) == ["test_unseeded"]
    assert "drew from torch's default cuda:0 generator" in failed["test_unseeded"]
