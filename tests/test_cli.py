"""The `softmax` command checks against SciPy and reports."""

from __future__ import annotations

from max_softmax.cli import main


def test_default_report_passes(capsys):
    assert main(["--device", "cpu", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "device=cpu" in out and "8x50257" in out and "128" in out
    assert "PASSED" in out


def test_options(capsys):
    args = [
        "--device",
        "cpu",
        "--shape",
        "3,4,50",
        "--axis",
        "1",
        "--dtype",
        "float64",
        "--op",
        "log_softmax",
        "--seed",
        "3",
        "--repeat",
        "1",
    ]
    assert main(args) == 0
    assert "3x4x50" in capsys.readouterr().out


def test_bad_input_exit_status(capsys):
    assert main(["--device", "cpu", "--shape", "3", "--axis", "4"]) == 2
    assert "out of range" in capsys.readouterr().err


def test_backward_flag(capsys):
    args = [
        "--device",
        "cpu",
        "--shape",
        "4,300",
        "--op",
        "log_softmax",
        "--backward",
        "--repeat",
        "1",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "log_softmax_backward" in out and "FAIL" not in out
