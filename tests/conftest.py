"""The suite's setup: Triton kernels run in Triton's interpreter where no CUDA device is.

On a busy CPU. CI runs the suite on 2 shared cores, where other processes may hold most of the CPU
for minutes; a test passes there as it does alone. It asserts no duration of its own work (a bound
on time only tells apart outcomes orders of magnitude apart, such as a blocked 30 s wait cut to a
few seconds); a budget, grace or timeout it needs guards against a hang and is sized from its work
with room for several times what that takes on a loaded machine; long runs of small tensor ops (the
CPU training of test_convergence.py) run torch on one thread, since the threads of one op wait on
each other where other processes hold the cores. A margin is checked beside two busy processes
(``python -c "while True: pass"``, twice) before it is relied on.

Deterministic. Every random input is seeded: the ``rng_guard`` plugin fails a test that draws from a
global random generator it did not seed.
"""

import os

import pytest
import torch

pytest_plugins = ("pytester", "rng_guard")

# run Triton kernels on the CPU; must be set before triton is imported
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def seeded() -> None:
    """torch's global generator seeded with 0, for a module whose tests draw their inputs from it
    (``pytestmark = pytest.mark.usefixtures("seeded")``)."""
    torch.manual_seed(0)
