"""The benchmark's own logic (no timing): its correctness gate, the table and
the guard against impossible numbers."""

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
