"""pytest-benchmark's saved runs carry optbench's machine record (GPU name, driver, CUDA, torch,
triton), which its own ``machine_info`` (CPU and Python only) lacks, and are named after the commit
whose code they measure (:func:`optbench.run.runner.measured_commit`), as optbench's own results
are: a run is marked dirty only where code differs from HEAD, not results, docs or notes
(:data:`optbench.run.runner.UNMEASURED_PATHS`)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = str(Path(__file__).resolve().parents[1])  # the work tree whose code the benchmarks measure


def pytest_benchmark_update_machine_info(config: Any, machine_info: dict[str, Any]) -> None:
    from optbench.measure.machine import machine_info as optbench_machine_info

    machine_info["optbench"] = optbench_machine_info()


def code_differs(repo: str = ROOT) -> bool:
    """Whether tracked files of the work tree at ``repo`` differ from HEAD outside
    UNMEASURED_PATHS."""
    from optbench.run.runner import UNMEASURED_PATHS

    excludes = [f":(exclude){path}" for path in UNMEASURED_PATHS]
    done = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--", ".", *excludes], cwd=repo, capture_output=True
    )
    if done.returncode not in (0, 1):
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.returncode == 1


def _git(repo: str, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


def measured_commit_info(repo: str = ROOT, project_name: str | None = None) -> dict[str, Any]:
    """pytest-benchmark's ``commit_info`` of the code measured at ``repo``: ``id`` and its times are
    those of ``measured_commit()``, ``dirty`` is :func:`code_differs`, ``head`` the HEAD commit.
    Raises ``subprocess.CalledProcessError`` outside a git work tree: a saved run must name its
    code."""
    from pytest_benchmark.utils import get_commit_info

    from optbench.run.runner import measured_commit

    commit = measured_commit(cwd=repo)
    committed, authored = _git(repo, "show", "-s", "--format=%cI %aI", commit).split()
    return {
        **get_commit_info(project_name),
        "id": commit,
        "time": committed,
        "author_time": authored,
        "dirty": code_differs(repo),
        "head": _git(repo, "rev-parse", "HEAD"),
    }


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark's own (a first-result hook)
def pytest_benchmark_generate_commit_info(config: Any) -> dict[str, Any]:
    return measured_commit_info(project_name=config.getoption("benchmark_project_name", None))


def pytest_configure(config: Any) -> None:
    """``--benchmark-autosave`` names the run as pytest-benchmark does (commit, time,
    'uncommited-changes' when dirty), after the measured commit; runs before pytest-benchmark's own
    (``trylast``) configure."""
    if not config.getoption("benchmark_autosave", None):
        return
    from pytest_benchmark.utils import get_current_time

    info = measured_commit_info()
    config.option.benchmark_autosave = "_".join(
        [info["id"], get_current_time(), *(["uncommited-changes"] if info["dirty"] else [])]
    )
