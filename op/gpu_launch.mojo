"""Launch arguments every GPU family shares: whether 16-byte vector loads
are safe, and kernel arguments passed as one struct.

A torch view may start anywhere, so the launchers check the buffers'
addresses at run time and pass the answer to the kernels as an Int32 flag
(Bool is not DevicePassable). Pointers held in structs: `HeldRows` (the
row structs' fields, on the GPU and the CPU) and `GlobalRows` (a kernel
argument struct's, `KernelArgs`: typed global on the host by `to_global`,
taken out in the kernel by `in_global`, so loads stay `ld.global`).
"""

from max.gpu.memory import AddressSpace
from std.builtin.device_passable import DevicePassable, DeviceTypeEncoder


def aligned16(a: Int, b: Int, c: Int = 0) -> Bool:
    """Whether every address given is 16-byte aligned: vector loads need it,
    and a torch view may start anywhere."""
    return (a | b | c) % 16 == 0


def aligned_flag_of(aligned: Bool) -> Int32:
    """1 where the buffers start 16-byte aligned, else 0: kernels that find
    each row's aligned body themselves take this."""
    return Int32(1) if aligned else Int32(0)


def vector_flag_of(aligned: Bool, n: Int, V: Int) -> Int32:
    """1 where every row starts 16-byte aligned (buffers aligned, n % V ==
    0), else 0: kernels that load whole rows in vectors or not at all take
    this."""
    return Int32(1) if aligned and n % V == 0 else Int32(0)


# A struct that carries a kernel's arguments to where it is enqueued (see
# `RegisterPlanKernel`) may not hold MutAnyOrigin pointers: it holds them
# untracked (the buffers outlive the launch) and gives them back as they
# were.
comptime HeldRows[dtype: DType] = Pointer[Scalar[dtype], MutUntrackedOrigin]


def held[
    dtype: DType
](p: Pointer[Scalar[dtype], MutAnyOrigin]) -> HeldRows[dtype]:
    """`p` as a struct field may hold it."""
    return rebind[HeldRows[dtype]](p)


def kernel_arg[
    dtype: DType
](p: HeldRows[dtype]) -> Pointer[Scalar[dtype], MutAnyOrigin]:
    """A held pointer as the kernels take it."""
    return rebind[Pointer[Scalar[dtype], MutAnyOrigin]](p)


# Kernel arguments passed as one struct (`SoftRowsArgs`, `CEArgs`): a
# by-value struct's generic pointer fields lose the global marking of the
# kernel's parameters (every `ld.global` / `st.global` becomes a generic
# `ld` / `st`), and a cast to GLOBAL and back inside the kernel folds away.
# So the fields are typed GLOBAL (`to_global`, on the host) and a kernel
# casts each once to GENERIC (`in_global`): with the fields in the order
# separate parameters would take, the SASS is theirs (docs/MOJO_NOTES.md).
comptime GlobalRows[dtype: DType] = Pointer[
    Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.GLOBAL
]
"""Rows in global memory, as an argument struct holds them."""


@always_inline
def to_global[dtype: DType](p: HeldRows[dtype]) -> GlobalRows[dtype]:
    """`p` (a device buffer's address) typed as global memory, as an
    argument struct holds it."""
    return p.unsafe_address_space_cast[AddressSpace.GLOBAL]()


@always_inline
def in_global[
    dtype: DType
](p: GlobalRows[dtype]) -> Pointer[Scalar[dtype], MutAnyOrigin]:
    """A global pointer a kernel took inside its argument struct, as the
    kernels take pointers (generic): LLVM infers the global address space
    back from the cast, so its loads and stores stay `ld.global` /
    `st.global`."""
    return kernel_arg(p.unsafe_address_space_cast[AddressSpace.GENERIC]())


trait KernelArgs(DevicePassable, TrivialRegisterPassable):
    """A struct of a kernel's arguments passed as one by value (its
    pointers `GlobalRows`): it is its own device type, copied as it is."""

    def _to_device_type(
        self, mut encoder: Some[DeviceTypeEncoder], target: MutOpaquePointer[_]
    ):
        """Copy the struct to the kernel's argument."""
        encoder.encode(self, target)
