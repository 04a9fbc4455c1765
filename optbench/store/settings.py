"""Run settings: one object, built by the CLI and passed to asv's processes through their
environment.

``optbench run`` makes a :class:`Settings`, turns it into environment variables
(:meth:`Settings.env`) for the asv processes it starts, and every process reads them back here
(:func:`current`), once per call: this module is the only reader of optbench's environment
variables. Unset fields keep their defaults, so a plain ``asv run`` (no CLI) measures the full suite
with each case's default budget.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

# field -> the environment variable that carries it
VARIABLES = {
    "suite": "OPTBENCH_SUITE",
    "select": "OPTBENCH_SELECT",
    "skip_existing": "OPTBENCH_SKIP_EXISTING",
    "case_budget_s": "OPTBENCH_CASE_BUDGET_S",
    "deadline": "OPTBENCH_RUN_DEADLINE",
    "results": "OPTBENCH_RESULTS",
    "machine": "OPTBENCH_MACHINE",
    "run_id": "OPTBENCH_RUN_ID",
    "emulate": "OPTBENCH_EMULATE",
    "plant_slowdown": "OPTBENCH_PLANT_SLOWDOWN",
    "progress": "OPTBENCH_PROGRESS",
    "asv_commit": "ASV_COMMIT",
    "asv": "ASV",
    "compile_cache": "OPTBENCH_COMPILE_CACHE",
    "runs_at_once": "OPTBENCH_RUNS_AT_ONCE",
    "checked_in": "OPTBENCH_CHECKED_IN",
    "prewarm_parent": "OPTBENCH_PREWARM_PARENT",
}


@dataclass(frozen=True)
class Settings:
    """What one run measures and where it stores it; every field optional."""

    suite: str = "auto"  # one of optbench.suite.catalog.SUITE_NAMES; auto: see from_env
    select: str | None = None  # regex on record keys: only the cases it matches run
    # 'true': leave out the cases this commit has a record of on this machine
    skip_existing: str | None = None
    case_budget_s: float = 180.0  # seconds one case may take before it is recorded as a timeout
    # Unix time after which no new case starts (the run's time budget)
    deadline: float | None = None
    results: Path | None = None  # results root (default: results/ of the repository)
    machine: str | None = None  # results-folder name of this machine (default: detected)
    # the run every process of one ``optbench run`` shares (default: per process)
    run_id: str | None = None
    # hardware profile key to emulate on a larger GPU (optbench.measure.emulate)
    emulate: str | None = None
    # the gate's own check only: 'op/impl=fraction,...' (optbench.suite.workloads)
    plant_slowdown: str = ""
    # file every benchmark process appends its case events to (optbench.run.progress)
    progress: Path | None = None
    asv_commit: str | None = None  # the commit asv says it measures (set by asv)
    asv: str | None = None  # 'true' in a process asv started (set by asv)
    # what the run's compile caches started from (optbench.run.compile_cache)
    compile_cache: str | None = None
    # runs measuring on this host at the same time, this one among them (run --gpus: one per GPU)
    runs_at_once: str | None = None
    # an earlier run of this commit in which every case this process measures passed its check
    # (optbench ab's later rounds): kernel and step cases skip the check and the reference it needs
    checked_in: str | None = None
    # the pid of the run whose compile warm-up this process is (optbench.suite.prewarm): it ends
    # when that one does
    prewarm_parent: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings an environment holds (``os.environ`` by default); empty variables count as
        unset. An unset suite is 'full' where this machine has an NVIDIA GPU (its driver's device
        node) and 'cpu' where it has none, so a plain ``asv run`` on a CPU runs the CPU suite."""
        env = os.environ if env is None else env
        kind = {f.name: f.type for f in fields(cls)}
        values: dict = {}
        for name, var in VARIABLES.items():
            raw = env.get(var)
            if not raw:
                continue
            typ = kind[name]
            values[name] = float(raw) if "float" in typ else Path(raw) if "Path" in typ else raw
        values.setdefault("suite", "full" if has_nvidia_gpu(env) else "cpu")
        return cls(**values)

    def env(self) -> dict[str, str]:
        """The environment variables that carry these settings to another process (unset fields left
        out)."""
        out = {}
        for name, var in VARIABLES.items():
            value = getattr(self, name)
            if value is not None and value != "":
                out[var] = str(value)
        return out


def process_env(settings: Settings, code: Path, cache: Path) -> dict[str, str]:
    """The environment of a benchmark process that runs the code of the work tree ``code`` (first on
    its import path, also for the processes asv starts, which drop PYTHONPATH) with ``settings``,
    its compile caches under ``cache`` (shared by every run and commit of a checkout): this
    process's environment plus those. A reused check (``checked_in``) reaches it only from
    ``settings``, never from this process's environment: a stray one would time cases unchecked."""
    env = dict(os.environ)
    env.pop(VARIABLES["checked_in"], None)
    env.update(settings.env())
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        TRITON_CACHE_DIR=str(cache / "triton"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")])),
    )
    env["ASV_PYTHONPATH"] = env["PYTHONPATH"]
    return env


def has_nvidia_gpu(env: Mapping[str, str]) -> bool:
    """Whether an NVIDIA GPU is visible, without importing torch: the driver's control node exists
    and ``CUDA_VISIBLE_DEVICES`` does not hide every device."""
    hidden = (
        env.get("CUDA_VISIBLE_DEVICES") in ("", "-1") if "CUDA_VISIBLE_DEVICES" in env else False
    )
    return Path("/dev/nvidiactl").exists() and not hidden


def current() -> Settings:
    """The settings of this process (read from its environment on every call, so a test can set
    them)."""
    return Settings.from_env()
