"""Turns llvm-objdump's disassembly of a code object into instructions the emulator executes:
address, size, mnemonic, operands (registers, constants) and modifiers (offset:, op_sel:, ...).

LLVM's own disassembler is the decoder, so encodings are never restated here; the text of each
line is parsed once per code object and cached by the code object's sha256.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from aiter.emulator.errors import DecodeError, DisassemblerNotFound
from aiter.flydsl_bridge import elf

# SGPR-file indices of the named scalar registers on gfx9 (CDNA3 ISA, "Scalar Operands").
SPECIAL_SGPRS = {
    "flat_scratch_lo": (102, 1),
    "flat_scratch_hi": (103, 1),
    "flat_scratch": (102, 2),
    "xnack_mask_lo": (104, 1),
    "xnack_mask_hi": (105, 1),
    "xnack_mask": (104, 2),
    "vcc_lo": (106, 1),
    "vcc_hi": (107, 1),
    "vcc": (106, 2),
    "m0": (124, 1),
    "exec_lo": (126, 1),
    "exec_hi": (127, 1),
    "exec": (126, 2),
}
VCC, M0, EXEC = 106, 124, 126
SGPR_FILE = 128

# Modifiers written as a bare word (the others are written name:value).
FLAG_MODIFIERS = frozenset(
    [
        "offen",
        "idxen",
        "glc",
        "slc",
        "nt",
        "sc0",
        "sc1",
        "lds",
        "clamp",
        "tfe",
        "lwe",
        "gds",
        "addr64",
        "d16",
        "row_mirror",
        "row_half_mirror",
        "bound_ctrl",
        "dlc",
        "scc",
        "nv",
        "scale_offset",
    ]
)


@dataclass(frozen=True, slots=True)
class Operand:
    """One operand: kind 's'/'v'/'a' (registers index..index+count-1), 'imm' (an integer as
    written), 'float' (an inline float constant, typed by the instruction), 'scc', 'off',
    'label' (a branch target address) or 'special' (a register the emulator does not model)."""

    kind: str
    index: int = 0
    count: int = 1
    value: int | float = 0
    neg: bool = False
    abs: bool = False
    sext: bool = False
    text: str = ""
    half: str = ""  # "l" or "h": a 16-bit half of a VGPR (gfx12's true16 operands)


@dataclass(frozen=True, slots=True)
class Instruction:
    address: int
    size: int
    mnemonic: str
    operands: tuple[Operand, ...]
    modifiers: dict[str, str | None] = field(default_factory=dict)
    text: str = ""
    words: tuple[int, ...] = ()
    # A VOPD dual issue (gfx12's v_dual_X :: v_dual_Y): its two halves, executed as one
    # instruction (both read their sources before either writes).
    parts: tuple[Instruction, ...] = ()

    def mod(self, name: str, default: str | None = None) -> str | None:
        return self.modifiers.get(name, default)

    def has(self, name: str) -> bool:
        return name in self.modifiers

    def mod_int(self, name: str, default: int = 0) -> int:
        value = self.modifiers.get(name)
        return default if value is None else int(value, 0)


@dataclass(frozen=True)
class Program:
    """The decoded instructions of a code object, by address."""

    arch: str
    instructions: tuple[Instruction, ...]
    by_address: dict[int, int]  # address -> index in instructions

    def at(self, address: int) -> Instruction:
        index = self.by_address.get(address)
        if index is None:
            raise DecodeError(f"no instruction starts at address {address:#x}")
        return self.instructions[index]


_LINE = re.compile(
    r"^\s+([a-z_][a-z0-9_.]*)\s*(.*?)\s*//\s*([0-9A-Fa-f]+):\s*((?:[0-9A-F]{8}\s*)+)"
)
_REG = re.compile(r"^([sva])(\d+)(?:\.([lh]))?$")
_TTMP = re.compile(r"^ttmp(\d+)$")
TTMP0 = 108  # ttmp0..ttmp15 are SGPR-file indices 108..123 (CDNA3 and gfx12 ISA)
# llvm-objdump prints a register beyond v255 (gfx1250's s_set_vgpr_msb) as the encoded one
# followed by the real one in a comment: "v2 /*v258*/", "v[0:1] /*v[256:257]*/".
_MSB_NOTE = re.compile(r"(v\d+|v\[\d+:\d+\])(\.[lh])? /\*(v\d+|v\[\d+:\d+\])(\.[lh])?\*/")
_RANGE = re.compile(r"^([sva])\[(\d+):(\d+)\]$")
_INT = re.compile(r"^-?(0x[0-9a-fA-F]+|\d+)$")
_FLOAT = re.compile(r"^-?\d+\.\d+(e[-+]?\d+)?$")


def _split_top(text: str, sep: str) -> list[str]:
    """Split on `sep` outside brackets and parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _is_modifier(token: str) -> bool:
    if token in FLAG_MODIFIERS:
        return True
    head = token.split("[", 1)[0].split("(", 1)[0]
    return ":" in head and not head.startswith(("s[", "v[", "a["))


