"""The strategies every op's rows can run under, the names `variant=`
gives them, and the one switch (`launch_strategy`) that serves both "auto"
and a forced variant for every op: forward, backward, cross-entropy and
masked.

An op's launch struct (`ForwardRows`, `BackwardRows` in dispatch.mojo,
`CERows` in gpu_cross_entropy.mojo, `MaskedRows` in gpu_masked_rows.mojo)
holds its buffers and dims and implements `RowStrategies`: its table
(`auto`, the shape's strategy) and one launch a strategy it has. The
variant is a compile-time parameter, so a forced variant compiles its own
strategy only. Replaced strategies are deleted, their measurements kept in
benchmarks/DECISIONS.md.
"""

from max.gpu.host import DeviceContext


@fieldwise_init
struct Strategy(Equatable, ImplicitlyCopyable):
    """How an op's rows are laid on the GPU: a kind of kernel and its
    form (for SMEM the blocks a row, C; for the forward's register plans
    whether a row takes at most a warp or 64-512 threads)."""

    var kind: Int
    """Which strategy: 0 register, 1 on chip, 2 split stream, 3 split, 4
    block, 5 strided; -1 none."""
    var form: Int
    """The strategy's form: blocks a row (on chip), register plans (0 any,
    1 at most a warp a row, 2 64-512 threads a row), else 0."""

    comptime REGISTER = Strategy(0, 0)
    """The row held in registers, 8-512 threads a row (register plans)."""
    comptime WARP = Strategy(0, 1)
    """The forward's register plans of at most a warp a row ("warp")."""
    comptime BLOCK_ROWS = Strategy(0, 2)
    """The forward's register plans of 64-512 threads a row ("block")."""
    comptime SMEM = Strategy(1, 1)
    """On chip, a block a row: read once."""
    comptime CLUSTER2 = Strategy(1, 2)
    """On chip, a cluster of two blocks a row, half each."""
    comptime CLUSTER4 = Strategy(1, 4)
    """On chip, a cluster of four blocks a row, a quarter each."""
    comptime SPLIT_STREAM = Strategy(2, 0)
    """Rows split across resident blocks streaming chunks: read once."""
    comptime SPLIT = Strategy(3, 0)
    """Rows split across blocks, re-read from L2 (any length)."""
    comptime BLOCK = Strategy(4, 0)
    """A block a row, online or re-reading the row (any length)."""
    comptime STRIDED = Strategy(5, 0)
    """A thread a column: rows along another axis (inner > 1)."""
    comptime NONE = Strategy(-1, 0)
    """No strategy: a name no op knows."""

    def __eq__(self, other: Self) -> Bool:
        """Same kind and form."""
        return self.kind == other.kind and self.form == other.form


comptime STRATEGIES = [
    Strategy.REGISTER,
    Strategy.WARP,
    Strategy.BLOCK_ROWS,
    Strategy.SMEM,
    Strategy.CLUSTER2,
    Strategy.CLUSTER4,
    Strategy.SPLIT_STREAM,
    Strategy.SPLIT,
    Strategy.BLOCK,
    Strategy.STRIDED,
]
"""Every strategy, in the order `launch_strategy` tries an "auto" choice."""


def strategy_named(name: StaticString) -> Strategy:
    """The strategy a variant name gives (every op but the forward, whose
    "warp" and "block" are its register plans: `ForwardRows.named`):
    "register", "smem", "cluster2" (or "pair"), "cluster4",
    "split_stream", "split", "block"; `Strategy.NONE` for another."""
    if name == "register":
        return Strategy.REGISTER
    if name == "smem":
        return Strategy.SMEM
    if name == "cluster2" or name == "pair":
        return Strategy.CLUSTER2
    if name == "cluster4":
        return Strategy.CLUSTER4
    if name == "split_stream":
        return Strategy.SPLIT_STREAM
    if name == "split":
        return Strategy.SPLIT
    if name == "block":
        return Strategy.BLOCK
    return Strategy.NONE


trait RowStrategies:
    """An op's contiguous rows with their buffers: its table and a launch
    for each strategy it has, for `launch_strategy`."""

    @staticmethod
    def op_name() -> String:
        """The op's name in error messages."""
        ...

    @staticmethod
    def has(s: Strategy) -> Bool:
        """Whether the op has strategy `s`."""
        ...

    @staticmethod
    def named(name: StaticString) -> Strategy:
        """The strategy `variant=name` forces (`strategy_named`), if the op
        has it, else `Strategy.NONE`."""
        var s = strategy_named(name)
        return s if Self.has(s) else Strategy.NONE

    def auto(self, ctx: DeviceContext) raises -> Strategy:
        """The strategy the op's table picks for these rows."""
        ...

    def launch[s: Strategy](self, ctx: DeviceContext) raises:
        """Enqueue the rows under strategy `s`; raises where `s` is not one
        of the op's or cannot take rows of this length."""
        ...


def no_strategy(op_name: String, variant: StaticString = "?") raises:
    """The error of an op asked for a strategy it does not have."""
    raise Error(
        "max_softmax: " + op_name + " has no variant '" + String(variant) + "'"
    )


def launch_strategy[
    L: RowStrategies, variant: StaticString
](op: L, ctx: DeviceContext) raises:
    """The one switch: launch `op` under the strategy `variant` names, or
    with "auto" the one its table picks. A forced variant compiles its
    strategy's kernels only; one the op lacks raises, as does a strategy
    that cannot take the rows (its launcher's error)."""
    comptime if variant == "auto":
        var s = op.auto(ctx)
        comptime for i in range(len(STRATEGIES)):
            comptime si = STRATEGIES[i]
            if s == si:
                op.launch[si](ctx)
                return
        no_strategy(L.op_name())
    else:
        comptime s = L.named(variant)
        comptime if s == Strategy.NONE:
            no_strategy(L.op_name(), variant)
        else:
            op.launch[s](ctx)
