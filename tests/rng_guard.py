"""A pytest plugin: a test fails when it draws from a global random generator it did not seed.

Before a test's setup, torch's default generators (the CPU one, and each CUDA one once CUDA is
initialized) and Python's ``random`` are seeded with a number of the guard's own, taken from the
test's id: what a test draws from them depends on no earlier test. After the test's call, a
generator that moved although nothing seeded it since fails the test, which then draws from a
``torch.Generator`` / ``random.Random`` of its own or seeds the global one first. Seeding counts
wherever it happens, in the test, a fixture or the code it calls (``models.step.build_step`` seeds
its model's init): a torch generator whose ``initial_seed()`` is no longer the guard's was seeded
(``torch.manual_seed`` seeds all of them, ``torch.cuda.manual_seed`` one), Python's was when
``random.seed`` was called. A draw inside ``torch.random.fork_rng`` leaves the generators as it
found them, so the guard sees none there.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Generator
from dataclasses import dataclass

import pytest

# rich.style draws from Python's random when first imported (a seed for its link ids): imported
# here, the test that first imports it is not taken for one that draws
import rich.style  # noqa: F401
import torch


@dataclass
class _Start:
    """A test's guard seed, Python's state after it and the count of ``random.seed`` calls then."""

    seed: int
    python_state: tuple
    python_seeds: int


_START = pytest.StashKey[_Start]()
_python_seeds = [0]  # random.seed calls in this process, counted from pytest_configure on


def _counted(real_seed):
    def seed(*args, **kwargs) -> None:
        _python_seeds[0] += 1
        real_seed(*args, **kwargs)

    return seed


def _torch_generators() -> list[torch.Generator]:
    """torch's default generators: the CPU one, and CUDA's where CUDA is initialized (reading them
    would initialize it)."""
    cuda = list(torch.cuda.default_generators) if torch.cuda.is_initialized() else []
    return [torch.default_generator, *cuda]


def _drew_unseeded(gen: torch.Generator, seed: int) -> bool:
    """Whether ``gen`` moved since it was seeded with ``seed``, with no seeding since."""
    fresh = torch.Generator(gen.device).manual_seed(seed)
    return gen.initial_seed() == seed and not torch.equal(gen.get_state(), fresh.get_state())


def _unseeded_draws(start: _Start) -> list[str]:
    """The global generators drawn from since ``start`` with no seeding, by name."""
    names = [
        f"torch's default {gen.device} generator"
        for gen in _torch_generators()
        if _drew_unseeded(gen, start.seed)
    ]
    if _python_seeds[0] == start.python_seeds and random.getstate() != start.python_state:
        names.append("Python's global random")
    return names


def pytest_configure(config: pytest.Config) -> None:
    real_seed = random.seed
    random.seed = _counted(real_seed)
    config.add_cleanup(lambda: setattr(random, "seed", real_seed))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Seed the global generators before any fixture of the test is set up."""
    seed = zlib.crc32(f"rng_guard {item.nodeid}".encode())
    torch.manual_seed(seed)
    random.seed(seed)
    item.stash[_START] = _Start(seed, random.getstate(), _python_seeds[0])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Fail a test that passed but drew from a global generator it did not seed."""
    result = yield
    drawn = _unseeded_draws(item.stash[_START])
    if drawn:
        pytest.fail(
            f"drew from {' and '.join(drawn)} with no seed set: seed it in the test "
            "(torch.manual_seed, random.seed) or draw from a torch.Generator / random.Random "
            "of the test's own",
            pytrace=False,
        )
    return result
