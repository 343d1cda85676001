"""Index math of moe_quant_per_token, shared by the kernel and its CPU emulation.

One block of THREADS threads quantizes one row of K elements. Thread t holds the row's
elements in `chunks` runs of VEC (16 bytes of a 16-bit activation): run c covers elements
c * ROW_STEP + t * VEC ... + VEC - 1, so a wave's loads of a run are one contiguous span. The
whole row stays in registers: every load is issued before the first wait, x is read once and
q written once (3 bytes of traffic per element, the least there is).

The row maximum of |x|: each thread's maximum over its runs, then the wave's by xor shuffles
(offsets wave_size / 2 ... 1), then the block's from one LDS word per wave. scale =
max(amax, SCALE_FLOOR) / fp8_max (torch.finfo of the arch's fp8) and q = x / scale rounded to
the arch's fp8, the torch reference's arithmetic step by step (an fp32 division, not a multiply
by a reciprocal).
"""

from __future__ import annotations

THREADS = 256
VEC = 8  # elements per 16-byte load of a bf16 / fp16 activation
ROW_STEP = THREADS * VEC  # elements a block's run covers
MAX_CHUNKS = 8  # runs per thread: the row's fp32 values take 8 VGPRs per run
MAX_K = MAX_CHUNKS * ROW_STEP
K_MULTIPLE = VEC  # a run is wholly inside the row or wholly past it
SCALE_FLOOR = 1e-10  # the scale of a row of zeros is SCALE_FLOOR / fp8_max


def chunks_for(k: int) -> int:
    """Runs per thread for a row of k elements (a compile-time parameter of the kernel)."""
    return -(-k // ROW_STEP)


def run_start(chunk, tid):
    """The row element where thread tid's run `chunk` starts."""
    return chunk * ROW_STEP + tid * VEC


def xor_offsets(wave_size: int) -> list[int]:
    """Shuffle offsets of a butterfly reduction over a wave: every lane ends with the whole."""
    offsets, step = [], wave_size // 2
    while step:
        offsets.append(step)
        step //= 2
    return offsets


def waves_per_block(wave_size: int) -> int:
    return THREADS // wave_size
