"""A new git repository holding this checkout's files, for the tests (and the probe) that run asv
as its users type it, in a clone: commits of the same code, commits with a planted slowdown, and
asv's environment there (a HOME of its own, whose ``~/.asv-machine.json`` names :data:`MACHINE`).

Imported by tests as ``asv_repo`` (pytest puts ``tests/`` on ``sys.path``) and by
``scripts/probes/asv_continuous_noise.py`` as ``tests.asv_repo``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from optbench.store.store import REPO_ROOT

GIT = ["git", "-c", "user.name=optbench", "-c", "user.email=optbench@example.invalid"]
MACHINE = "optbench-test"
# What asv rewrites on every run (its list of benchmarks): committed, as in the checkout.
ASV_LIST = "results/asv/benchmarks.json"
# ``asv continuous -f`` on a CPU that other machines share (docs/runners.md), and the slowdown the
# tests plant. Two processes of the same code read up to 1.74x apart on such a CPU (NOTES.md, asv on
# a shared CPU), so a verdict at a smaller factor would be the neighbours' load; the plant sits far
# above the factor so that no load hides it. How small a slowdown a CPU gate catches is measured
# (scripts/probes/asv_continuous_noise.py), not asserted here.
SHARED_CPU_FACTOR = "3"
PLANT = 10.0

# Appended to a module of the clone: ``name`` (a function, or ``Class.method``) then spends
# ``factor`` times the CPU time of its own call, spinning after it (CPU time, not sleep: the CPU
# suite times CPU time).
_PLANT = """

import time as _plant_time


def _planted(fn, factor):
    def slowed(*args, **kwargs):
        start = _plant_time.thread_time()
        out = fn(*args, **kwargs)
        until = start + factor * (_plant_time.thread_time() - start)
        while _plant_time.thread_time() < until:
            pass
        return out

    return slowed


{name} = _planted({name}, {factor})  # planted slowdown
"""


def git(repo: Path, *args: str) -> str:
    """git's output of ``args`` in ``repo`` (stripped); raises where git fails."""
    return subprocess.run(
        [*GIT, *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def copy_checkout(path: Path) -> Path:
    """This checkout's files (tracked and untracked, not ignored; of ``results/`` only
    :data:`ASV_LIST`) as the first commit, ``base``, of a new repository at ``path`` on branch
    ``main``."""
    files = git(REPO_ROOT, "ls-files", "-co", "--exclude-standard").splitlines()
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name in files:
        if name.startswith("results/") and name != ASV_LIST or not (REPO_ROOT / name).is_file():
            continue
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, path / name)
    return commit(path, "base")


def commit(repo: Path, message: str) -> Path:
    """Commits every change in ``repo``; returns ``repo``."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return repo


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD")


def same_code_commit(repo: Path, name: str) -> str:
    """A commit that adds a comment to ``models/step.py`` (nothing that runs changes); its hash."""
    step_py = repo / "models" / "step.py"
    step_py.write_text(step_py.read_text() + f"# {name}: a comment, no change in what runs\n")
    return head(commit(repo, name))


def planted_commit(repo: Path, module: str, name: str, factor: float) -> str:
    """A commit after which ``name`` (``Class.method`` or a function of ``module``, a path in the
    repository) spends ``factor`` times its CPU time per call; its hash."""
    path = repo / module
    path.write_text(path.read_text() + _PLANT.format(name=name, factor=factor))
    return head(commit(repo, f"plant: {name} {factor}x"))


def asv_env(home: Path, **variables: str) -> dict[str, str]:
    """This process's environment without optbench's and asv's variables and ``PYTHONPATH``, with
    ``HOME`` at ``home`` (created, :data:`MACHINE` registered in its asv machine file) and
    ``variables`` set."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPTBENCH_", "ASV", "PYTHONPATH"))
    }
    env.update(HOME=str(home), **variables)
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "asv", "machine", "--yes", "--machine", MACHINE],
        env=env,
        check=True,
        capture_output=True,
    )
    return env


def asv(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``asv ARGS`` in ``repo``, its output captured (at most 15 minutes)."""
    return subprocess.run(
        [sys.executable, "-m", "asv", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
