"""The ``optbench`` command: run the suite, compare commits, publish reports, profile a training step,
plan what a GPU can run, check the timer and the gate.

``optbench run`` benchmarks the current commit on whatever device is here (the CPU suite without a
GPU), stores results under ``results/<machine>/`` and writes HTML under ``html/``. The other
commands are those of their modules (``optbench <command> --help``).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from optbench.store import REPO_ROOT as ROOT

# asv --bench selections per suite. The grid sizes inside each class follow OPTBENCH_SUITE too. The
# leave-one-out ablations of best-kernels (bench_step.Ablation<size>, ~30 compiled steps) are a suite of their
# own, not part of 'full' (already over 20 minutes on an H100): they attribute a code state's best step, not
# track commits; one size: --select '^bench_step\.Ablation1B'.
SUITES: dict[str, list[str]] = {
    "cpu": [r"^bench_cpu\.", r"^bench_step\.StepTiny"],
    "quick": [r"^bench_kernels\.(AddRMSNorm|SwiGLU|QKVRope|LinearCrossEntropy)", r"^bench_step\.Step100M",
              r"^bench_precision\.Matmul"],
    "full": [r"^bench_kernels\.", r"^bench_step\.Step(100M|500M|1B)", r"^bench_precision\.", r"^bench_anchors\."],
    "ablation": [r"^bench_step\.Ablation(100M|500M|1B)"],
}
SUBCOMMANDS = {
    "compare": "optbench.compare",
    "report": "optbench.report",
    "history": "optbench.history",
    "calibrate": "optbench.calibrate",
    "profile": "optbench.profile",
    "plan": "optbench.plan",
    "noisecheck": "optbench.noisecheck",
    "merge": "optbench.merge",
}


# What asv needs after the grids of a run with a time budget: the remaining classes' quick skips, its track
# processes and writing the results (a 9e238a7 run killed at its job limit wrote no asv results).
ASV_WRAP_UP_S = 60.0
# The shortest --time-budget that can measure a case: the wrap-up, asv's start-up before the first grid (about
# 30 s on an H100 runner) and the 30 s a case needs left to start (optbench.runner). On an H100, 110 s measured
# nothing and 130 s measured three kernel cases.
MIN_TIME_BUDGET_S = ASV_WRAP_UP_S + 60.0


def git_commit(ref: str = "HEAD") -> str:
    """The commit whose code ``ref`` has (``optbench.runner.measured_commit``: commits of results and notes
    alone are skipped); a clear error where the work tree has no git history."""
    from optbench.runner import measured_commit

    try:
        return measured_commit(ref, cwd=str(ROOT))
    except subprocess.CalledProcessError as exc:
        raise SystemExit(
            f"optbench: cannot resolve {ref!r} in {ROOT}: {exc.stderr.strip()}\n"
            "A copied work tree has no history: restore it from a bundle (scripts/gpu-run.sh does).") from exc


def bench_env(suite: str, machine: str) -> dict[str, str]:
    """Environment of the asv processes: where results go, the run id they share, the suite size, persistent
    compile caches."""
    from optbench.store import RUN_ENV, new_run_id

    cache = ROOT / ".cache"
    env = dict(os.environ)
    env.setdefault(RUN_ENV, new_run_id())
    env.update(OPTBENCH_MACHINE=machine, OPTBENCH_SUITE=suite, OPTBENCH_RESULTS=str(ROOT / "results"),
               TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    env["ASV_PYTHONPATH"] = env["PYTHONPATH"]  # asv drops PYTHONPATH for its benchmark processes, not this
    return env


def asv(args: list[str], env: dict[str, str] | None = None) -> int:
    """Runs asv (with its JSON writer made atomic) in the repository root; returns its exit code."""
    return subprocess.run([sys.executable, "-m", "optbench.asv_atomic", *args], cwd=ROOT, env=env).returncode


def register_machine(machine: str) -> None:
    """Writes asv's machine file for ``machine`` with the GPU named beside the CPU."""
    from optbench.machine import machine_info

    info = machine_info()
    cpu = str(info.get("cpu") or platform.processor() or "unknown cpu")
    if info.get("gpu_name"):
        cpu = f"{cpu} | {info['gpu_count']}x {info['gpu_name']} (driver {info.get('driver')}, CUDA {info.get('cuda')})"
    asv(["machine", "--yes", "--machine", machine, "--os", str(info.get("os")), "--arch", platform.machine(),
         "--cpu", cpu, "--num_cpu", str(info.get("num_cpu")), "--ram", str(info.get("ram_gb"))])


