"""Shared fixtures: the devices to test on and a seeded random generator.

GPU cases share the CPU test bodies; they skip with a reason where MAX
finds no accelerator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

import max_softmax


def pytest_addoption(parser: pytest.Parser) -> None:
    """The test-only knobs (the user settings are environment variables:
    max_softmax.settings)."""
    group = parser.getgroup("max-softmax")
    group.addoption(
        "--quick",
        action="store_true",
        help="run only the quick subset (tests marked `quick`, QUICK below)",
    )
    group.addoption(
        "--fuzz-examples",
        type=int,
        default=None,
        help="hypothesis examples per fuzz test, drawn anew (default: 15, the same every run)",
    )
    group.addoption("--big", action="store_true", help="run the tests marked `big` (~20 GB of RAM)")
    group.addoption(
        "--nccl",
        action="store_true",
        help="run tests/test_parallel.py over NCCL, one GPU a process (2, 3 and 4), "
        "instead of gloo on the CPU",
    )


QUICK: dict[str, tuple[str, ...]] = {
    "test_values.py": (
        "test_matches_scipy",
        "test_properties",
        "test_16bit_softmax_within_one_ulp",
        "test_non_contiguous_input",
    ),
    "test_backward.py": (
        "test_matches_formula",
        "test_properties",
        "test_special_rows",
        "test_dy_mismatch_is_a_clear_error",
    ),
    "test_cross_entropy.py": (
        "test_special_rows",
        "test_argument_errors",
        "test_out_of_range_target_is_a_clear_error",
        "test_empty_batch",
        "test_torch_matches_f_cross_entropy",
    ),
    "test_masked_softmax.py": ("test_errors", "test_fully_masked_rows"),
    "test_edge_cases.py": ("test_empty", "test_dtype_extremes"),
    "test_errors.py": (
        "test_axis_not_int",
        "test_axis_out_of_range",
        "test_big_endian_input",
        "test_gpu_requested_without_gpu",
        "test_non_float_dtype",
        "test_rank_zero",
        "test_unknown_device",
        "test_unknown_variant",
    ),
    "test_eager.py": ("test_eager_errors",),
    "test_graph.py": ("test_matmul_softmax_matmul",),
    "test_torch.py": ("test_values_and_gradients_match_torch", "test_bad_dtype"),
    "test_torch_launch.py": (
        "test_forward_matches_torch",
        "test_backward_matches_torch",
        "test_errors_surface_as_exceptions",
        "test_empty_does_nothing",
    ),
    "test_fuzz.py": ("test_fuzz_against_scipy",),
    "test_cli.py": ("test_bad_input_exit_status", "test_help_lists_subcommands"),
    "test_bench.py": (
        "test_markdown_starts_with_a_title_and_the_run_as_bullets",
        "test_table_footnotes_say_why_a_cell_is_empty",
        "test_rows_of_older_files_still_load",
        "test_record_appends_one_json_line_per_row_with_the_run",
    ),
    "test_registry.py": ("test_unknown_op", "test_every_op_and_its_twin_is_registered_in_mojo"),
    "test_readme.py": ("test_the_readme_has_examples",),
    "test_replay.py": ("test_cpu_has_no_device_graphs",),
    "test_torch_replay.py": ("test_declines_twice_captures_third_replays_after",),
    "test_waits.py": (
        "test_estimate_stretches_with_the_tasks_competing_for_the_cpu",
        "test_model_compile_announced_before_and_after",
        "test_user_graph_announced_once",
        "test_warmup_builds_what_it_lists",
    ),
}
"""The quick subset: test file -> the test functions (every parametrization)
that `--quick` runs: every op and front door on the CPU, through the launch
extension where it serves them, and only three graph compiles (a user's
graph, the masked softmax and log-softmax models), since a change to op/
makes every model compile again (~15 s each on 2 cores)."""


def pytest_configure(config: pytest.Config) -> None:
    """Load the fuzz tests' hypothesis profile (from --fuzz-examples)."""
    from hypothesis import settings

    examples = config.getoption("fuzz_examples")
    settings.register_profile(
        "max_softmax", max_examples=examples or 15, derandomize=examples is None
    )
    settings.load_profile("max_softmax")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the QUICK tests `quick` (and keep only them under --quick); skip
    the `big` tests unless --big."""
    quick = pytest.mark.quick
    for item in items:
        if getattr(item, "originalname", None) in QUICK.get(item.path.name, ()):
            item.add_marker(quick)
    if config.getoption("quick"):
        keep, drop = [], []
        for item in items:
            (keep if item.get_closest_marker("quick") else drop).append(item)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if not config.getoption("big"):
        skip = pytest.mark.skip(reason="needs ~20 GB of RAM: pytest --big")
        for item in items:
            if item.get_closest_marker("big"):
                item.add_marker(skip)


GPU_SKIP = pytest.mark.skipif(
    not max_softmax.gpu_available(),
    reason="no GPU: MAX finds no accelerator on this machine",
)

DEVICES = ["cpu", pytest.param("gpu", marks=GPU_SKIP)]
DTYPES = ["float32", "float16", "bfloat16", "float64"]


@pytest.fixture
def rng() -> np.random.Generator:
    """A generator seeded per test, so failures reproduce."""
    return np.random.default_rng(1234)


@pytest.fixture(params=["launch", "graph"])
def array_path(request, monkeypatch) -> str:
    """Run a test's CPU array calls through the launch extension (the
    default) and again through `Model.execute` of the compiled models."""
    from max_softmax import launch

    if request.param == "graph":
        monkeypatch.setattr(launch, "ENABLED", False)
    return request.param


def random_logits(rng: np.random.Generator, shape, dtype, scale: float = 4.0):
    """Fresh random logits (never zeros) of `shape` in numpy dtype `dtype`."""
    from max_softmax.dtypes import DTYPE_NAMES

    return (rng.standard_normal(shape) * scale).astype(DTYPE_NAMES[dtype])


def assert_matches_scipy(op: str, got, x, axis: int) -> None:
    """Fail with the error figures if `got` is off the float64 reference."""
    from max_softmax.reference import compare

    assert got.shape == x.shape and got.dtype == x.dtype
    c = compare(op, got, x, axis)
    assert c.ok, (
        f"{op} {x.dtype} {x.shape} axis={axis}: max_abs_err={c.max_abs_err:.3g} "
        f"max_rel_err={c.max_rel_err:.3g} nan_mismatches={c.nan_mismatches} "
        f"(rtol={c.rtol}, atol={c.atol})"
    )


def run_in_threads(worker: Callable[[int], None], count: int) -> None:
    """Run worker(0) ... worker(count - 1) on as many threads at once; fail
    with the first error any of them raised."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            worker(i)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
