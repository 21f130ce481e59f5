"""The sweep: every provider at every shape and dtype, checked then timed.

On the CPU every provider of a shape is checked first, then those that
passed are timed together, round by round (a burst of noise hits them all).
On the GPU each is timed right after its check and then freed: all of them
at once would not fit at 8192 x 50257 with variants, and the device timer is
per provider anyway. An error in one provider becomes a note in its row.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..devices import resolve_device
from ..dtypes import DTYPE_NAMES
from . import ahead
from .measure import (
    Timed,
    check_provider,
    flag_impossible,
    measure_interleaved,
    release_torch_cache,
    summary,
    timed_row,
)
from .progress import progress, say
from .providers import Provider, is_max_graph, make_providers
from .workloads import (
    CROSS_ENTROPY_OPS,
    ISSUE_SHAPES_GPU,
    L2_BYTES,
    SHAPES_CPU,
    SHAPES_CROSS_ENTROPY_CPU,
    SHAPES_CROSS_ENTROPY_GPU,
    SWEEP_GPU,
    WORKLOADS,
    Row,
    Workload,
)


def default_shapes(kind: str, op: str = "softmax") -> list[tuple[int, int]]:
    """The shapes swept when `--shape` is not given (the cross_entropy ops:
    token batches against LLM vocabularies)."""
    if op in CROSS_ENTROPY_OPS:
        return list(SHAPES_CROSS_ENTROPY_GPU if kind == "gpu" else SHAPES_CROSS_ENTROPY_CPU)
    return ISSUE_SHAPES_GPU + SWEEP_GPU if kind == "gpu" else list(SHAPES_CPU)


def run_sweep(
    args: argparse.Namespace, save: Callable[[list[Row]], None] | None = None
) -> list[Row]:
    """Measure every provider at every shape and dtype; return the rows.

    `save` is called with the rows so far after each shape, so a sweep cut
    short (a time limit, Ctrl-C) still leaves its data."""
    kind = resolve_device(args.device)
    workload = WORKLOADS[args.op]
    shapes = args.shapes or default_shapes(kind, args.op)
    rng = np.random.default_rng(args.seed)
    results: list[Row] = []
    jobs = [(d, s) for d in args.dtype for s in shapes]
    prepare(kind, shapes, workload, args)
    say(f"{len(jobs)} case(s) on {kind}: each provider is checked against float64, then timed")
    with progress(len(jobs)) as bar:
        for dtype, (rows, n) in jobs:
            here = sweep_shape(kind, workload, dtype, rows, n, rng, args)
            timed = [r.gbps is not None for r in here]
            flag_impossible(here, workload.moves_less)
            for r, was in zip(here, timed, strict=True):
                if was and r.gbps is None:  # its progress line gave a figure: take it back
                    say(f"{dtype} {rows}x{n} {r.provider}: {summary(r)}")
            results.extend(here)
            bar.step(f"{dtype} {rows}x{n}")
            if save:
                save(results)
    return results


def prepare(
    kind: str, shapes: list[tuple[int, int]], workload: Workload, args: argparse.Namespace
) -> ahead.Plan:
    """Say what each provider compiles, then build all of it side by side
    (`ahead`), so that nothing compiles while anything is timed."""

    def factories(dtype: str) -> list[Callable[[], Provider]]:
        return make_providers(kind, dtype, args.variants, args.op, args.bridge, args.graph)

    todo = ahead.plan(kind, args.dtype, shapes, workload, args.max_k, factories)
    ahead.announce(todo)
    ahead.build_ahead(todo)
    return todo


def sweep_shape(
    kind: str,
    workload: Workload,
    dtype: str,
    rows: int,
    n: int,
    rng: np.random.Generator,
    args: argparse.Namespace,
) -> list[Row]:
    """Every provider's row at one shape and dtype."""
    nbytes = rows * n * DTYPE_NAMES[dtype].itemsize
    k = workload.rotations(nbytes, args.max_k)
    label = f"{dtype} {rows}x{n}"
    say(f"{label}: making {k} random input sets ({k * workload.arity * nbytes / 1e6:.0f} MB)")
    xs = input_sets(workload, rng, rows, n, dtype, k)
    base = Row("?", rows, n, dtype, kind)
    factories = make_providers(kind, dtype, args.variants, args.op, args.bridge, args.graph)
    case = Case(xs, workload, base, k, nbytes, args)
    return _together(factories, case) if kind == "cpu" else _each(factories, case)


def input_sets(
    workload: Workload, rng: np.random.Generator, rows: int, n: int, dtype: str, k: int
) -> list[tuple]:
    """K input sets of one shape. A set past the L2 (so no timing can find
    the last set's bytes cached) is drawn once and the others are its rows
    rotated: the same values at other addresses, for a second's copy where
    drawing 10 GB of backward inputs took a minute a set on the H100 host."""
    first = workload.make_inputs(rng, rows, n, dtype)
    if sum(a.nbytes for a in first) <= 2 * L2_BYTES or rows < k:
        return [first, *(workload.make_inputs(rng, rows, n, dtype) for _ in range(k - 1))]
    return [first, *(tuple(np.roll(a, i, axis=0) for a in first) for i in range(1, k))]