def _asv_results(machine: str, commit: str) -> dict[Path, dict]:
    """asv's result files of ``commit`` on ``machine`` as they are now (one per environment)."""
    import json

    return {path: json.loads(path.read_text()) for path in (ROOT / "results" / machine).glob(f"{commit[:8]}-*.json")}


def _keep_earlier_cases(earlier: dict[Path, dict], machine: str, commit: str) -> None:
    """asv rewrites a benchmark's whole parameter grid, writing null for the cases a ``--select`` left out:
    put back what an earlier run of the same commit measured there, so that partial runs add up."""
    from optbench.merge import merge_asv_results
    from optbench.store import write_json_atomic

    for path, now in _asv_results(machine, commit).items():
        if path in earlier:
            write_json_atomic(path, merge_asv_results(earlier[path], now))


def run(argv: list[str]) -> int:
    """``optbench run``: benchmark the current commit here, store results, publish HTML."""
    p = argparse.ArgumentParser(prog="optbench run", description=run.__doc__)
    p.add_argument("--suite", choices=["auto", *SUITES], default="auto",
                   help="auto: 'full' with a GPU, 'cpu' without")
    p.add_argument("--commit", default="HEAD",
                   help="record the results under the commit whose code this is (commits that only add results "
                        "or notes are skipped)")
    p.add_argument("--emulate", help="hardware profile to emulate on a larger GPU (t4, a100-40gb, rtx5090, ...)")
    p.add_argument("--select", help="regex on record keys ('bench_step.Step1B|variant=best'): measure only those")
    p.add_argument("--no-html", action="store_true", help="skip asv publish and optbench's charts")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="end the run within SECONDS (e.g. a runner's job limit): no case starts, and a running one "
                        f"stops, {ASV_WRAP_UP_S:g} s before it, so asv still writes what was measured")
    args = p.parse_args(argv)
    if args.time_budget is not None and args.time_budget < MIN_TIME_BUDGET_S:
        p.error(f"--time-budget {args.time_budget:g} s cannot measure anything: at least {MIN_TIME_BUDGET_S:g} s "
                f"({ASV_WRAP_UP_S:g} s of it are kept for asv to write its results)")

    import torch

    from optbench.machine import machine_name

    suite = args.suite
    if suite == "auto":
        suite = "full" if torch.cuda.is_available() else "cpu"
    machine = machine_name(emulate=args.emulate)
    commit = git_commit(args.commit)
    env = bench_env(suite, machine)
    if args.emulate:
        from optbench.emulate import emulate_env

        env.update(emulate_env(args.emulate))
    register_machine(machine)
    print(f"optbench: suite {suite!r} on {machine} for {commit[:12]}", flush=True)
    if args.select:
        env["OPTBENCH_SELECT"] = args.select
    if args.time_budget:
        from optbench.runner import RUN_DEADLINE_ENV

        env[RUN_DEADLINE_ENV] = f"{time.time() + args.time_budget - ASV_WRAP_UP_S:.0f}"
    selection = [arg for regex in SUITES[suite] for arg in ("--bench", regex)]
    earlier = _asv_results(machine, commit)
    started = time.perf_counter()
    code = asv(["run", "--environment", f"existing:{sys.executable}", "--set-commit-hash", commit,
                "--machine", machine, "--show-stderr", *selection], env=env)
    _keep_earlier_cases(earlier, machine, commit)
    print(f"optbench: suite {suite!r} on {machine} took {time.perf_counter() - started:.0f} s (asv exit {code})",
          flush=True)
    if not args.no_html:
        from optbench.report import publish

        publish()
    return code


def machine(argv: list[str]) -> int:
    """``optbench machine``: prints this machine's info and results-folder name."""
    import json

    from optbench.machine import machine_info, machine_name

    print(json.dumps({"name": machine_name(), **machine_info()}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"run": run, "machine": machine}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in {*commands, *SUBCOMMANDS}:
        print(f"usage: optbench {{{','.join([*commands, *SUBCOMMANDS])}}} [options]\n\n{__doc__}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    if argv[0] in commands:
        return commands[argv[0]](argv[1:])
    import importlib

    return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
