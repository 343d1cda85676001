"""LDS semantics (ds_*) on the work-group's local data share: reads land at the s_waitcnt
lgkmcnt that retires them, writes happen at issue; sub-dword forms touch only their bytes.

An address outside the work-group's allocation raises MemoryFault instead of the hardware's
silent zero/drop, because a FlyDSL kernel that reaches it has a bug.
"""

from __future__ import annotations

import numpy as np

from aiter.emulator.banks import banks_of, conflict_cycles
from aiter.emulator.decode import Instruction
from aiter.emulator.errors import MemoryFault
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.state import LANES, Pending, Wave

U32 = np.uint32


def _check(ctx: Ctx, addresses: np.ndarray, nbytes: int) -> None:
    size = ctx.group.lds.size
    bad = (addresses < 0) | (addresses + nbytes > size)
    if bad.any():
        raise MemoryFault(
            f"LDS access of {nbytes} bytes at {int(addresses[bad][0])} is outside the "
            f"work-group's {size} bytes of LDS"
        )


def lds_read(ctx: Ctx, addresses: np.ndarray, nbytes: int, w: Wave | None = None, pc: int = 0):
    """uint8 [n, nbytes] at each LDS byte address (w, pc: the access, for the race check)."""
    _check(ctx, addresses, nbytes)
    spans = addresses[:, None] + np.arange(nbytes)[None, :]
    _track(ctx, spans, w, pc, False)
    return ctx.group.lds[spans]


def lds_write(
    ctx: Ctx, addresses: np.ndarray, data: np.ndarray, w: Wave | None = None, pc: int = 0
) -> None:
    _check(ctx, addresses, data.shape[1])
    spans = addresses[:, None] + np.arange(data.shape[1])[None, :]
    _track(ctx, spans, w, pc, True)
    ctx.group.lds[spans] = data


def _track(ctx: Ctx, spans: np.ndarray, w: Wave | None, pc: int, write: bool) -> None:
    tracker = ctx.group.lds_races
    if tracker is not None and w is not None:
        tracker.access(spans, w.index, pc, ctx.group.epoch, write)


def _base(w: Wave, i: Instruction) -> np.ndarray:
    return w.read_vector(i.operands[1 if _is_read(i) else 0])[0].astype(np.int64)


def _is_read(i: Instruction) -> bool:
    return i.mnemonic.startswith(("ds_read", "ds_load", "ds_swizzle", "ds_bpermute"))


def _pending(w: Wave, i: Instruction, values: np.ndarray, mask: np.ndarray, half=None) -> None:
    """Land uint32 [dwords, 64] in the destination VGPRs when lgkmcnt retires the read."""
    row = w.vrow(i.operands[0])
    values = np.asarray(values, U32)

    def apply() -> None:
        if half is None:
            np.copyto(w.vgpr[row : row + values.shape[0]], values, where=mask)
            return
        old = w.vgpr[row]
        if half == "lo":
            new = (old & U32(0xFFFF0000)) | (values[0] & U32(0xFFFF))
        else:
            new = (old & U32(0xFFFF)) | ((values[0] & U32(0xFFFF)) << U32(16))
        np.copyto(w.vgpr[row], new, where=mask)

    rows = tuple(range(row, row + values.shape[0]))
    w.issue(Pending("ds", vgprs=rows, apply=apply, pc=i.address))


