"""Seeded faults in real compiled kernels: a removed s_barrier (an LDS race between waves), a
removed s_waitcnt (a read of a load's destination before it lands), and two work-groups writing
one global address. Each is caught for every scheduler seed.
"""

from __future__ import annotations

import pytest
import torch

from aiter.emulator import DataRace, Memory, MissingWait, launch, load_code_object, pack_kernargs
from aiter.emulator.decode import decode
from tests.emulator.emu_kernels import BLOCK
from tests.emulator.flydsl_args import place, tensor_args

S_NOP = 0xBF800000  # SOPP s_nop 0 (CDNA3 ISA, "SOPP" opcode 0)


def _only_kernel(code: bytes):
    (kernel,) = load_code_object(code).kernels.values()
    return kernel


def _remove(code: bytes, arch: str, pick) -> bytes:
    """The code object with the one instruction `pick(inst)` selects replaced by s_nop."""
    co = load_code_object(code)
    chosen = [i for i in decode(co.data, arch, co.sha256).instructions if pick(i)]
    assert chosen, "no instruction to remove"
    word = chosen[0].words[0].to_bytes(4, "little")
    assert code.count(word) == 1, "the instruction word is not unique in the code object"
    return code.replace(word, S_NOP.to_bytes(4, "little"))


def _exchange(code: bytes, seed: int, races: str = "raise"):
    kernel = _only_kernel(code)
    src = torch.arange(BLOCK, dtype=torch.float32)
    dst = torch.full((BLOCK,), float("nan"))
    memory = Memory()
    values = tensor_args(memory, src, "src") + tensor_args(memory, dst, "dst")
    stats = launch(code, kernel.name, (1, 1, 1), (BLOCK, 1, 1), pack_kernargs(kernel, values),
                   memory, seed=seed, races=races)  # fmt: skip
    return src, dst, stats


@pytest.mark.parametrize("seed", range(4))
def test_exchange_with_its_barrier_is_race_free(exchange_code, seed: int) -> None:
    arch, code = exchange_code
    src, dst, stats = _exchange(code, seed)
    assert torch.equal(dst, src.roll(-64)) and not stats.races
    assert stats.by_mnemonic["s_barrier"] == BLOCK // 64


@pytest.mark.parametrize("seed", range(4))
def test_removed_barrier_is_a_race_in_every_interleaving(exchange_code, seed: int) -> None:
    """The compiled kernel with its s_barrier replaced by s_nop: the LDS write of one wave and
    the read of another share a barrier epoch, so the race is raised whether or not this seed's
    order happens to read stale data."""
    arch, code = exchange_code
    broken = _remove(code, arch, lambda i: i.mnemonic == "s_barrier")
    with pytest.raises(DataRace, match="LDS byte .* no s_barrier between them"):
        _exchange(broken, seed)
    _, _, stats = _exchange(broken, seed, races="collect")
    assert stats.races and all(r.first[1] != r.second[1] for r in stats.races)


def test_removed_waitcnt_in_a_compiled_kernel_is_caught(axpy_code) -> None:
    """The compiled axpy with the s_waitcnt that retires its buffer loads replaced by s_nop:
    the add reads the loads' destination while they are in flight (MissingWait)."""
    arch, code = axpy_code
    broken = _remove(code, arch, lambda i: i.mnemonic == "s_waitcnt" and i.has("vmcnt"))
    kernel = _only_kernel(broken)
    n = 256
    memory = Memory()
    a, b, c = torch.randn(n), torch.randn(n), torch.zeros(n)
    values = [place(memory, a, "a"), n, place(memory, b, "b"), n, place(memory, c, "c"), n]
    with pytest.raises(MissingWait, match="which no s_waitcnt has retired"):
        launch(broken, kernel.name, (1, 1, 1), (BLOCK, 1, 1), pack_kernargs(kernel, values),
               memory, races="raise")  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
def test_two_workgroups_writing_one_address_are_reported(exchange_code, seed: int) -> None:
    """The exchange kernel ignores block_idx, so a grid of two work-groups has both write all
    of dst with plain stores: a race in one launch whatever the order of the groups (reported
    with both pcs); one work-group, or races="off", reports nothing."""
    arch, code = exchange_code
    kernel = _only_kernel(code)

    def go(grid: int, races: str):
        memory = Memory()
        src = torch.arange(BLOCK, dtype=torch.float32)
        dst = torch.zeros(BLOCK)
        values = tensor_args(memory, src, "src") + tensor_args(memory, dst, "dst")
        return launch(code, kernel.name, (grid, 1, 1), (BLOCK, 1, 1),
                      pack_kernargs(kernel, values), memory, seed=seed, races=races)  # fmt: skip

    with pytest.raises(DataRace, match=r"global byte 0x[0-9a-f]+: work-group \(\d, 0, 0\) pc"):
        go(2, "raise")
    stats = go(2, "collect")
    assert stats.races and {r.first[0] for r in stats.races} | {
        r.second[0] for r in stats.races
    } == {(0, 0, 0), (1, 0, 0)}
    assert not go(1, "raise").races and not go(2, "off").races
    with pytest.raises(ValueError):
        go(1, "maybe")
