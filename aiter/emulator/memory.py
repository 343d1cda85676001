"""The flat global address space a launch runs in: registered regions (a base address and a
numpy byte buffer each), accessed per lane with byte granularity.

An access that touches bytes outside every region raises MemoryFault naming the address.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from aiter.emulator.errors import MemoryFault

FIRST_BASE = 0x1_0000_0000  # addresses below 4 GiB stay unused, so a null pointer faults
ALIGN = 0x1000


@dataclass
class Region:
    base: int
    data: np.ndarray  # uint8, one dimension, may be a view of a caller's tensor
    name: str

    @property
    def end(self) -> int:
        return self.base + self.data.size


class Memory:
    """Regions of a flat 64-bit address space. `add` places a buffer at a fresh address."""

    def __init__(self) -> None:
        self._bases: list[int] = []
        self._regions: list[Region] = []
        self._next = FIRST_BASE

    @property
    def regions(self) -> tuple[Region, ...]:
        return tuple(self._regions)

    def add(self, data: np.ndarray, name: str = "", base: int | None = None) -> int:
        """Register `data` (viewed as bytes; writes land in it) and return its base address."""
        if not data.flags.c_contiguous:
            raise ValueError(f"{name or 'data'}: expected a contiguous array (writes land in it)")
        buf = data.reshape(-1).view(np.uint8)
        if base is None:
            base = self._next
        for region in self._regions:
            if base < region.end and region.base < base + max(1, buf.size):
                raise ValueError(f"{name or 'data'}: overlaps region {region.name!r}")
        self._next = max(self._next, (base + buf.size + 2 * ALIGN - 1) // ALIGN * ALIGN)
        pos = bisect.bisect(self._bases, base)
        self._bases.insert(pos, base)
        self._regions.insert(pos, Region(base, buf, name or f"region{len(self._regions)}"))
        return base

    def alloc(self, nbytes: int, name: str = "") -> int:
        """A zeroed region of `nbytes`; its base address."""
        return self.add(np.zeros(nbytes, np.uint8), name)

    def region_at(self, address: int) -> Region | None:
        pos = bisect.bisect(self._bases, address) - 1
        if pos >= 0 and address < self._regions[pos].end:
            return self._regions[pos]
        return None

    def _locate(self, addresses: np.ndarray, nbytes: int) -> tuple[np.ndarray, list[Region]]:
        """Region index of each address; MemoryFault when [address, address + nbytes) leaves
        every region."""
        bases = np.asarray(self._bases, dtype=np.uint64)
        pos = np.searchsorted(bases, addresses, side="right").astype(np.int64) - 1
        ends = np.asarray([r.end for r in self._regions] or [0], dtype=np.uint64)
        ok = pos >= 0
        safe = np.where(ok, pos, 0)
        ok &= addresses + np.uint64(nbytes) <= ends[safe]
        if not ok.all():
            bad = int(addresses[~ok][0])
            below = bisect.bisect(self._bases, bad) - 1
            near = self._regions[below] if below >= 0 else None
            where = (
                f" (nearest region below: {near.name!r} at {near.base:#x}..{near.end:#x})"
                if near
                else ""
            )
            raise MemoryFault(
                f"{nbytes}-byte access at {bad:#x} lies outside every registered region{where}"
            )
        return safe, self._regions

    def read(self, addresses: np.ndarray, nbytes: int) -> np.ndarray:
        """Bytes [n, nbytes] at each address."""
        addresses = np.asarray(addresses, dtype=np.uint64)
        out = np.zeros((addresses.size, nbytes), np.uint8)
        if addresses.size == 0:
            return out
        pos, regions = self._locate(addresses, nbytes)
        span = np.arange(nbytes, dtype=np.int64)
        for r in np.unique(pos):
            sel = pos == r
            region = regions[int(r)]
            offsets = (addresses[sel] - np.uint64(region.base)).astype(np.int64)
            out[sel] = region.data[offsets[:, None] + span]
        return out

    def write(self, addresses: np.ndarray, data: np.ndarray) -> None:
        """Write data [n, nbytes] at each address (in lane order: a later lane wins)."""
        addresses = np.asarray(addresses, dtype=np.uint64)
        if addresses.size == 0:
            return
        nbytes = data.shape[1]
        pos, regions = self._locate(addresses, nbytes)
        span = np.arange(nbytes, dtype=np.int64)
        for r in np.unique(pos):
            sel = pos == r
            region = regions[int(r)]
            offsets = (addresses[sel] - np.uint64(region.base)).astype(np.int64)
            region.data[offsets[:, None] + span] = data[sel]

    def read_scalar(self, address: int, nbytes: int) -> bytes:
        return self.read(np.array([address], np.uint64), nbytes)[0].tobytes()
