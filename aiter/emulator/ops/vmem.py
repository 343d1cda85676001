"""Vector memory semantics: buffer_* through a V# with the hardware's range check, and global_*
at 64-bit addresses; loads land at the s_waitcnt vmcnt that retires them, stores write at issue.

Sub-dword and d16 forms touch only their bytes (and only their half of the VGPR).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aiter.emulator.decode import Instruction
from aiter.emulator.errors import UnsupportedInstruction
from aiter.emulator.ops.registry import Ctx, op
from aiter.emulator.state import LANES, Pending, Wave

U32, U64 = np.uint32, np.uint64
_CACHE = ("glc", "slc", "nt", "sc0", "sc1")


@dataclass(frozen=True)
class Form:
    """How one load/store form moves data: `nbytes` per lane; `dwords` VGPRs; for sub-dword
    forms whether the value is sign-extended and which VGPR half (d16) it lives in."""

    nbytes: int
    dwords: int
    signed: bool = False
    half: str | None = None  # None: whole dword(s); "lo"/"hi": a 16-bit half (d16)


_LOADS = {
    "ubyte": Form(1, 1), "sbyte": Form(1, 1, True), "ushort": Form(2, 1),
    "sshort": Form(2, 1, True), "dword": Form(4, 1), "dwordx2": Form(8, 2),
    "dwordx3": Form(12, 3), "dwordx4": Form(16, 4),
    "ubyte_d16": Form(1, 1, False, "lo"), "sbyte_d16": Form(1, 1, True, "lo"),
    "short_d16": Form(2, 1, False, "lo"), "ubyte_d16_hi": Form(1, 1, False, "hi"),
    "sbyte_d16_hi": Form(1, 1, True, "hi"), "short_d16_hi": Form(2, 1, False, "hi"),
}  # fmt: skip
_STORES = {
    "byte": Form(1, 1), "short": Form(2, 1), "dword": Form(4, 1), "dwordx2": Form(8, 2),
    "dwordx3": Form(12, 3), "dwordx4": Form(16, 4),
    "byte_d16_hi": Form(1, 1, False, "hi"), "short_d16_hi": Form(2, 1, False, "hi"),
}  # fmt: skip


def _bytes_of(w: Wave, i: Instruction, data_op: int, form: Form) -> np.ndarray:
    """The bytes a store writes, uint8 [64, nbytes]."""
    raw = w.read_vector(i.operands[data_op], form.dwords)  # [dwords, 64]
    if form.half == "hi":
        raw = raw >> U32(16)
    lanes = np.ascontiguousarray(raw.T).view(np.uint8)  # [64, 4 * dwords]
    return lanes[:, : form.nbytes]


def _land(w: Wave, i: Instruction, data: np.ndarray, form: Form, mask: np.ndarray) -> Pending:
    """A load's result (uint8 [64, nbytes]) as a Pending write to its VGPRs."""
    row = w.vrow(i.operands[0])
    if form.nbytes >= 4:
        values = np.ascontiguousarray(data).view("<u4").T  # [dwords, 64]
    else:
        raw = data.view("<u1" if form.nbytes == 1 else "<u2")[:, 0].astype(np.int64)
        if form.signed:
            bits = 8 * form.nbytes
            raw = np.where(raw >> (bits - 1), raw - (1 << bits), raw)
        values = raw.astype(np.uint32)

    def apply() -> None:
        if form.half is None:
            np.copyto(w.vgpr[row : row + form.dwords], values, where=mask)
            return
        old = w.vgpr[row]
        half = values & U32(0xFFFF)
        # d16 loads keep the other half of the VGPR (CDNA3 ISA, "16-bit Memory Operations").
        if form.half == "lo":
            new = (old & U32(0xFFFF0000)) | half
        else:
            new = (old & U32(0xFFFF)) | (half << U32(16))
        np.copyto(w.vgpr[row], new, where=mask)

    return Pending("load", vgprs=tuple(range(row, row + form.dwords)), apply=apply, pc=i.address)


