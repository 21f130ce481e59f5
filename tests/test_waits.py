"""Waits announced truly: a notice with an estimate before each build, one
with the real time after, once per user graph; `softmax warmup` builds what
it lists; MAX_SOFTMAX_QUIET silences the notices."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import scipy.special
from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType, ops

import max_softmax
from max_softmax import kernels, launch, models, waits
from max_softmax.cli import main

BEFORE = re.compile(r"^max-softmax: (.+) \(first use, ~(\d+) (s|min); then cached\)$")
AFTER = re.compile(r"^max-softmax: (.+) in (\d+\.\d) s$")


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("max-softmax:")]


@pytest.fixture(autouse=True)
def loud(monkeypatch) -> None:
    """The notices on, whatever the environment says (`quiet` turns them off)."""
    monkeypatch.setenv("MAX_SOFTMAX_QUIET", "0")


@pytest.fixture(params=["loud", "quiet"])
def quiet(request, monkeypatch) -> bool:
    """Run a test with the notices on, and again with MAX_SOFTMAX_QUIET=1."""
    monkeypatch.setenv("MAX_SOFTMAX_QUIET", "1" if request.param == "quiet" else "0")
    return request.param == "quiet"


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
    """An empty max-softmax cache: nothing built, no model marked compiled."""
    monkeypatch.setenv("MAX_SOFTMAX_CACHE", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("kind", sorted(waits.BUILDS))
def test_every_build_kind_is_measured(kind):
    build = waits.BUILDS[kind]
    assert build.seconds > 0 and build.cores > 0 and build.machine and build.measured_by
    assert waits.estimate(kind) >= build.seconds  # a busy CPU only stretches it


@pytest.mark.parametrize(
    ("others", "cores", "factor"),
    [(0.0, 2, 1.0), (1.0, 2, 1.0), (3.0, 2, 2.0), (7.0, 2, 4.0), (3.0, 16, 1.0)],
)
def test_estimate_stretches_with_the_tasks_competing_for_the_cpu(
    monkeypatch, others, cores, factor
):
    monkeypatch.setattr(waits, "_others_running", lambda: others)
    monkeypatch.setattr(waits, "_cores", lambda: cores)
    assert waits.busy_factor(1.0) == factor
    assert waits.estimate("model:cpu") == pytest.approx(waits.BUILDS["model:cpu"].seconds * factor)


@pytest.mark.parametrize(
    ("seconds", "text"), [(4.6, "~5 s"), (16.2, "~16 s"), (34.0, "~34 s"), (150.0, "~2 min")]
)
def test_estimate_text(seconds, text):
    assert waits._seconds(seconds) == text


def _assert_announced(err: str, doing: str, quiet: bool) -> float:
    """The notices in `err`: a "before" line for `doing` then an "after"
    line with a time; none when quiet. Returns the time printed."""
    lines = _lines(err)
    if quiet:
        assert lines == []
        return 0.0
    assert len(lines) == 2, lines
    before, after = BEFORE.match(lines[0]), AFTER.match(lines[1])
    assert before and before.group(1) == doing, lines
    assert after, lines
    return float(after.group(2))


def _plain_graph(name: str, add: float) -> Graph:
    """A graph of MAX's own ops (no kernel library: nothing to precompile
    into the empty cache), quick to compile."""
    t = TensorType(DType.float32, ["n"], DeviceRef.CPU())
    with Graph(name, input_types=[t]) as g:
        g.output(g.inputs[0].tensor + add)
    return g


@pytest.mark.parametrize("device", ["cpu"])
def test_model_compile_announced_before_and_after(fresh_cache, quiet, device, capsys):
    """A model whose compile this cache has not seen: the notice comes
    before the compile starts and the real time after it ends."""
    seen_at_build: list[str] = []

    def build() -> Graph:
        seen_at_build.append(capsys.readouterr().err)  # printed before the compile?
        return _plain_graph("waits_test_add_one", 1.0)

    key = ("waits-test", "add_one", device, quiet)
    model = models.compiled(key, device, build, "a test graph")
    assert model is not None and len(seen_at_build) == 1
    err = seen_at_build[0] + capsys.readouterr().err
    _assert_announced(err, f"compiling a test graph for {device}", quiet)
    if not quiet:
        assert len(_lines(seen_at_build[0])) == 1  # only "before" when the build ran
    assert models.compile_marker(key).is_file()


@pytest.mark.parametrize("cost", ["model", "train_step"])
def test_model_estimate_is_its_kind_of_build(fresh_cache, cost, capsys):
    """A graph that costs MAX more than our ops (the training step's
    matmuls) is announced with its own measured estimate, not a model's."""
    key = ("waits-test", "cost", cost)
    models.compiled(key, "cpu", lambda: _plain_graph("waits_test_add_one", 1.0), "a test", cost)
    before = BEFORE.match(_lines(capsys.readouterr().err)[0])
    assert before
    seconds = float(before.group(2)) * (60 if before.group(3) == "min" else 1)
    assert seconds >= 0.75 * waits.BUILDS[f"{cost}:cpu"].seconds  # rounding to minutes


def test_compiled_model_is_not_announced_again(fresh_cache, capsys):
    """Once marked compiled (MAX's cache serves it in ~2 s), a model loads
    without a notice, in this process or another."""
    key = ("waits-test", "marked")
    marker = models.compile_marker(key)
    marker.parent.mkdir(parents=True)
    marker.touch()
    models.compiled(key, "cpu", lambda: _plain_graph("waits_test_add_one", 1.0), "a test graph")
    assert _lines(capsys.readouterr().err) == []


