"""Plain asv, as README's "asv by hand" lines run it, in a new clone after the quick start
registered the machine: ``asv run -E worktree:same HEAD~2..HEAD`` stores asv's results and
optbench's records under the same machine and commits, ``asv compare`` pairs them (numbers, not
n/a), ``asv publish`` writes the site and ``asv preview`` serves it, and git sees nothing new."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from free_port import free_port

from optbench.store.store import REPO_ROOT, ResultStore

GIT = ["git", "-c", "user.name=optbench", "-c", "user.email=optbench@example.invalid"]
BENCH = "StepTiny.track_step_ms"
# One case, on one thread: two threads per step on a loaded 2-core machine slow it 10-70x at random.
SELECT = r"StepTiny\|variant=eager$"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        [*GIT, *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def _clone(path: Path) -> Path:
    """This checkout's files (tracked and untracked, not ignored) with asv's committed list of
    benchmarks and without the other results, as one commit of a new repository at ``path``."""
    files = _git(REPO_ROOT, "ls-files", "-co", "--exclude-standard").splitlines()
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    for name in files:
        if (
            name.startswith("results/")
            and name != "results/asv/benchmarks.json"
            or not (REPO_ROOT / name).is_file()
        ):
            continue
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, path / name)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "base")
    return path


def _run(repo: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_plain_asv_runs_compares_and_publishes_under_optbench_machine_and_commits(tmp_path):
    repo = _clone(tmp_path / "repo")
    step_py = repo / "models" / "step.py"
    for name in ("base", "head"):  # two commits after the clone's first
        step_py.write_text(step_py.read_text() + f"# {name}: a comment, no change in what runs\n")
        _git(repo, "commit", "-qam", name)
    base, head = _git(repo, "rev-parse", "HEAD~1", "HEAD").split()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPTBENCH_", "ASV", "PYTHONPATH"))
    }
    env.update(
        HOME=str(tmp_path / "home"),
        OMP_NUM_THREADS="1",
        OPTBENCH_SUITE="cpu",
        OPTBENCH_SELECT=SELECT,
        PYTHONPATH=str(repo),
    )
    (tmp_path / "home").mkdir()
    # a user's asv machine file often names other machines already: asv then needs --machine
    other = {"other-box": {"machine": "other-box", "os": "", "arch": "", "cpu": "", "num_cpu": "1"}}
    (tmp_path / "home" / ".asv-machine.json").write_text(json.dumps({**other, "version": 1}))
    # what `nox -s bench` (optbench run) does first: name this machine and tell asv
    machine = _run(
        repo,
        env,
        "-c",
        "from optbench.cli import register_machine; "
        "from optbench.measure.machine import machine_name; "
        "register_machine(machine_name()); print(machine_name())",
    ).strip()
    assert _run(repo, env, "-m", "optbench", "machine", "--name").strip() == machine
    del env["PYTHONPATH"]  # asv by hand: the worktree environment puts each commit's code first

    on = ("--machine", machine)  # README: M=$(python -m optbench machine --name)
    _run(
        repo, env, "-m", "asv", "run", "-E", "worktree:same", *on, "--bench", BENCH, "HEAD~2..HEAD"
    )
    for commit in (base, head):
        assert list((repo / "results" / "asv" / machine).glob(f"{commit[:8]}-worktree-py*.json"))
        assert ResultStore(repo / "results").load(machine, commit), commit  # optbench's, beside

    compared = _run(repo, env, "-m", "asv", "compare", *on, "HEAD~1", "HEAD")
    row = next(line for line in compared.splitlines() if f"{BENCH}('eager')" in line)
    # before, after, ratio
    assert re.search(r"\|\s*[\d.]+\s*\|\s*[\d.]+\s*\|\s*[\d.]+\s*\|", row), compared

    _run(repo, env, "-m", "asv", "publish")
    assert (repo / "html" / "asv" / "index.html").is_file()
    port = free_port()
    preview = subprocess.Popen(
        [sys.executable, "-m", "asv", "preview", "--port", str(port)],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.json", timeout=5) as r:
                    assert machine in r.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("asv preview served nothing")
    finally:
        preview.terminate()
        preview.wait(timeout=30)

    # The new machine's results and the HTML are ignored; asv's rewritten list of benchmarks
    # (results/asv/benchmarks.json) is the committed one: the same whatever the suite.
    changed = _git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()
    assert changed == [], changed