# --- buffer ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BufferResource:
    """A V# (CDNA3 ISA, "Buffer Resource"): 48-bit base, stride, num_records."""

    base: int
    stride: int
    num_records: int
    swizzle: bool
    add_tid: bool

    @classmethod
    def from_dwords(cls, d: np.ndarray, arch: str = "gfx942") -> BufferResource:
        d0, d1, d2, d3 = (int(x) for x in d)
        if arch == "gfx1250":
            # gfx1250's V#: a 57-bit base (word 1 bits 24:0 and word 0), a 45-bit num_records
            # (word 3 bits 5:0, word 2, word 1 bits 31:25), a 16-bit stride and 4 control bits
            # at the top (LLVM's make.buffer.rsrc lowering for gfx1250).
            return cls(
                base=d0 | (d1 & 0x1FFFFFF) << 32,
                stride=(d3 >> 6) & 0xFFFF,
                num_records=(d1 >> 25) | d2 << 7 | (d3 & 0x3F) << 39,
                swizzle=False,
                add_tid=False,
            )
        return cls(
            base=d0 | (d1 & 0xFFFF) << 32,
            stride=(d1 >> 16) & 0x3FFF,
            num_records=d2,
            swizzle=bool(d1 >> 31 & 1),
            add_tid=bool(d3 >> 23 & 1),
        )