def parse_operand(token: str) -> Operand:
    """One operand token as llvm-objdump prints it."""
    text = token
    neg = absolute = sext = False
    if token.startswith("sext(") and token.endswith(")"):
        sext, token = True, token[5:-1]
    if token.startswith("neg(") and token.endswith(")"):
        neg, token = True, token[4:-1]
    if token.startswith("abs(") and token.endswith(")"):
        absolute, token = True, token[4:-1]
    if token.startswith("-") and not _INT.match(token) and not _FLOAT.match(token):
        neg, token = True, token[1:]
    if token.startswith("|") and token.endswith("|"):
        absolute, token = True, token[1:-1]
    if m := _REG.match(token):
        return Operand(m.group(1), int(m.group(2)), 1, neg=neg, abs=absolute, sext=sext,
                       text=text, half=m.group(3) or "")  # fmt: skip
    if m := _RANGE.match(token):
        lo, hi = int(m.group(2)), int(m.group(3))
        return Operand(m.group(1), lo, hi - lo + 1, neg=neg, abs=absolute, sext=sext, text=text)
    if m := _TTMP.match(token):
        return Operand("s", TTMP0 + int(m.group(1)), 1, text=text)
    if token == "null":
        return Operand("null", text=text)
    if token in SPECIAL_SGPRS:
        index, count = SPECIAL_SGPRS[token]
        return Operand("s", index, count, neg=neg, abs=absolute, sext=sext, text=text)
    if _INT.match(token):
        return Operand("imm", value=int(token, 0), neg=neg, abs=absolute, sext=sext, text=text)
    if _FLOAT.match(token):
        return Operand("float", value=float(token), neg=neg, abs=absolute, text=text)
    if token in ("scc", "src_scc"):
        return Operand("scc", text=text)
    if token == "off":
        return Operand("off", text=text)
    return Operand("special", text=text)


def _parse_line(mnemonic: str, rest: str, address: int, words: tuple[int, ...]) -> Instruction:
    rest = _MSB_NOTE.sub(lambda m: m.group(3) + (m.group(4) or m.group(2) or ""), rest)
    if "::" in rest and mnemonic.startswith("v_dual_"):
        first, second = rest.split("::", 1)
        second_mnemonic, _, second_rest = second.strip().partition(" ")
        parts = tuple(
            _vopd_part("v_" + name[len("v_dual_") :], text, address, words)
            for name, text in ((mnemonic, first), (second_mnemonic, second_rest))
        )
        return Instruction(address, 4 * len(words), "v_dual", (), {},
                           f"{mnemonic} {rest}".strip(), words, parts)  # fmt: skip
    operands: list[Operand] = []
    modifiers: dict[str, str | None] = {}
    if mnemonic.startswith("s_waitcnt") and not mnemonic.startswith("s_waitcnt_"):
        for token in rest.replace("&", " ").split():
            m = re.match(r"^(\w+)\((\d+)\)$", token)
            if m:
                modifiers[m.group(1)] = m.group(2)
            elif _INT.match(token):
                operands.append(Operand("imm", value=int(token, 0), text=token))
        return Instruction(address, 4 * len(words), mnemonic, tuple(operands), modifiers,
                           f"{mnemonic} {rest}".strip(), words)  # fmt: skip
    pieces = _split_top(rest, ",")
    tokens: list[str] = []
    if pieces:
        tail = _split_top(pieces[-1], " ")
        tokens = pieces[:-1] + tail
    for token in tokens:
        if _is_modifier(token):
            name, _, value = token.partition(":")
            modifiers[name] = value if value else None
        else:
            operands.append(parse_operand(token))
    if "op_sel" in modifiers and any(o.half for o in operands):
        _fold_true16_op_sel(operands, modifiers, f"{mnemonic} {rest}")
    if mnemonic.startswith("s_cbranch") or mnemonic == "s_branch":
        simm = operands[0].value if operands else 0
        simm = simm - 0x10000 if simm >= 0x8000 else simm
        target = address + 4 + 4 * simm
        operands = [Operand("label", value=target, text=hex(target))] + operands[1:]
    return Instruction(address, 4 * len(words), mnemonic, tuple(operands), modifiers,
                       f"{mnemonic} {rest}".strip(), words)  # fmt: skip


