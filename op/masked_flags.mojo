"""The masked ops' run-time flags (`masked_softmax_ops`).

A masked op's float64 `options` tensor holds the scale in options[0] and
carries its flags in its length: 1 + flags, with flags = MASK_FLAG (the mask
is read) | CAUSAL_FLAG (row i keeps columns j <= i). A tensor's shape is known
on the host for any device, while its values may live on the GPU, so the op
picks its compile-time-specialised kernels from the length without a host
sync (capture-safe), and one compiled model serves all four combinations.
The launch extension takes the same flags as an argument (its MASK_FLAG and
CAUSAL_FLAG); python/max_softmax/validation.masked_options builds the options.
"""

comptime MASK_FLAG = 1
"""The flags bit: the mask is read (else it is a placeholder)."""

comptime CAUSAL_FLAG = 2
"""The flags bit: row r = o * L + i keeps only columns j <= i."""

comptime FLAG_COMBINATIONS = 4
"""Flags take the values 0 ..< FLAG_COMBINATIONS."""


def masked_flags(n_options: Int) raises -> Int:
    """The flags a masked op's options of length `n_options` carry; raises
    for a length outside 1 ... FLAG_COMBINATIONS."""
    if n_options < 1 or n_options > FLAG_COMBINATIONS:
        raise Error(
            "max_softmax: a masked op's options must hold 1 to "
            + String(FLAG_COMBINATIONS)
            + " float64 values ((scale,) then one per flag value:"
            " 1 + MASK_FLAG | CAUSAL_FLAG), got "
            + String(n_options)
        )
    return n_options - 1
