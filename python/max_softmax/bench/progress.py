"""What the bench tells the user while it works: lines on stderr from the
first second, and a bar over the shapes (tqdm where installed and stderr is
a terminal, else a counter line after each shape)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_bar: Any = None  # the active tqdm bar, if any: lines go through it


def say(message: str) -> None:
    """One progress line on stderr ("bench: ..."), above the bar if there is one."""
    line = f"bench: {message}"
    if _bar is not None:
        _bar.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)


class Progress:
    """Counts finished shapes; each `step` advances the bar or prints a counter."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0

    def step(self, label: str) -> None:
        """One more shape finished."""
        self.done += 1
        if _bar is not None:
            _bar.set_postfix_str(label)
            _bar.update()
        else:
            say(f"[{self.done}/{self.total}] done: {label}")


@contextmanager
def progress(total: int) -> Iterator[Progress]:
    """A Progress over `total` shapes, with a tqdm bar while it is open
    (closed even on Ctrl-C, so the terminal is left clean)."""
    global _bar
    _bar = None
    if sys.stderr.isatty():  # a bar in a log file is noise: plain lines there
        try:
            from tqdm import tqdm

            _bar = tqdm(total=total, file=sys.stderr, desc="bench", leave=True)
        except ImportError:
            pass
    try:
        yield Progress(total)
    finally:
        if _bar is not None:
            _bar.close()
        _bar = None
