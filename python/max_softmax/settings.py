"""The user settings: one table of `MAX_SOFTMAX_*` environment variables.

Every setting is read when it is used (`get`), never at import, so a
process (or a test, through `monkeypatch.setenv`) that changes one sees
the change at the next call (`MAX_SOFTMAX_LAUNCH` aside: `max_softmax.launch`
reads it once, at its import, to keep its per-call path at ~1 µs).
Test-only knobs are pytest options instead (`tests/conftest.py`:
`--fuzz-examples`, `--big`, `--nccl`); tuning knobs of one function are its
arguments (`linear_cross_entropy(chunk_bytes=, overlap=)`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One environment variable: its default, the values it takes (None:
    any string) and what it means."""

    name: str
    default: str
    meaning: str
    choices: tuple[str, ...] | None = None
    old_name: str | None = None


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "MAX_SOFTMAX_QUIET",
            "0",
            "1 (any value but 0) silences the one-line notices of compiles and builds on stderr.",
        ),
        Setting(
            "MAX_SOFTMAX_CACHE",
            "",
            "Where max-softmax keeps what it builds: the precompiled kernel library and "
            "the launch extension (default $XDG_CACHE_HOME/max-softmax, else "
            "~/.cache/max-softmax; MAX keeps compiled models in ~/.cache/modular).",
        ),
        Setting(
            "MAX_SOFTMAX_LAUNCH",
            "auto",
            "How calls reach the kernels: auto (the launch extension, built on "
            "first use), extension (build it at once), graph (MAX's Model.execute only).",
            ("auto", "extension", "graph"),
            old_name="MAX_SOFTMAX_TORCH_LAUNCH",
        ),
        Setting(
            "MAX_SOFTMAX_TORCH_REPLAY",
            "0",
            "1 replays captured device graphs for repeated CUDA calls of the torch "
            "bridge (pays only where buffers are reused call after call).",
            ("0", "1"),
        ),
        Setting(
            "MAX_SOFTMAX_PRECOMPILE",
            "1",
            "0 hands MAX the kernel sources instead of a precompiled package.",
            ("0", "1"),
        ),
        Setting(
            "MAX_SOFTMAX_TARGET_ACCELERATOR",
            "",
            "The GPU the launch extension is built for (e.g. sm_90); default: the "
            "GPU MAX finds, else a CPU-only build.",
        ),
    )
}
"""Every user setting, by name (the README's table is this one)."""

BUILD_DEFINES = ("MAX_SOFTMAX_CPU_ONLY",)
"""`MAX_SOFTMAX_*` names that are no environment variable: Mojo `-D`
defines the launch extension's build passes (`launch._build_args`)."""


def get(name: str) -> str:
    """The setting `name`, read from the environment now: its value, its
    older name's where only that is set, else its default. An empty value
    counts as unset. A value outside the setting's choices raises ValueError
    naming the variable."""
    setting = SETTINGS[name]
    variable, value = name, os.environ.get(name, "")
    if not value and setting.old_name:
        variable, value = setting.old_name, os.environ.get(setting.old_name, "")
    if not value:
        return setting.default
    if setting.choices is not None and value not in setting.choices:
        choices = ", ".join(repr(c) for c in setting.choices)
        raise ValueError(f"max_softmax: {variable} must be one of {choices}, got {value!r}")
    return value


def flag(name: str) -> bool:
    """Whether the on/off setting `name` is on (set, and not "0")."""
    return get(name) != "0"


def table() -> str:
    """The settings as a Markdown table (name, default, meaning)."""
    rows = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for s in SETTINGS.values():
        meaning = s.meaning + (f" Older name: `{s.old_name}`." if s.old_name else "")
        rows.append(f"| `{s.name}` | {f'`{s.default}`' if s.default else '(unset)'} | {meaning} |")
    return "\n".join(rows)
