"""The benchmark's own logic: its correctness gate, the table, the guard
against impossible numbers, and one small CPU sweep end to end."""

from __future__ import annotations

import numpy as np
import pytest

from max_softmax.bench import WORKLOADS, Row, _flag_impossible, resolve_timer, table
from max_softmax.device_timer import busy_seconds, gpu_spans
from max_softmax.reference import backward_reference, reference


@pytest.mark.parametrize("op", list(WORKLOADS))
def test_workload_check_accepts_the_reference_and_rejects_a_wrong_answer(op):
    w = WORKLOADS[op]
    inputs = w.make_inputs(np.random.default_rng(0), 8, 300, "float32")
    assert len(inputs) == w.arity
    if op == "softmax":
        right = reference("softmax", inputs[0], -1)
    else:
        y = inputs[0] if op == "softmax_backward" else reference("softmax", inputs[0], -1)
        right = backward_reference("softmax_backward", y, inputs[1], -1)
    right = right.astype(np.float32)
    assert w.check(right, inputs)[0]
    wrong = right.copy()
    wrong[3, 7] += 0.01
    ok, why = w.check(wrong, inputs)
    assert not ok and "max_rel_err" in why


def test_impossible_speeds_are_not_reported():
    rows = [
        Row("copy", 4096, 1024, "float32", "cpu", 880.0, 38.0, True),
        Row("ours", 4096, 1024, "float32", "cpu", 2000.0, 16.0, True),
        Row("torch", 4096, 1024, "float32", "cpu", 6.0, 5283.0, True),
    ]
    _flag_impossible(rows)
    assert rows[1].gbps == 16.0 and rows[2].gbps is None
    assert rows[2].note.startswith("unreliable")
    text = table(rows)
    assert "| float32 | 4096 x 1024 | 38 | 16 | ? | 42% | — |" in text


def test_device_timer_counts_overlapping_gpu_work_once():
    trace = {
        "traceEvents": [
            {"cat": "kernel", "ts": 0.0, "dur": 10.0},
            {"cat": "kernel", "ts": 5.0, "dur": 10.0},  # overlaps the first
            {"cat": "gpu_memset", "ts": 20.0, "dur": 1.0},
            {"cat": "gpu_memcpy", "ts": 30.0, "dur": 4.0},
            {"cat": "cpu_op", "ts": 0.0, "dur": 100.0},  # host work: not counted
            {"cat": "kernel", "ts": 40.0},  # no duration: not counted
        ]
    }
    spans = gpu_spans(trace)
    assert len(spans) == 4
    assert busy_seconds(spans) == 15.0 + 1.0 + 4.0


def test_timer_auto_is_wall_clock_without_a_gpu():
    assert resolve_timer("auto", "cpu") == "wall"
    with pytest.raises(SystemExit, match="needs a GPU"):
        resolve_timer("device", "cpu")


def test_cpu_sweep_checks_then_times_every_provider(tmp_path):
    """End to end on the CPU: every provider gets a row in the JSON; ours,
    SciPy and the copy pass the float64 check and are timed (a speed, or on
    a tiny case the "unreliable" note when T(K) <= T(1) by noise)."""
    import json

    from max_softmax.bench import main

    argv = ["--device", "cpu", "--dtype", "float32", "--shape", "8x1000"]
    assert main([*argv, "--reps", "3", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench_cpu.json").read_text())["results"]
    by = {r["provider"]: r for r in rows}
    assert {"ours", "max.ops.softmax", "scipy", "numpy", "copy"} <= set(by)
    for name in ("ours", "scipy", "copy"):
        row = by[name]
        assert not row["note"].startswith(("wrong", "error")), row
        assert (row["ok"] and row["gbps"] > 0) or row["note"].startswith("unreliable"), row
