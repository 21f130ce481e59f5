"""The `softmax` command checks against SciPy and reports."""

from __future__ import annotations

import pytest

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
    captured = capsys.readouterr()
    assert "out of range" in captured.err
    assert captured.out == "", "nothing is reported before the error"


def test_empty_shape_reports_no_made_up_sums(capsys):
    assert main(["--device", "cpu", "--shape", "4,0", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "row_sums=n/a (empty)" in out and "0.000000" not in out


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "softmax bench" in out and "softmax train" in out


def test_ctrl_c_exits_130(monkeypatch, capsys):
    from max_softmax import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_check", interrupted)
    assert main(["--device", "cpu"]) == 130
    assert "interrupted" in capsys.readouterr().err


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
