"""The optbench command, also as ``python -m optbench``: bad input gets one clear line on stderr
and exit 2 (argparse's), never a traceback or the regression code 1; Ctrl-C one line and 130;
every command's help exits 0 in plain text."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from optbench import cli
from optbench.run.helptext import plain
from optbench.store.store import REPO_ROOT

BAD = [
    ["run", "--emulate", "nosuch"],
    ["run", "--emulate", "cpu"],
    ["run", "--select", "["],
    ["run", "--time-budget", "10"],
    ["run", "--suite", "nosuch"],
    ["merge", "/nonexistent.tgz"],
    ["history", "nosuch..x"],
    ["profile", "--diff", "/nonexistent-a", "/nonexistent-b"],
    ["compare", "nosuch", "HEAD"],
]


@pytest.mark.parametrize("argv", BAD, ids=" ".join)
def test_bad_input_is_a_clear_error(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    assert code == 2, out
    assert "Traceback" not in out.out + out.err and (out.out + out.err).strip()


@pytest.mark.skipif(torch.cuda.is_available(), reason="calibrate runs on a GPU")
def test_calibrate_without_a_gpu_says_so(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["calibrate"])
    assert exc.value.code == 2 and "no CUDA GPU" in capsys.readouterr().err


BUILT_IN = ["run", "machine"]
COMMANDS = [*BUILT_IN, *cli.SUBCOMMANDS]
USAGE = f"usage: optbench {{{','.join(COMMANDS)}}} [options]"
MARKUP = re.compile(r":[\w:-]+:`|``|\S::$", re.MULTILINE)  # roles, inline literals, literal blocks


def python_m_optbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m optbench ARGS`` run from ``cwd`` with this checkout importable."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "optbench", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=path),
        timeout=120,
    )


def exit_code(argv: list[str]) -> int:
    """``optbench ARGV``'s exit status, whether returned or raised (argparse's SystemExit)."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code


def test_the_usage_names_every_command():
    assert python_m_optbench("--help", cwd=REPO_ROOT).stdout.splitlines()[0] == USAGE


HELP = [["--help"], ["-h"], *([command, "--help"] for command in COMMANDS)]


@pytest.mark.parametrize("argv", HELP, ids=" ".join)
def test_python_m_optbench_gives_every_commands_help_free_of_sphinx_markup(argv, tmp_path):
    done = python_m_optbench(*argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    prog = " ".join(["optbench", *argv[:-1]])
    assert done.stdout.startswith(f"usage: {prog} ") and not done.stderr
    assert not MARKUP.search(done.stdout), MARKUP.search(done.stdout)


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["bogus"], "unknown command 'bogus'"),
        (["--bogus"], "unknown command '--bogus'"),
        ([], "no command given"),
    ],
)
def test_no_known_command_is_one_line_and_the_usage_on_stderr(argv, problem, tmp_path):
    done = python_m_optbench(*argv, cwd=tmp_path)
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.splitlines() == [f"optbench: {problem}", USAGE]


UNWRITABLE = ["a file", "a read-only folder"]


SYSFS_FOLDER = Path("/sys/fs")  # sysfs: no one creates a file in it, root neither


