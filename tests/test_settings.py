"""Run settings: one object, carried to asv's processes by environment variables and read back in
one place."""

from __future__ import annotations

from pathlib import Path

import pytest

from optbench.store import settings as S
from optbench.store.store import REPO_ROOT


def test_settings_round_trip_through_the_environment():
    made = S.Settings(
        suite="quick",
        select="Step1B",
        case_budget_s=90.0,
        deadline=1.5e9,
        results=Path("/r"),
        machine="h100-sxm",
        run_id="20261124T000000Z-abcdef",
        emulate="t4",
        plant_slowdown="a/b=0.1",
    )
    assert S.Settings.from_env(made.env()) == made
    assert set(made.env()) <= set(S.VARIABLES.values())


def test_a_reused_check_reaches_a_benchmark_process_from_its_settings_alone(tmp_path, monkeypatch):
    """Mutation: a stray OPTBENCH_CHECKED_IN in the caller's shell would have `optbench run` (and
    ab's first rounds) time every kernel and step case unchecked."""
    variable = S.VARIABLES["checked_in"]
    monkeypatch.setenv(variable, "a stray run")
    assert variable not in S.process_env(S.Settings(), tmp_path, tmp_path / ".cache")
    reused = S.process_env(S.Settings(checked_in="r1"), tmp_path, tmp_path / ".cache")
    assert reused[variable] == "r1"


def test_an_unset_suite_follows_the_machine(monkeypatch):
    monkeypatch.setattr(S, "has_nvidia_gpu", lambda env: False)
    assert S.Settings.from_env({}).suite == "cpu"
    monkeypatch.setattr(S, "has_nvidia_gpu", lambda env: True)
    assert S.Settings.from_env({}).suite == "full"
    assert S.Settings.from_env({"OPTBENCH_SUITE": "quick"}).suite == "quick"


def test_hidden_devices_are_no_gpu():
    assert not S.has_nvidia_gpu({"CUDA_VISIBLE_DEVICES": ""})
    assert not S.has_nvidia_gpu({"CUDA_VISIBLE_DEVICES": "-1"})


# Reads of other tools' variables outside settings: PYTHONPATH passed on to a child process,
# Triton's own switch, torchrun's local rank and node (group) rank.
OTHER_READS = {
    "optbench/reporting/history.py": ('os.environ.get("PYTHONPATH")',),
    "models/step.py": ('os.environ.get("TRITON_INTERPRET")',),
    "optbench/suite/distributed.py": (
        'os.environ.get("LOCAL_RANK", "0")',
        'os.environ.get("GROUP_RANK", "0")',
    ),
}


def test_only_settings_reads_the_environment():
    """No module of the harness, the suites, the models or the kernels reads an environment variable
    but ``optbench.store.settings`` (and the reads of other tools' variables in OTHER_READS)."""
    import re

    root = REPO_ROOT
    reads = re.compile(r"os\.environ\.get\([^)]*\)|os\.environ\[[^]]*\]|os\.getenv\([^)]*\)")
    found = {}
    for folder in ("optbench", "benchmarks", "models", "kernels"):
        for path in (root / folder).rglob("*.py"):
            rel = str(path.relative_to(root))
            hits = [h for h in reads.findall(path.read_text()) if h not in OTHER_READS.get(rel, ())]
            if hits and path.name != "settings.py":
                found[rel] = hits
    assert found == {}


@pytest.mark.parametrize("suite", ["cpu", "quick"])
def test_a_class_outside_the_suite_skips_without_building_cases(suite, monkeypatch):
    """A plain `asv run` lists every class: outside the run's suite each returns skips, building
    nothing."""
    from optbench.suite import grids

    monkeypatch.setenv("OPTBENCH_SUITE", suite)

    monkeypatch.setattr(grids, "cases", lambda *a: pytest.fail("built cases outside the suite"))
    records = grids.measure_suite(["bench_step.Step1B"])
    assert records and all(
        r["status"] == "skipped" and f"not in the '{suite}' suite" in r["reason"]
        for r in records.values()
    )


def test_a_plain_asv_run_stores_under_asvs_machine(tmp_path, monkeypatch):
    """Under asv (ASV=true) without optbench's machine setting, records go where asv puts its own:
    the one machine of asv's machine file; with none or several there, the detected name."""
    import json

    from optbench.run import runner

    one = tmp_path / "one.json"
    one.write_text(json.dumps({"vm": {"machine": "vm"}, "version": 1}))
    two = tmp_path / "two.json"
    two.write_text(json.dumps({"a": {}, "b": {}, "version": 1}))
    assert runner.asv_machine(one) == "vm" and runner.asv_machine(two) is None
    assert runner.asv_machine(tmp_path / "missing.json") is None
    monkeypatch.setattr(runner, "asv_machine", lambda path=None: "vm")
    monkeypatch.delenv("OPTBENCH_MACHINE", raising=False)
    monkeypatch.setenv("ASV", "true")
    assert runner.current_machine() == "vm"
    monkeypatch.setenv("OPTBENCH_MACHINE", "h100-sxm")
    assert runner.current_machine() == "h100-sxm"