def buffer_addresses(
    w: Wave, i: Instruction, ctx: Ctx, nbytes: int
) -> tuple[np.ndarray, np.ndarray, BufferResource]:
    """Per lane: the address of each dword (or of the sub-dword element) [64, parts] and
    whether that part is in range [64, parts].

    Range check (raw buffer, stride 0): a part is out of range when offset + its end exceeds
    num_records, with offset = VGPR offset (offen) + instruction offset, unsigned, checked per
    dword (LLVM AMDGPUUsage, "Relaxed Buffer OOB Mode"; CDNA3 ISA, "Buffer out-of-range
    checking"). The SGPR offset moves the address, not the checked offset. Strided buffers
    (idxen) check the index against num_records.
    """
    vaddr, rsrc_op, soff_op = i.operands[1], i.operands[2], i.operands[3]
    rsrc = BufferResource.from_dwords(w.read_vector(rsrc_op, 4)[:, 0], ctx.kernel.arch)
    if ctx.kernel.arch == "gfx1250" and (rsrc.stride or i.has("idxen")):
        # With stride 0 gfx1250's structured and offset-only checks agree (the raw check
        # below); a strided gfx1250 buffer is not modelled.
        raise UnsupportedInstruction(
            i.mnemonic, ctx.kernel.name, i.address, "a strided buffer resource on gfx1250"
        )
    if rsrc.swizzle or rsrc.add_tid:
        words = " ".join(f"{int(x):#010x}" for x in w.read_vector(rsrc_op, 4)[:, 0])
        raise UnsupportedInstruction(
            i.mnemonic, ctx.kernel.name, i.address, f"swizzled or add_tid buffer resource {words}"
        )
    soffset = w.read_scalar(soff_op) if soff_op.kind in ("s", "imm") else 0
    offen, idxen = i.has("offen"), i.has("idxen")
    vregs = w.read_vector(vaddr, 2 if offen and idxen else 1) if (offen or idxen) else None
    index = vregs[0].astype(np.int64) if idxen else np.zeros(LANES, np.int64)
    voffset = vregs[-1].astype(np.int64) if offen else np.zeros(LANES, np.int64)
    offset = voffset + i.mod_int("offset")
    parts = max(1, nbytes // 4)
    part_size = min(nbytes, 4)
    starts = offset[:, None] + 4 * np.arange(parts)[None, :]
    if rsrc.stride and idxen:
        in_range = np.repeat((index < rsrc.num_records)[:, None], parts, axis=1)
        in_range &= starts + part_size <= rsrc.stride
    else:
        in_range = starts + part_size <= rsrc.num_records
    addresses = rsrc.base + soffset + rsrc.stride * index[:, None] + starts
    return addresses.astype(np.uint64), in_range, rsrc


def _buffer_load(form: Form):
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        mask = w.exec_mask()
        addresses, in_range, _ = buffer_addresses(w, i, ctx, form.nbytes)
        data = np.zeros((LANES, form.nbytes), np.uint8)
        part = min(form.nbytes, 4)
        for k in range(addresses.shape[1]):
            live = mask & in_range[:, k]
            if live.any():
                # Out-of-range parts read as zero.
                data[live, 4 * k : 4 * k + part] = ctx.memory.read(addresses[live, k], part)
        w.issue(_land(w, i, data, form, mask))
        _count(ctx, "global_load_bytes", int(mask.sum()) * form.nbytes)

    return run


def _buffer_store(form: Form):
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        mask = w.exec_mask()
        addresses, in_range, _ = buffer_addresses(w, i, ctx, form.nbytes)
        data = _bytes_of(w, i, 0, form)
        part = min(form.nbytes, 4)
        for k in range(addresses.shape[1]):
            live = mask & in_range[:, k]  # out-of-range parts are dropped
            if live.any():
                ctx.memory.write(addresses[live, k], data[live, 4 * k : 4 * k + part])
                if ctx.global_writes is not None:
                    ctx.global_writes.store(addresses[live, k], part, i.address)
        w.issue(Pending("store", pc=i.address))
        _count(ctx, "global_store_bytes", int(mask.sum()) * form.nbytes)

    return run


for _name, _form in _LOADS.items():
    op(f"buffer_load_{_name}", mods=("offen", "idxen", "offset", *_CACHE))(_buffer_load(_form))
for _name, _form in _STORES.items():
    op(f"buffer_store_{_name}", mods=("offen", "idxen", "offset", *_CACHE))(_buffer_store(_form))


# --- global ----------------------------------------------------------------------------------


def global_addresses(
    w: Wave, i: Instruction, vaddr: int, saddr: int, nbytes: int = 1
) -> np.ndarray:
    """vaddr is a 64-bit address, or with an SGPR-pair saddr a 32-bit unsigned offset from it
    (gfx1250's scale_offset multiplies that offset by the `nbytes` each lane moves); plus the
    signed instruction offset (CDNA3 ISA, "Global Instructions")."""
    saddr_op = i.operands[saddr]
    offset = i.mod_int("offset")
    if saddr_op.kind in ("off", "null"):
        if i.has("scale_offset"):
            raise ValueError("scale_offset needs an SGPR base")
        base = w.read_vector(i.operands[vaddr], 2)
        address = base[0].astype(np.int64) | (base[1].astype(np.int64) << 32)
    else:
        sbase = w.read_scalar(saddr_op, 2)
        voffset = w.read_vector(i.operands[vaddr])[0].astype(np.int64)
        address = voffset * (nbytes if i.has("scale_offset") else 1) + sbase
    return (address + offset).astype(np.uint64)


def _global_load(form: Form):
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        mask = w.exec_mask()
        addresses = global_addresses(w, i, 1, 2, form.nbytes)
        data = np.zeros((LANES, form.nbytes), np.uint8)
        if mask.any():
            data[mask] = ctx.memory.read(addresses[mask], form.nbytes)
        w.issue(_land(w, i, data, form, mask))
        _count(ctx, "global_load_bytes", int(mask.sum()) * form.nbytes)

    return run


def _global_store(form: Form):
    def run(ctx: Ctx, w: Wave, i: Instruction) -> None:
        mask = w.exec_mask()
        addresses = global_addresses(w, i, 0, 2, form.nbytes)
        data = _bytes_of(w, i, 1, form)
        if mask.any():
            ctx.memory.write(addresses[mask], data[mask])
            if ctx.global_writes is not None:
                ctx.global_writes.store(addresses[mask], form.nbytes, i.address)
        w.issue(Pending("store", pc=i.address))
        _count(ctx, "global_store_bytes", int(mask.sum()) * form.nbytes)

    return run


for _name, _form in _LOADS.items():
    op(f"global_load_{_name}", mods=("offset", "scale_offset", *_CACHE))(_global_load(_form))
for _name, _form in _STORES.items():
    op(f"global_store_{_name}", mods=("offset", "scale_offset", *_CACHE))(_global_store(_form))


def _count(ctx: Ctx, key: str, value: int) -> None:
    ctx.counts[key] = ctx.counts.get(key, 0) + value