def unwritable(folder: Path, how: str) -> Path:
    """``folder`` made one that takes no file (``how``): a file in its place, or a folder one may
    not write: read-only by its mode, or, for root, whom no mode stops, a link to a folder of
    sysfs (skipped where there is none)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    if how == "a file":
        folder.write_text("")
    elif os.geteuid() != 0:
        folder.mkdir()
        folder.chmod(0o500)
    elif SYSFS_FOLDER.is_dir():
        folder.symlink_to(SYSFS_FOLDER, target_is_directory=True)
    else:
        pytest.skip("root writes into a read-only folder, and there is no sysfs")
    return folder


@pytest.fixture(params=UNWRITABLE)
def unwritable_results(request, tmp_path: Path) -> Path:
    """A results root that takes no file: a file in its place, or a folder one may not write."""
    return unwritable(tmp_path / "results", request.param)


def files(root: Path) -> dict[Path, bytes]:
    """Every file under ``root`` with its bytes."""
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def one_line_naming(path: Path, out: pytest.CaptureResult[str]) -> bool:
    """Whether the output is one line on stderr, naming ``path``."""
    return not out.out and len(out.err.splitlines()) == 1 and str(path) in out.err


def test_run_into_an_unwritable_results_folder_is_one_line_naming_it(
    unwritable_results, monkeypatch, capsys
):
    monkeypatch.setattr(cli, "ROOT", unwritable_results.parent)
    assert exit_code(["run"]) == 2
    out = capsys.readouterr()
    assert one_line_naming(unwritable_results, out), out


def test_merge_into_an_unwritable_results_folder_is_one_line_naming_it(
    unwritable_results, tmp_path, capsys
):
    source = tmp_path / "source"
    (source / "m" / "optbench").mkdir(parents=True)
    assert exit_code(["merge", str(source), "--into", str(unwritable_results)]) == 2
    out = capsys.readouterr()
    assert one_line_naming(unwritable_results, out), out


@pytest.mark.parametrize("how", UNWRITABLE)
@pytest.mark.parametrize("folder", ["results/<machine>", "results/asv/<machine>"])
def test_run_with_an_unwritable_machine_folder_is_one_line_naming_it_and_writes_nothing(
    folder, how, tmp_path, monkeypatch, capsys
):
    """The machine's folder of optbench's records (or of asv's results) takes no file: one line
    naming it, exit 2, before anything runs or is written (the progress file, asv's machine)."""
    from optbench.measure.machine import machine_name

    path = tmp_path / folder.replace("<machine>", machine_name())
    planted = unwritable(path, how)
    before = files(tmp_path)
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    assert exit_code(["run", "--no-html"]) == 2
    out = capsys.readouterr()
    assert one_line_naming(planted, out) and out.err.startswith("optbench: cannot write "), out
    assert files(tmp_path) == before


@pytest.mark.parametrize("how", UNWRITABLE)
def test_merge_into_an_unwritable_machine_folder_is_one_line_naming_it_and_copies_nothing(
    how, tmp_path, capsys
):
    """The destination's folder of the source's machine takes no file: one line naming it, exit
    2, and nothing copied, asv's files of that machine (which sort first) included."""
    from synthetic_results import commit, save

    from optbench.store.store import ResultStore

    source, dest = tmp_path / "source" / "results", tmp_path / "dest" / "results"
    save(ResultStore(source), "h100-sxm", commit(1), "2026-01-01T00:00:00+00:00", [])
    (source / "asv" / "h100-sxm").mkdir(parents=True)
    (source / "asv" / "h100-sxm" / "machine.json").write_text('{"machine": "h100-sxm"}')
    planted = unwritable(dest / "h100-sxm", how)
    before = files(dest)
    assert exit_code(["merge", str(source), "--into", str(dest)]) == 2
    out = capsys.readouterr()
    assert one_line_naming(planted, out) and out.err.startswith("optbench: cannot write "), out
    assert files(dest) == before


def test_report_compare_of_refs_with_no_stored_runs_is_one_line_and_writes_nothing(
    tmp_path, capsys
):
    """``report --compare`` with a ref that resolves to no stored run on any machine: one line
    naming it, exit 2, no page written."""
    from synthetic_results import commit, save

    from optbench.store.store import ResultStore

    results, html = tmp_path / "results", tmp_path / "html"
    save(ResultStore(results), "h100-sxm", commit(1), "2026-01-01T00:00:00+00:00", [])
    for pair, unknown in (
        (["nosuch", "alsonot"], "'nosuch' and 'alsonot' have"),
        ([commit(1)[:8], "nosuch"], "'nosuch' has"),
    ):
        argv = ["report", "--results", str(results), "--html", str(html), "--compare", *pair]
        assert exit_code(argv) == 2
        out = capsys.readouterr()
        assert not out.out and out.err.splitlines() == [
            f"optbench report: --compare {' '.join(pair)}: {unknown} no stored runs on any "
            f"machine (results in {results}); nothing written"
        ]
        assert not html.exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_ctrl_c_ends_any_command_with_one_line_and_130(command, monkeypatch, capsys):
    def interrupted(argv: list[str]) -> int:
        print("working")
        raise KeyboardInterrupt

    if command in BUILT_IN:
        monkeypatch.setattr(cli, command, interrupted)
    else:
        monkeypatch.setattr(importlib.import_module(cli.SUBCOMMANDS[command]), "main", interrupted)
    try:
        code = exit_code([command, "--anything"])
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped optbench")
    assert code == 130
    out = capsys.readouterr()
    assert out.out == "working\n" and out.err == "optbench: interrupted\n"


def test_plain_takes_sphinx_markup_out_of_a_docstring():
    doc = """Uses :func:`fit_noise`, :meth:`~optbench.gate.compare.Noise.aa_spread`,
    :py:data:`the prior <PRIOR_SIGMA>` and ``zero_grad(
    set_to_none=True)``; `interpreted`, *emphasis*, **strong**; ``*_skip_reason`` and
    ``*_reason``, B * S * L; 'single quotes' stay. Usage::

        optbench run

    ::

        optbench merge
    """
    assert (
        plain(doc)
        == """Uses fit_noise, aa_spread,
    the prior and zero_grad(
    set_to_none=True); interpreted, emphasis, strong; *_skip_reason and
    *_reason, B * S * L; 'single quotes' stay. Usage:

        optbench run


        optbench merge
    """
    )
    assert plain(None) == ""