def _label(base: Row) -> str:
    return f"{base.dtype} {base.rows}x{base.n}"


def _error_row(name: str, base: Row, err: BaseException) -> Row:
    note = f"error: {type(err).__name__}: {str(err)[:160]}"
    return Row(name, base.rows, base.n, base.dtype, base.device, None, None, None, note)


def _checked(
    factory: Callable[[], Provider], xs: list, workload: Workload, base: Row
) -> tuple[Provider | None, Row]:
    """Make and check one provider: (it, its row so far); (None, its row) if
    it failed the check or could not run."""
    p = None
    try:
        p = factory()
        say(f"{_label(base)} {p.name}: checking against the float64 reference...")
        why = check_provider(p, xs, workload)
    except Exception as err:  # a peer that cannot run this case
        row = _error_row(getattr(p, "name", "?"), base, err)
        say(f"{_label(base)} {row.provider}: {row.note}")
        return None, row
    row = Row(p.name, base.rows, base.n, base.dtype, base.device, extra={"graph": p.graph})
    if why:
        row.ok, row.note = False, why
        say(f"{_label(base)} {p.name}: {why}")
        return None, row
    return p, row


class Case(NamedTuple):
    """One shape and dtype of the sweep: the K input sets and what timing them needs."""

    xs: list
    workload: Workload
    base: Row
    k: int
    nbytes: int
    args: argparse.Namespace


RETRIES = 2
"""Times a provider whose marginal figure came out unreliable (T(K) <= T(1),
noise on a small case) is measured again, with twice the rounds each time,
before its row says so."""


def retimed(providers: list[Provider], timed: list[Timed], case: Case) -> list[Timed]:
    """`timed` with each unreliable figure measured again (alone, RETRIES
    times at most, doubling the rounds), so that a headline cell is left
    "n/a (unreliable ...)" only when the noise persists."""
    out = list(timed)
    reps = case.args.reps
    for _ in range(RETRIES):
        again = [i for i, t in enumerate(out) if not t.ok]
        if not again:
            break
        reps *= 2
        names = ", ".join(providers[i].name for i in again)
        say(f"{_label(case.base)} {names}: T(K) <= T(1) (noise); timing again, {reps} rounds")
        for i, t in zip(again, measure_interleaved([providers[i] for i in again], case.k, reps)):
            out[i] = t
    return out


def _each(factories: list[Callable[[], Provider]], case: Case) -> list[Row]:
    """GPU: check and time one provider at a time, freeing each after. The
    MAX graphs go last: the device memory they free stays in MAX's pool, out
    of torch's and JAX's reach (at 8192 x 50257 the peers after them ran out
    of memory). The rows keep the factories' order."""
    xs, workload, base, k, nbytes, args = case
    out: dict[int, Row] = {}
    order = sorted(range(len(factories)), key=lambda i: is_max_graph(factories[i]))
    for i in order:
        factory = factories[i]
        p, row = _checked(factory, xs, workload, base)
        if p is not None:
            try:
                timed = retimed([p], measure_interleaved([p], k, args.reps), case)[0]
                row = timed_row(p, timed, row, k, nbytes, args)
            except Exception as err:
                row = _error_row(p.name, base, err)
            say(f"{_label(base)} {row.provider}: {summary(row)}")
        out[i] = row
        p = None
        release_torch_cache()
    return [out[i] for i in range(len(factories))]


def _together(factories: list[Callable[[], Provider]], case: Case) -> list[Row]:
    """CPU: check every provider, then time those that passed round by round."""
    xs, workload, base, k, nbytes, args = case
    out: list[Row] = []
    live: list[tuple[int, Provider]] = []
    for factory in factories:
        p, row = _checked(factory, xs, workload, base)
        if p is not None:
            live.append((len(out), p))
        out.append(row)
    if not live:
        return out
    say(f"{_label(base)}: timing {len(live)} providers together, {args.reps} rounds...")
    try:
        timed = measure_interleaved([p for _, p in live], k, args.reps)
        timed = retimed([p for _, p in live], timed, case)
    except Exception as err:  # as when each is timed alone: rows, no crash
        for i, p in live:
            out[i] = _error_row(p.name, base, err)
        return out
    for (i, p), t in zip(live, timed, strict=True):
        try:
            out[i] = timed_row(p, t, out[i], k, nbytes, args)
        except Exception as err:
            out[i] = _error_row(p.name, base, err)
        say(f"{_label(base)} {p.name}: {summary(out[i])}")
    release_torch_cache()
    return out
