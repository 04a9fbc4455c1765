"""The pytest-benchmark twin's saved runs carry optbench's machine record (benchmarks/conftest.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_saved_runs_carry_the_machine(tmp_path: Path) -> None:
    # The twin's kernels need a GPU; a trivial benchmark under the same plugin shows what a saved run holds.
    (tmp_path / "test_trivial.py").write_text("def test_sum(benchmark):\n    benchmark(sum, range(10))\n")
    storage = tmp_path / "storage"
    cmd = [sys.executable, "-m", "pytest", str(tmp_path / "test_trivial.py"), "-q", "-p", "no:cacheprovider",
           "-p", "benchmarks.conftest", f"--benchmark-storage=file://{storage}", "--benchmark-autosave"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [saved] = storage.rglob("*.json")
    machine = json.loads(saved.read_text())["machine_info"]["optbench"]
    assert {"gpu_name", "gpu_count", "driver", "cuda", "torch", "triton", "profile", "date"} <= machine.keys()
    assert machine["torch"] and machine["profile"]
