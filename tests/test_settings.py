"""The user settings (read when used, one table) and the small front-door
checks of the command line: bad input is a clear error, never a silent
other answer."""

from __future__ import annotations

import numpy as np
import pytest

from max_softmax import settings
from max_softmax.bench import Row
from max_softmax.bench.measure import summary
from max_softmax.cli import main
from max_softmax.validation import check_cross_entropy_options


def test_at_most_six_settings_each_documented():
    assert len(settings.SETTINGS) <= 6
    for name, s in settings.SETTINGS.items():
        assert name.startswith("MAX_SOFTMAX_") and s.meaning
        assert f"`{name}`" in settings.table()


SCANNED = ("python", "scripts", "tests", "benchmarks/tools", "op", ".ci", "README.md")
"""Where a `MAX_SOFTMAX_*` name may be read, set or documented (the results'
history under benchmarks/ keeps the names of its day)."""


def _mentions() -> dict[str, set[str]]:
    """Every `MAX_SOFTMAX_*` name in the SCANNED files, with where."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found: dict[str, set[str]] = {}
    for top in SCANNED:
        base = root / top
        files = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for f in files:
            if not f.is_file() or f.suffix not in {
                ".py",
                ".mojo",
                ".sh",
                ".md",
                ".yml",
                ".yaml",
                "",
            }:
                continue
            text = f.read_text(errors="ignore")
            for name in re.findall(r"MAX_SOFTMAX_[A-Z0-9_]*[A-Z0-9]", text):
                found.setdefault(name, set()).add(str(f.relative_to(root)))
    return found


def test_every_variable_in_the_tree_is_in_the_table():
    """No MAX_SOFTMAX_* name outside the settings table (or its older names,
    or the build's -D defines): a new knob must join the table, become an
    argument, or a pytest option."""
    known = set(settings.SETTINGS) | set(settings.BUILD_DEFINES)
    known |= {s.old_name for s in settings.SETTINGS.values() if s.old_name}
    stray = {name: where for name, where in _mentions().items() if name not in known}
    assert not stray, stray


def test_the_package_reads_settings_only_through_settings():
    """Read when used: no module of the package reads a MAX_SOFTMAX_*
    variable from os.environ itself (settings.get does, at each call)."""
    import re
    from pathlib import Path

    package = Path(settings.__file__).parent
    for f in package.rglob("*.py"):
        if f.name == "settings.py":
            continue
        for line in f.read_text().splitlines():
            assert not re.search(r"environ.*MAX_SOFTMAX_|getenv.*MAX_SOFTMAX_", line), (f, line)


def test_read_when_used(monkeypatch):
    monkeypatch.delenv("MAX_SOFTMAX_TORCH_REPLAY", raising=False)
    assert not settings.flag("MAX_SOFTMAX_TORCH_REPLAY")
    monkeypatch.setenv("MAX_SOFTMAX_TORCH_REPLAY", "1")
    assert settings.flag("MAX_SOFTMAX_TORCH_REPLAY")
    monkeypatch.setenv("MAX_SOFTMAX_QUIET", "yes")
    assert settings.flag("MAX_SOFTMAX_QUIET")


@pytest.mark.parametrize(
    "env,expected",
    [
        ({}, "auto"),
        ({"MAX_SOFTMAX_LAUNCH": ""}, "auto"),
        ({"MAX_SOFTMAX_TORCH_LAUNCH": "extension"}, "extension"),
        ({"MAX_SOFTMAX_TORCH_LAUNCH": "extension", "MAX_SOFTMAX_LAUNCH": "graph"}, "graph"),
    ],
)
def test_launch_and_its_older_name(monkeypatch, env, expected):
    for name in ("MAX_SOFTMAX_LAUNCH", "MAX_SOFTMAX_TORCH_LAUNCH"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert settings.get("MAX_SOFTMAX_LAUNCH") == expected


@pytest.mark.parametrize(
    "name,value",
    [
        ("MAX_SOFTMAX_LAUNCH", "fast"),
        ("MAX_SOFTMAX_TORCH_LAUNCH", "fast"),
        ("MAX_SOFTMAX_TORCH_REPLAY", "yes"),
        ("MAX_SOFTMAX_PRECOMPILE", "off"),
    ],
)
def test_a_bad_value_names_the_variable(monkeypatch, name, value):
    monkeypatch.delenv("MAX_SOFTMAX_LAUNCH", raising=False)
    monkeypatch.setenv(name, value)
    setting = "MAX_SOFTMAX_LAUNCH" if "LAUNCH" in name else name
    with pytest.raises(ValueError, match=name):
        settings.get(setting)


@pytest.mark.parametrize("shape", ["3,x", "3,", ",3", "3x", "a", "", "3,-1"])
def test_a_bad_shape_is_an_error_not_another_shape(capsys, shape):
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cpu", "--shape", shape])
    assert exit_.value.code == 2
    assert "bad shape" in capsys.readouterr().err


@pytest.mark.parametrize("smoothing", ["0.1", b"0.1", True, None, [0.1]])
def test_label_smoothing_must_be_a_number(smoothing):
    with pytest.raises(TypeError, match="label_smoothing must be a float"):
        check_cross_entropy_options("mean", -100, smoothing)


@pytest.mark.parametrize("smoothing", [0, 0.1, np.float32(0.25), 1])
def test_label_smoothing_numbers_pass(smoothing):
    assert check_cross_entropy_options("mean", -100, smoothing)[2] == float(smoothing)


def test_a_missing_headline_says_why_and_what_to_do():
    note = "unreliable: T(K) <= T(1); raise --reps"
    row = Row("ours", 64, 1000, "bfloat16", "cpu", None, None, True, note)
    line = summary(row)
    assert "exec n/a (unreliable: T(K) <= T(1); raise --reps)" in line
    assert "n/a," not in line and not line.endswith("n/a")


def test_every_quick_test_exists():
    """A renamed or deleted test must not drop out of `--quick` unseen."""
    from pathlib import Path

    from conftest import QUICK

    here = Path(__file__).resolve().parent
    for file, names in QUICK.items():
        source = (here / file).read_text()
        for name in names:
            assert f"def {name}(" in source, f"{file}::{name} is in QUICK but not in {file}"
