"""Raw memory access numba cannot express: unaligned 8-byte loads and stores, and prefetches.

x86 is little-endian and allows unaligned access; callers guarantee the
bytes they name are inside the array.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I32 = ir.IntType(32)
_I64_PTR = ir.IntType(64).as_pointer()
_I8_PTR = ir.IntType(8).as_pointer()


def _byte_pointer(context, builder, sig, args):
    """Pointer to ``data[i]`` of a 1-d array argument ``data`` and index ``i`` (args 0 and 1)."""
    arr = context.make_array(sig.args[0])(context, builder, args[0])
    return builder.gep(arr.data, [context.cast(builder, args[1], sig.args[1], types.intp)])


@intrinsic
def load8(typingctx, data, i):
    """The 8 bytes at ``data[i:i+8]`` as one unaligned little-endian uint64 load."""
    def codegen(context, builder, sig, args):
        return builder.load(builder.bitcast(_byte_pointer(context, builder, sig, args), _I64_PTR), align=1)
    return types.uint64(data, i), codegen


@intrinsic
def store8(typingctx, data, i, word):
    """Write the 8 bytes of ``word`` (int64) at ``data[i:i+8]`` in one unaligned store."""
    def codegen(context, builder, sig, args):
        word = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store(word, builder.bitcast(_byte_pointer(context, builder, sig, args), _I64_PTR), align=1)
        return context.get_dummy_value()
    return types.void(data, i, word), codegen


def _prefetch(builder, pointer) -> None:
    """Emit a prefetch of the cache line holding ``pointer`` (read, keep in every level, data)."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [_I8_PTR, _I32, _I32, _I32]), "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(pointer, _I8_PTR), _I32(0), _I32(3), _I32(1)])


@intrinsic
def prefetch(typingctx, rows, b, i):
    """Ask for the cache line of row ``rows[b, i]`` of a 3-d array, without waiting for it.

    Unlike a load, a prefetch retires at once: a loop of them keeps as many
    misses in flight as the core has buffers for, where loads that miss fill
    the reorder buffer after a dozen or so.
    """
    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        arr = context.make_array(aryty)(context, builder, args[0])
        _prefetch(builder, cgutils.get_item_pointer(context, builder, aryty, arr,
                                                    [context.cast(builder, args[1], sig.args[1], types.intp),
                                                     context.cast(builder, args[2], sig.args[2], types.intp),
                                                     context.get_constant(types.intp, 0)]))
        return context.get_dummy_value()
    return types.void(rows, b, i), codegen


@intrinsic
def prefetch_item(typingctx, data, i):
    """Ask for the cache line of ``data[i]`` (a 1-d array), without waiting for it."""
    def codegen(context, builder, sig, args):
        _prefetch(builder, _byte_pointer(context, builder, sig, args))
        return context.get_dummy_value()
    return types.void(data, i), codegen


@intrinsic
def trailing_zeros(typingctx, word):
    """How many low bits of the uint64 ``word`` are 0 (64 for 0): one ``tzcnt``."""
    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, ir.IntType(1)]),
                                            "llvm.cttz.i64")
        return builder.call(fn, [args[0], ir.IntType(1)(0)])
    return types.uint64(word), codegen