def _as_dwords(data: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(data).view("<u4").T


def _read(nbytes: int, signed: bool = False, half: str | None = None):
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        mask = w.exec_mask()
        addr = _base(w, i) + i.mod_int("offset")
        data = np.zeros((LANES, nbytes), np.uint8)
        data[mask] = lds_read(ctx, addr[mask], nbytes, w, i.address)
        _banks(ctx, addr[mask], nbytes)
        if nbytes >= 4:
            values = _as_dwords(data)
        else:
            raw = data.view("<u1" if nbytes == 1 else "<u2")[:, 0].astype(np.int64)
            if signed:
                raw = np.where(raw >> (8 * nbytes - 1), raw - (1 << (8 * nbytes)), raw)
            values = raw.astype(np.int64).astype(U32)[None, :]
        _pending(w, i, values, mask, half)
        _count(ctx, "lds_read_bytes", int(mask.sum()) * nbytes)

    return run


def _write(nbytes: int, hi: bool = False):
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        mask = w.exec_mask()
        addr = _base(w, i) + i.mod_int("offset")
        raw = w.read_vector(i.operands[1], max(1, nbytes // 4))
        if hi:
            raw = raw >> U32(16)
        data = np.ascontiguousarray(raw.T).view(np.uint8)[:, :nbytes]
        lds_write(ctx, addr[mask], data[mask], w, i.address)
        _banks(ctx, addr[mask], nbytes)
        # An LDS write counts toward lgkmcnt until it completes, like a read.
        w.issue(Pending("ds", pc=i.address))
        _count(ctx, "lds_write_bytes", int(mask.sum()) * nbytes)

    return run


def _read2(nbytes: int, stride64: bool):
    """ds_read2*: two elements at offset0 and offset1, in units of the element size (x64 for
    the st64 forms) (CDNA3 ISA, "LDS Instructions")."""
    scale = nbytes * (64 if stride64 else 1)

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        mask = w.exec_mask()
        base = _base(w, i)
        data = np.zeros((LANES, 2 * nbytes), np.uint8)
        for k, name in enumerate(("offset0", "offset1")):
            addr = base + scale * i.mod_int(name)
            data[mask, k * nbytes : (k + 1) * nbytes] = lds_read(
                ctx, addr[mask], nbytes, w, i.address
            )
            _banks(ctx, addr[mask], nbytes)
        _pending(w, i, _as_dwords(data), mask)
        _count(ctx, "lds_read_bytes", int(mask.sum()) * 2 * nbytes)

    return run


def _write2(nbytes: int, stride64: bool):
    scale = nbytes * (64 if stride64 else 1)
    dwords = nbytes // 4

    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        mask = w.exec_mask()
        base = _base(w, i)
        for k, name in enumerate(("offset0", "offset1")):
            raw = w.read_vector(i.operands[1 + k], dwords)
            data = np.ascontiguousarray(raw.T).view(np.uint8)
            addr = base + scale * i.mod_int(name)
            lds_write(ctx, addr[mask], data[mask], w, i.address)
            _banks(ctx, addr[mask], nbytes)
        w.issue(Pending("ds", pc=i.address))
        _count(ctx, "lds_write_bytes", int(mask.sum()) * 2 * nbytes)

    return run


_MODS = ("offset", "gds")
for _bits, _n in ((32, 4), (64, 8), (96, 12), (128, 16)):
    op(f"ds_read_b{_bits}", mods=_MODS)(_read(_n))
    op(f"ds_write_b{_bits}", mods=_MODS)(_write(_n))
op("ds_read_u8", mods=_MODS)(_read(1))
op("ds_read_i8", mods=_MODS)(_read(1, signed=True))
op("ds_read_u16", mods=_MODS)(_read(2))
op("ds_read_i16", mods=_MODS)(_read(2, signed=True))
op("ds_read_u8_d16", mods=_MODS)(_read(1, half="lo"))
op("ds_read_u8_d16_hi", mods=_MODS)(_read(1, half="hi"))
op("ds_read_i8_d16", mods=_MODS)(_read(1, signed=True, half="lo"))
op("ds_read_i8_d16_hi", mods=_MODS)(_read(1, signed=True, half="hi"))
op("ds_read_u16_d16", mods=_MODS)(_read(2, half="lo"))
op("ds_read_u16_d16_hi", mods=_MODS)(_read(2, half="hi"))
op("ds_write_b8", mods=_MODS)(_write(1))
op("ds_write_b16", mods=_MODS)(_write(2))
op("ds_write_b8_d16_hi", mods=_MODS)(_write(1, hi=True))
op("ds_write_b16_d16_hi", mods=_MODS)(_write(2, hi=True))
_MODS2 = ("offset0", "offset1", "gds")
for _bits, _n in ((32, 4), (64, 8)):
    op(f"ds_read2_b{_bits}", mods=_MODS2)(_read2(_n, False))
    op(f"ds_read2st64_b{_bits}", mods=_MODS2)(_read2(_n, True))
    op(f"ds_write2_b{_bits}", mods=_MODS2)(_write2(_n, False))
    op(f"ds_write2st64_b{_bits}", mods=_MODS2)(_write2(_n, True))


def _count(ctx: Ctx, key: str, value: int) -> None:
    ctx.counts[key] = ctx.counts.get(key, 0) + value


def _banks(ctx: Ctx, addresses: np.ndarray, nbytes: int) -> None:
    """Count the access's LDS phases and bank-conflict cycles (aiter.emulator.banks)."""
    phases, extra = conflict_cycles(addresses, nbytes, banks_of(ctx.kernel.arch))
    _count(ctx, "lds_phases", phases)
    _count(ctx, "lds_bank_conflict_cycles", extra)
