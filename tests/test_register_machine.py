"""``optbench.cli.register_machine``: asv learns the machine from its per-user file; a committed
``results/asv/<machine>/machine.json`` stays as it is, also once asv has written it back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from asv.machine import Machine

from optbench.asv import asv_atomic
from optbench.cli import register_machine
from optbench.run.runner import asv_machine
from optbench.store import store
from optbench.store.store import REPO_ROOT

COMMITTED = REPO_ROOT / "results" / "asv" / "cpu-amd-epyc" / "machine.json"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A HOME of the test's own (asv's machine file lives there) and an asv results tree in
    ``tmp_path/asv``."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.setattr(store, "asv_results_dir", lambda root=None: tmp_path / "asv")
    return tmp_path / "home"


@pytest.mark.parametrize("writer", ["asv", "optbench"])
def test_a_committed_machine_json_stays_byte_identical(home, tmp_path, monkeypatch, writer):
    committed = tmp_path / "asv" / "cpu-amd-epyc" / "machine.json"
    committed.parent.mkdir(parents=True)
    shutil.copy(COMMITTED, committed)
    before = committed.read_bytes()
    register_machine("cpu-amd-epyc")
    assert committed.read_bytes() == before
    # what `asv run --machine cpu-amd-epyc` does next (optbench run's asv writes through asv_atomic)
    if writer == "optbench":
        monkeypatch.setattr("asv.util.write_json", asv_atomic._write_json)
    Machine.load(machine_name="cpu-amd-epyc", interactive=True).save(str(tmp_path / "asv"))
    assert committed.read_bytes() == before
    assert asv_machine() == "cpu-amd-epyc"  # where optbench's records of a plain asv run go


def test_a_new_machine_is_described_once_and_other_machines_are_kept(home, tmp_path):
    machine_file = home / ".asv-machine.json"
    machine_file.write_text(json.dumps({"other": {"machine": "other"}, "version": 1}))
    register_machine("cpu-new-0a1b2c")
    known = json.loads(machine_file.read_text())
    assert set(known) == {"other", "cpu-new-0a1b2c", "version"}
    entry = known["cpu-new-0a1b2c"]
    assert entry["machine"] == "cpu-new-0a1b2c"
    assert {"os", "arch", "cpu", "num_cpu", "ram"} <= set(entry)
    assert not (tmp_path / "asv").exists()  # nothing under results/
    written = machine_file.stat().st_mtime_ns
    register_machine("cpu-new-0a1b2c")
    assert machine_file.stat().st_mtime_ns == written  # unchanged: not written again
