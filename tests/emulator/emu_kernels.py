"""Small FlyDSL kernels the emulator tests compile and execute on CPU.

FlyDSL reads kernel source with inspect, so these live in a real module file.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

BLOCK = 256  # four waves of 64: the scheduler interleaves them


@flyc.kernel
def emu_axpy_kernel(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, block_dim: fx.Constexpr[int]):
    """c[i] = 2 * a[i] + b[i] through buffer loads and stores, one element per thread."""
    bid = fx.block_idx.x
    tid = fx.thread_idx.x
    a = fx.rocdl.make_buffer_tensor(a, max_size=False)
    b = fx.rocdl.make_buffer_tensor(b, max_size=False)
    c = fx.rocdl.make_buffer_tensor(c, max_size=False)
    ta = fx.slice(fx.logical_divide(a, fx.make_layout(block_dim, 1)), (None, bid))
    tb = fx.slice(fx.logical_divide(b, fx.make_layout(block_dim, 1)), (None, bid))
    tc = fx.slice(fx.logical_divide(c, fx.make_layout(block_dim, 1)), (None, bid))
    ta = fx.logical_divide(ta, fx.make_layout(1, 1))
    tb = fx.logical_divide(tb, fx.make_layout(1, 1))
    tc = fx.logical_divide(tc, fx.make_layout(1, 1))

    reg = fx.MemRefType.get(fx.T.f32, fx.LayoutType.get(1, 1), fx.AddressSpace.Register)
    copy = fx.make_copy_atom(fx.rocdl.BufferCopy32b(), fx.Float32)
    ra = fx.memref_alloca(reg, fx.make_layout(1, 1))
    rb = fx.memref_alloca(reg, fx.make_layout(1, 1))
    rc = fx.memref_alloca(reg, fx.make_layout(1, 1))
    fx.copy_atom_call(copy, fx.slice(ta, (None, tid)), ra)
    fx.copy_atom_call(copy, fx.slice(tb, (None, tid)), rb)
    va = fx.memref_load_vec(ra)
    fx.memref_store_vec(fx.arith.addf(fx.arith.addf(va, va), fx.memref_load_vec(rb)), rc)
    fx.copy_atom_call(copy, rc, fx.slice(tc, (None, tid)))


@flyc.jit
def emu_axpy(
    a: fx.Tensor,
    b: fx.Tensor,
    c: fx.Tensor,
    n: fx.Int32,
    stream: fx.Stream = fx.Stream(None),
):
    emu_axpy_kernel(a, b, c, BLOCK).launch(
        grid=((n + BLOCK - 1) // BLOCK, 1, 1), block=[BLOCK, 1, 1], stream=stream
    )


@flyc.kernel
def emu_lds_exchange_kernel(src: fx.Tensor, dst: fx.Tensor):
    """dst[t] = src[(t + 64) % BLOCK]: each thread stages its value in LDS, and after a barrier
    reads the slot a thread of the next wave staged (tests remove the barrier to seed a race)."""
    tid = fx.thread_idx.x
    slots = fx.SharedAllocator().allocate(fx.Array[fx.Float32, BLOCK, 16]).peek().ptr
    value = fx.ptr_load(fx.get_iter(src) + fx.Int64(tid), result_type=fx.Float32)
    fx.ptr_store(value, slots + tid)
    fx.barrier()
    other = fx.ptr_load(slots + (tid + 64) % BLOCK, result_type=fx.Float32)
    fx.ptr_store(other, fx.get_iter(dst) + fx.Int64(tid))


@flyc.jit
def emu_lds_exchange(src: fx.Tensor, dst: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    emu_lds_exchange_kernel(src, dst).launch(grid=(1, 1, 1), block=[BLOCK, 1, 1], stream=stream)