def test_precompile_announced_before_and_after(fresh_cache, monkeypatch, capsys):
    """The kernel library's precompile into an empty cache (~5 s): the
    notice before the compiler runs, the real time after; the library is
    then the cached file."""
    seen = []
    real = kernels.build_into

    def spy(*args, **kwargs):
        seen.append(capsys.readouterr().err)
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "build_into", spy)
    monkeypatch.setenv("MAX_SOFTMAX_PRECOMPILE", "1")
    path = kernels.kernel_library()
    assert path.is_file() and path.parent == fresh_cache
    err = seen[0] + capsys.readouterr().err
    seconds = _assert_announced(err, "precompiling the kernel library", quiet=False)
    assert len(_lines(seen[0])) == 1 and seconds > 0


def _user_graph(name: str) -> Graph:
    t = TensorType(DType.float32, ["batch", 16], DeviceRef.CPU())
    with Graph(name, input_types=[t], custom_extensions=[max_softmax.KERNELS]) as g:
        x = g.inputs[0].tensor
        y = max_softmax.ops.softmax(x, axis=-1)
        g.output(max_softmax.ops.log_softmax(ops.add(y, x), axis=-1))  # a second op: no 2nd line
    return g


def test_user_graph_announced_once(quiet, capsys):
    max_softmax.KERNELS  # noqa: B018 - built before the capture, as for any user
    capsys.readouterr()
    _user_graph("waits_user_graph")
    lines = _lines(capsys.readouterr().err)
    if quiet:
        assert lines == []
        return
    assert len(lines) == 1, lines
    assert "graph 'waits_user_graph' holds max-softmax ops" in lines[0]
    assert re.search(
        r"InferenceSession\.load .* compiles them \(~\d+ (s|min)\) and its other ops", lines[0]
    )


def test_our_own_graphs_are_not_announced_as_users(capsys):
    max_softmax.KERNELS  # noqa: B018
    capsys.readouterr()
    models.build_graph(
        "waits_ours",
        [models.row_type(DType.float32, "cpu")],
        lambda x: [max_softmax.ops.softmax(x, axis=1)],
    )
    assert _lines(capsys.readouterr().err) == []


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_warmup_builds_what_it_lists(op, capsys):
    """`softmax warmup` (warm caches: fast) lists the library, the extension
    and the model it made ready, and each is there: the files exist, the
    model is compiled in this process and marked compiled on disk."""
    assert main(["warmup", "--device", "cpu", "--op", op, "--dtype", "float32"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    library, extension, model = rows
    assert library[:2] == ["kernel", "library"] and Path(library[-1]).is_file()
    assert Path(library[-1]) == kernels.kernel_library()
    assert extension[:2] == ["launch", "extension"] and Path(extension[-1]).is_file()
    assert Path(extension[-1]) == launch.extension_path()
    assert model[:3] == ["model", op, "float32"] and model[-1] == "cpu"
    key = models.ModelKey(op, DType.float32, "cpu")
    assert key in models._models and models.compile_marker(key).is_file()


def test_warmup_without_models(capsys):
    assert main(["warmup", "--device", "cpu", "--op"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [
        "kernel",
        "launch",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "gpu"], "no accelerator"),
        (["--device", "cpu", "--op", "cross_entropy"], "invalid choice"),
        (["--device", "cpu", "--dtype", "int8"], "invalid choice"),
    ],
)
def test_warmup_refuses_clearly(argv, message, capsys):
    if argv[1] == "gpu" and max_softmax.gpu_available():
        pytest.skip("this machine has a GPU")
    try:
        code = main(["warmup", *argv])
    except SystemExit as exit:  # argparse's own refusal
        code = exit.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_help_lists_warmup(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "softmax warmup" in capsys.readouterr().out


def test_first_eager_call_announced_once(tmp_path, monkeypatch, quiet, capsys):
    """A MAX eager op's first realization in a process, where this machine
    never compiled its chain, is announced before and after; the next call
    is not."""
    from max.experimental.tensor import Tensor

    from max_softmax import eager

    monkeypatch.setattr(eager, "_compiled", set())
    monkeypatch.setattr(eager, "compile_marker", lambda key: tmp_path / str(abs(hash(key))))
    x = Tensor(np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32))
    max_softmax.KERNELS  # noqa: B018 - built before the capture
    capsys.readouterr()
    max_softmax.softmax(x)
    _assert_announced(
        capsys.readouterr().err, "compiling softmax float32 for MAX eager on cpu", quiet
    )
    max_softmax.softmax(x)
    assert _lines(capsys.readouterr().err) == []


def test_user_graph_first_load_says_how_long(quiet, capsys):
    """The first InferenceSession.load of a user's graph that holds our ops
    (MAX compiles them inside it) prints the time it took, once; a second
    load of the same graph, and other graphs' loads, print nothing."""
    max_softmax.KERNELS  # noqa: B018
    graph = _user_graph("waits_user_load")
    capsys.readouterr()
    session = InferenceSession(devices=[CPU()])
    model = session.load(graph, custom_extensions=[max_softmax.KERNELS])
    lines = _lines(capsys.readouterr().err)
    if quiet:
        assert lines == []
    else:
        assert len(lines) == 1, lines
        assert re.search(r"graph 'waits_user_load' loaded in \d+\.\d s", lines[0])
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    got = model.execute(Buffer.from_numpy(x))[0].to_numpy()
    y = scipy.special.softmax(x, axis=-1)
    np.testing.assert_allclose(got, scipy.special.log_softmax(y + x, axis=-1), rtol=1e-5, atol=1e-6)
    session.load(graph, custom_extensions=[max_softmax.KERNELS])
    assert _lines(capsys.readouterr().err) == []
