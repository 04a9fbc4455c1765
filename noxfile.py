"""nox sessions: tests and lint for CI; bench, compare, history, report and profile for runners;
wheelhouse and bundle to prepare an offline GPU runner.

``tests`` and ``bench`` build a virtualenv that sees the system's packages (a runner's own CUDA
build of torch is what gets measured) and install the CPU wheel of torch only where none is
importable; the other sessions run in the current Python. nox itself needs Python 3.11+ (this file
reads pyproject.toml with tomllib).
"""

from __future__ import annotations

import glob
import os

import nox
import tomllib

nox.options.sessions = ["tests", "lint"]
nox.options.error_on_missing_interpreters = False
nox.options.reuse_venv = "yes"  # a session's virtualenv (torch and all) is built once, then reused

# from the public index the CUDA build (it brings triton); locally a CPU wheel
CPU_TORCH = "torch==2.13.0"
# runs the kernels in its interpreter on a CPU; only where torch brought none
TRITON_FOR_CPU_TORCH = "triton==3.6.0"
# The FP8 switches' tests (torchao's float8 training, emulated on a CPU), where the machine has no
# torchao: a release whose float8 training runs on CPU_TORCH's torch (the runners carry
# RUNNER_WHEELS' one, built for theirs).
TORCHAO_FOR_TESTS = "torchao==0.18.0"
# the runners' CUDA build (see RUNNER_WHEELS)
RUNNER_CUDA = os.environ.get("OPTBENCH_RUNNER_CUDA", "130")


def _dev_pin(name: str) -> str:
    """pyproject.toml's pin of ``name`` in the dev set (``name==version``), its one place."""
    with open("pyproject.toml", "rb") as f:
        dev = tomllib.load(f)["project"]["optional-dependencies"]["dev"]
    pins = [r for r in dev if r.replace(" ", "").partition("==")[0] == name]
    if not pins:
        raise LookupError(f"pyproject.toml's dev set pins no {name}==VERSION")
    return pins[0]


# What an offline GPU runner lacks (asv with its requirements, Liger-Kernel, bitsandbytes for the
# 8-bit AdamW switch), pinned so every runner installs the same set. importlib-metadata 10 needs
# `lazy_importer`, absent on the runners: keep 8.x. bitsandbytes ships one native library per
# CUDA/ROCm/XPU build (125 MB of 129 MB unpacked, 41 MB packed): the wheelhouse keeps the CPU one
# and those of RUNNER_CUDA (torch.version.cuda without the dot on the runners, "130" for our H100s'
# torch 2.11+cu130), 5 MB, so that a copied work tree fits a lent machine's 64 MiB. The suite skips
# the 8-bit switch where bitsandbytes is missing.
RUNNER_WHEELS = [
    "asv==0.6.6",
    "asv-runner==0.3.2",
    "json5==0.17.3",
    "pympler==1.1",
    "importlib-metadata==8.7.0",
    _dev_pin("liger-kernel"),
    "bitsandbytes==0.50.2",
    # the FP8 switches (float8 training): built for torch 2.11, pytorch/ao#2919's table
    "torchao==0.17.0",
    # NVML in process: the GPU's clock and power in ~1 ms (nvidia-smi takes ~0.1 s)
    "nvidia-ml-py==13.615.71",
]
# asv's virtualenv requirement (with its own), pinned for the CI runners, where it comes with nox
# (.github/workflows/gpu-bench.yml downloads nox under RUNNER_WHEELS + NOX_PINS), and left out of
# the wheelhouse: scripts/gpu-run.sh runs asv in its 'existing' environment, which never imports
# virtualenv, and these 6.3 MB would take a lent machine's copied tree (work tree, .wheelhouse,
# .bundle) nearer its 64 MiB.
NOX_PINS = [
    "virtualenv==21.15.8",
    "distlib==0.4.4",
    "platformdirs==4.14.7",
    "python-discovery==1.9.5",
]


def _installed(session: nox.Session, module: str) -> bool:
    """Whether the session's interpreter finds ``module``, asked without importing it and without a
    failing command (whose traceback nox would print on a fresh machine's console); part of the
    install step (``run_install``), as the installs it decides."""
    found = session.run_install(
        "python",
        "-c",
        "import importlib.util, sys; print(importlib.util.find_spec(sys.argv[1]) is not None)",
        module,
        silent=True,
    )
    # the answer is the last line: a warning on stderr (in the same output) may come first
    return (str(found).strip().splitlines() or [""])[-1] == "True"


def _install_project(session: nox.Session) -> None:
    """torch (the system's where the virtualenv sees one), then the project with its dev set, and
    Triton pinned in the same resolve where torch brought none: Liger-Kernel asks for any triton,
    and pip alone takes the newest (3.9.0 on 2026-11-27, not the interpreter the kernels' tests
    were written against)."""
    if not _installed(session, "torch"):
        session.install(CPU_TORCH)
    triton = [] if _installed(session, "triton") else [TRITON_FOR_CPU_TORCH]
    session.install("-e", ".[dev]", *triton)


