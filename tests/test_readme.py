"""Every Python example in the README runs as written, so none can rot."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import max_softmax

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _marks(code: str) -> list:
    marks = []
    if code.startswith("# needs a GPU"):
        marks.append(pytest.mark.skipif(not max_softmax.gpu_available(), reason="no GPU"))
    if "import torch" in code:
        marks.append(
            pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch")
        )
    return marks


def test_the_readme_has_examples():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize(
    "code",
    [pytest.param(code, marks=_marks(code), id=f"block{i}") for i, code in enumerate(BLOCKS)],
)
def test_readme_example_runs(code):
    exec(compile(code, f"{README.name} example", "exec"), {"__name__": "readme_example"})
