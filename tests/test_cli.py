"""Bad input gets one clear line and exit 2 (argparse's), never a traceback or the regression code 1."""

from __future__ import annotations

import pytest
import torch

from optbench import cli

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