def _optbench(session: nox.Session, command: str) -> None:
    session.run("python", "-m", "optbench.cli", command, *session.posargs)


@nox.session(venv_params=["--system-site-packages"])
def tests(session: nox.Session) -> None:
    """Unit, kernel (Triton interpreter on a CPU) and harness tests. Zero tests collected fails."""
    _install_project(session)
    if not _installed(session, "torchao"):
        session.install(TORCHAO_FOR_TESTS)
    session.run(
        "python",
        "-m",
        "pytest",
        "-q",
        *session.posargs,
        env={"TRITON_INTERPRET": "1"} if not os.environ.get("CUDA_VISIBLE_DEVICES") else {},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the project: its checks (lines of at most 100 characters among them) and its
    formatting."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(venv_params=["--system-site-packages"])
def bench(session: nox.Session) -> None:
    """Benchmark the current commit here (full suite with a GPU, CPU suite without), then publish
    HTML.

    The virtualenv sees the system's packages, so a runner's own CUDA build of torch is what gets
    measured.
    """
    _install_project(session)
    _optbench(session, "run")


@nox.session(venv_params=["--system-site-packages"])
def compare(session: nox.Session) -> None:
    """`nox -s compare -- BASE HEAD`: exit 1 on a significant regression, 2 when nothing was
    comparable."""
    _install_project(session)
    _optbench(session, "compare")


@nox.session(venv_params=["--system-site-packages"])
def history(session: nox.Session) -> None:
    """`nox -s history -- A..B`: benchmark each commit of a range, one git worktree per commit."""
    _install_project(session)
    _optbench(session, "history")


@nox.session(venv_params=["--system-site-packages"])
def report(session: nox.Session) -> None:
    """asv publish plus optbench's charts and comparison pages under html/."""
    _install_project(session)
    _optbench(session, "report")


@nox.session(venv_params=["--system-site-packages"])
def profile(session: nox.Session) -> None:
    """`nox -s profile -- --size 100M --variant best`: a profiling report like the seeds'."""
    _install_project(session)
    _optbench(session, "profile")


@nox.session(venv_backend="none")
def wheelhouse(session: nox.Session) -> None:
    """Download the wheels an offline GPU runner needs into .wheelhouse/.

    Defaults target CPython 3.12 on manylinux x86-64 (our H100 runners); pass pip download's
    platform options after `--` for another runner, e.g. `-- --python-version 3.11`.
    """
    opts = session.posargs or ["--python-version", "3.12"]
    platforms = [
        f"--platform={p}"
        for p in (
            "manylinux_2_28_x86_64",
            "manylinux_2_24_x86_64",
            "manylinux_2_17_x86_64",
            "manylinux2014_x86_64",
            "manylinux1_x86_64",
            "any",
        )
    ]
    session.run(
        "python",
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        *platforms,
        *opts,
        "-d",
        ".wheelhouse",
        *RUNNER_WHEELS,
    )
    for wheel in glob.glob(".wheelhouse/bitsandbytes-*.whl"):
        _keep_native_libraries(wheel, ("cpu", f"cuda{RUNNER_CUDA}"))


def _keep_native_libraries(wheel: str, builds: tuple[str, ...]) -> None:
    """Rewrite a bitsandbytes wheel without the native libraries of other builds (and their RECORD
    lines)."""
    import re
    import zipfile

    def dropped(name: str) -> bool:
        match = re.search(r"libbitsandbytes_(\w+)\.so$", name)
        return bool(match) and match.group(1) not in builds

    slim = wheel + ".tmp"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if dropped(item.filename):
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                data = b"".join(
                    line
                    for line in data.splitlines(keepends=True)
                    if not dropped(line.split(b",")[0].decode())
                )
            dst.writestr(item, data)
    os.replace(slim, wheel)


@nox.session(venv_backend="none")
def compile_cache(session: nox.Session) -> None:
    """`nox -s compile_cache -- DIR/compile-cache/*.tar.xz`: keep a GPU run's packed compile caches
    in .compile-cache/ for the next run to carry (optbench.run.compile_cache; one file per
    GPU/torch/Triton/CUDA key)."""
    import shutil

    if not session.posargs:
        session.error(
            "name the packed caches of a GPU run: "
            "nox -s compile_cache -- OUT/compile-cache/*.tar.xz"
        )
    os.makedirs(".compile-cache", exist_ok=True)
    for packed in session.posargs:
        shutil.copy(packed, os.path.join(".compile-cache", os.path.basename(packed)))
        session.log(f"kept {packed} in .compile-cache/")


@nox.session(venv_backend="none")
def bundle(session: nox.Session) -> None:
    """Write the repository's history, less the blobs the work tree holds, to .bundle/ for a runner
    whose copy has none (scripts/history_pack.py)."""
    session.run("python3", "scripts/history_pack.py", "pack", external=True)
