"""Global atomics (global_atomic_*): read-modify-write at issue, each lane's update applied in
full even when several lanes of the wave name one address; with sc0 (glc before gfx940) the
pre-op value returns to VDST at the s_waitcnt vmcnt that retires it.

Rules: CDNA3/CDNA4 ISA, "Global Atomic Instructions" (DATA[31:0] is the new value and
DATA[63:32] the compare value of CMPSWAP; PK_ADD_BF16 adds each 16-bit half).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from aiter.emulator.decode import Instruction
from aiter.emulator.ops.numeric import bf16_to_f32, f32_to_bf16, pair, split
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.ops.vmem import global_addresses
from aiter.emulator.state import LANES, Pending, Wave

U32, U64 = np.uint32, np.uint64


def round_to_odd_f32(x: np.ndarray) -> np.ndarray:
    """f64 -> f32 rounded to odd (an inexact result gets an odd last bit), so that a later
    rounding to a narrower format rounds once."""
    f = x.astype(np.float32)
    inexact = (f.astype(np.float64) != x) & np.isfinite(f)
    even = (f.view(U32) & U32(1)) == 0
    toward = np.where(x > f, np.float32(np.inf), np.float32(-np.inf))
    return np.where(inexact & even, np.nextafter(f, toward), f)


def _sum_f64_to_odd(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b (f32 values) as f64 rounded to odd (TwoSum gives the rounding error)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    s = a + b
    back = s - a
    err = (a - (s - back)) + (b - back)
    even = (s.view(U64) & U64(1)) == 0
    toward = np.where(err > 0, np.inf, -np.inf)
    return np.where((err != 0) & even & np.isfinite(s), np.nextafter(s, toward), s)


def add_f32(old: np.ndarray, data: np.ndarray) -> np.ndarray:
    return (old.view(np.float32) + data.view(np.float32)).view(U32)


def pk_add_bf16(old: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Each bf16 half of old plus that of data, rounded once to nearest even."""
    out = np.zeros_like(old)
    for shift in (0, 16):
        a = bf16_to_f32((old >> U32(shift)) & U32(0xFFFF))
        b = bf16_to_f32((data >> U32(shift)) & U32(0xFFFF))
        with np.errstate(all="ignore"):
            total = round_to_odd_f32(_sum_f64_to_odd(a, b))
        out |= f32_to_bf16(total) << U32(shift)
    return out


def pk_add_f16(old: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Each f16 half of old plus that of data, rounded once to nearest even (the f64 sum of two
    f16 values is exact, and numpy rounds f64 to f16 directly)."""
    out = np.zeros_like(old)
    for shift in (0, 16):
        a = ((old >> U32(shift)) & U32(0xFFFF)).astype(np.uint16).view(np.float16)
        b = ((data >> U32(shift)) & U32(0xFFFF)).astype(np.uint16).view(np.float16)
        with np.errstate(all="ignore"):
            total = (a.astype(np.float64) + b.astype(np.float64)).astype(np.float16)
        out |= total.view(np.uint16).astype(U32) << U32(shift)
    return out


# name -> (bytes, fn(old, data) -> new); data of cmpswap carries {new, compare}.
Update = Callable[[np.ndarray, np.ndarray], np.ndarray]
_ATOMICS: dict[str, tuple[int, Update]] = {
    "add_f32": (4, add_f32),
    "pk_add_bf16": (4, pk_add_bf16),
    "pk_add_f16": (4, pk_add_f16),
    "add": (4, lambda old, d: old + d),
    "swap": (4, lambda old, d: d),
    "add_x2": (8, lambda old, d: old + d),
    "swap_x2": (8, lambda old, d: d),
}


def _words(raw: np.ndarray, nbytes: int) -> np.ndarray:
    """uint32 [dwords, n] -> one value per lane (uint32 or uint64)."""
    return raw[0] if nbytes == 4 else pair(raw)


def _apply_in_rounds(
    ctx: Ctx, addresses: np.ndarray, nbytes: int, update: Callable[[np.ndarray, np.ndarray], None]
) -> None:
    """Call update(lanes, old) for groups of lanes with distinct addresses, so that lanes
    sharing an address see each other's results (in lane order)."""
    pending = np.arange(addresses.size)
    while pending.size:
        _, first = np.unique(addresses[pending], return_index=True)
        lanes = pending[first]
        update(lanes, ctx.memory.read(addresses[lanes], nbytes))
        pending = np.setdiff1d(pending, lanes, assume_unique=True)


def _atomic(nbytes: int, fn: Update | None, compare: bool = False):
    dtype = U32 if nbytes == 4 else U64
    dwords = nbytes // 4

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        # gfx9 returns the old value with sc0 (glc); gfx12 with th:TH_ATOMIC_RETURN.
        returns = i.has("sc0") or i.has("glc") or "RETURN" in (i.mod("th") or "")
        first = 1 if returns else 0
        mask = w.exec_mask()
        addresses = global_addresses(w, i, first, first + 2, nbytes)[mask]
        raw = w.read_vector(i.operands[first + 1], 2 * dwords if compare else dwords)
        data = _words(raw[:dwords], nbytes)[mask]
        cmp = _words(raw[dwords:], nbytes)[mask] if compare else None
        old_all = np.zeros(addresses.size, dtype)

        def update(lanes: np.ndarray, old_bytes: np.ndarray) -> None:
            old = np.ascontiguousarray(old_bytes).view(dtype)[:, 0]
            if compare:
                new = np.where(old == cmp[lanes], data[lanes], old)
            else:
                with np.errstate(all="ignore"):
                    new = fn(old, data[lanes]).astype(dtype)
            old_all[lanes] = old
            ctx.memory.write(addresses[lanes], new.astype(dtype)[:, None].view(np.uint8))

        _apply_in_rounds(ctx, addresses, nbytes, update)
        ctx.counts["global_atomic_bytes"] = ctx.counts.get("global_atomic_bytes", 0) + (
            addresses.size * nbytes
        )
        if not returns:
            w.issue(Pending("store", pc=i.address))
            return
        values = np.zeros(LANES, dtype)
        values[mask] = old_all
        words = values[None, :] if nbytes == 4 else split(values)
        row = w.vrow(i.operands[0])

        def land() -> None:
            np.copyto(w.vgpr[row : row + dwords], words, where=mask)

        w.issue(Pending("load", vgprs=tuple(range(row, row + dwords)), apply=land, pc=i.address))

    return run


_MODS = ("offset", "scale_offset", "sc0", "sc1", "nt", "glc", "slc")
for _name, (_n, _fn) in _ATOMICS.items():
    op(f"global_atomic_{_name}", mods=_MODS)(_atomic(_n, _fn))
op("global_atomic_cmpswap", mods=_MODS)(_atomic(4, None, compare=True))
op("global_atomic_cmpswap_x2", mods=_MODS)(_atomic(8, None, compare=True))
