"""Where the bench's results go: the run's metadata, the output files
(never over files git tracks), and `--record`'s JSON-lines log."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shlex
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path("softmax-bench")
"""Where `softmax bench` writes unless told (--out), relative to the current directory."""


class OutputError(Exception):
    """The bench was asked to write where it must not (over files git tracks)."""


def _git(args: Sequence[str], cwd: Path) -> str | None:
    """stdout of `git args` run in `cwd`, or None if git is missing or fails."""
    try:
        done = subprocess.run(
            ["git", "--literal-pathspecs", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_commit() -> str | None:
    """The commit of the checkout this package runs from ("-dirty" if it has
    uncommitted changes to tracked files); None outside a git checkout."""
    here = Path(__file__).resolve().parent
    if _git(["rev-parse", "--show-toplevel"], here) is None:
        return None
    if _git(["check-ignore", "-q", str(here)], here) is not None:
        return None  # an installed copy (a venv inside someone's repository)
    head = _git(["rev-parse", "--short", "HEAD"], here)
    if not head:
        return None
    dirty = _git(["status", "--porcelain", "--untracked-files=no"], here)
    return head.strip() + ("-dirty" if dirty and dirty.strip() else "")


def device_name(kind: str) -> str:
    """A readable name of the device that runs ("NVIDIA H100 80GB HBM3", "AMD EPYC CPU")."""
    if kind == "gpu":
        try:
            import torch

            return torch.cuda.get_device_name(0)
        except Exception:
            pass
        try:
            from ..devices import device

            return str(device("gpu").model_name)
        except Exception:
            return "gpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + " CPU"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} CPU"


RUN_KEYS = ("date", "commit", "device", "command", "kind")
"""The run metadata each `--record` line carries under "run" (benchmarks/RESULTS.md)."""


def run_kind(kind: str, op: str, bridge: bool = False, latency: bool = False) -> str:
    """What sort of run this is, as results.jsonl names it: "<cpu|gpu>_<mode>",
    mode one of forward, backward, bridge, torch_fwd_bwd, latency."""
    if latency:
        mode = "latency"
    elif op == "softmax_backward":
        mode = "backward"  # the name earlier rows of results.jsonl carry
    elif op != "softmax":
        mode = op
    else:
        mode = "bridge" if bridge else "forward"
    return f"{kind}_{mode}"


def run_info(kind: str, argv: Sequence[str], run: str, **more: Any) -> dict[str, Any]:
    """The run's metadata: date, commit, device, command, kind (the run's
    kind, e.g. "gpu_forward"), then `device_kind` and `more`."""
    return {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "commit": git_commit(),
        "device": device_name(kind),
        "command": "softmax bench " + " ".join(shlex.quote(a) for a in argv),
        "kind": run,
        "device_kind": kind,
        "host": platform.node(),
        **more,
    }


def tracked_files(paths: Iterable[Path]) -> list[str]:
    """Those of `paths` that git tracks (as git names them); [] where git is
    missing or the paths are in no work tree."""
    paths = [Path(p).resolve() for p in paths]
    if not paths:
        return []
    anchor = paths[0].parent
    while not anchor.is_dir() and anchor != anchor.parent:
        anchor = anchor.parent
    top = _git(["rev-parse", "--show-toplevel"], anchor)
    if not top:
        return []
    root = Path(top.strip()).resolve()
    rels = [os.path.relpath(p, root) for p in paths]
    rels = [r for r in rels if not r.startswith("..")]
    if not rels:
        return []
    listed = _git(["ls-files", "-z", "--", *rels], root)
    return [name for name in (listed or "").split("\0") if name]


def refuse_tracked(paths: Iterable[Path]) -> None:
    """Raise OutputError naming every one of `paths` that git tracks."""
    hit = tracked_files(paths)
    if hit:
        raise OutputError(
            "refusing to write over files git tracks: "
            + ", ".join(hit)
            + f" (pick another --out or a --tag; the default is ./{DEFAULT_OUT}/)"
        )


def _clean(value: Any) -> Any:
    """`value` with NaN/inf floats as None, so the JSON is strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """The run's JSON file: {"meta": the run, "results": the rows}."""
    payload = _clean({"meta": meta, "results": rows})
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)  # a sweep cut short never leaves half a file


def append_record(path: Path, rows: list[dict[str, Any]], meta: dict[str, Any], op: str) -> None:
    """Append one JSON object per row to `path` (JSON lines): {"run": the
    run's date, commit, device, command and kind; "op": `op`; the row's fields}."""
    run = {k: meta.get(k) for k in RUN_KEYS}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for row in rows:
            line = _clean({"run": run, "op": op, **row})
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