def _fold_true16_op_sel(operands: list[Operand], modifiers: dict, text: str) -> None:
    """With true16 operands llvm-objdump prints the halves twice: as v1.h and as op_sel bits
    (sources first, the destination last). The halves are what the semantics read, so op_sel
    goes once it is checked to say the same."""
    bits = [int(b) for b in (modifiers["op_sel"] or "").strip("[]").split(",")]
    sources = operands[1:]
    if len(bits) != len(sources) + 1:
        raise DecodeError(f"{text!r}: op_sel {bits} does not cover its {len(sources)} sources")
    halves = [o.half == "h" for o in sources] + [operands[0].half == "h"]
    if bits != [int(h) for h in halves]:
        raise DecodeError(f"{text!r}: op_sel {bits} disagrees with the register halves")
    del modifiers["op_sel"]


def _vopd_part(mnemonic: str, rest: str, address: int, words: tuple[int, ...]) -> Instruction:
    """One half of a VOPD pair. Its v_dual_cndmask_b32 selects by VCC without naming it (gfx12
    ISA, "VOPD"): the condition is made explicit, as the VOP2 form prints it (vcc_lo)."""
    part = _parse_line(mnemonic, rest, address, words)
    if mnemonic == "v_cndmask_b32" and len(part.operands) == 3:
        vcc = Operand("s", VCC, 1, text="vcc_lo")
        part = Instruction(part.address, part.size, part.mnemonic, (*part.operands, vcc),
                           part.modifiers, part.text, part.words)  # fmt: skip
    return part


def parse_disassembly(text: str, arch: str) -> Program:
    """Every instruction line of `llvm-objdump -d` output."""
    instructions: list[Instruction] = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        mnemonic, rest, addr, hexwords = m.groups()
        words = tuple(int(w, 16) for w in hexwords.split())
        try:
            instructions.append(_parse_line(mnemonic, rest, int(addr, 16), words))
        except (ValueError, IndexError) as err:
            raise DecodeError(f"cannot parse disassembly line {line.strip()!r}: {err}") from err
    by_address = {inst.address: i for i, inst in enumerate(instructions)}
    return Program(arch, tuple(instructions), by_address)


_PROGRAMS: dict[str, Program] = {}


def decode(code: bytes, arch: str, sha256: str) -> Program:
    """The decoded program of a code object (llvm-objdump runs once per code object)."""
    if sha256 not in _PROGRAMS:
        text = elf.disassemble(code, arch)
        if text is None:
            raise DisassemblerNotFound(
                f"no installed llvm-objdump knows {arch}: install llvm-22 (Debian: "
                "apt-get install llvm-22) or set AITER_LLVM_OBJDUMP"
            )
        _PROGRAMS[sha256] = parse_disassembly(text, arch)
    return _PROGRAMS[sha256]


def float_bits32(value: float) -> int:
    """IEEE binary32 bits of an inline float constant."""
    return struct.unpack("<I", struct.pack("<f", value))[0]
