"""Static figures of a GEMM-shaped kernel's main loop, read from its AMDGPU ISA listing.

The listing is the assembly text LLVM's AMDGPU backend emits and FlyDSL writes when
FLYDSL_DEBUG_DUMP_ASM=1 and FLYDSL_DUMP_DIR=<dir> are set (<dir>/<kernel>_<n>/*final_isa.s).
Everything here is pure Python (no torch, no FlyDSL) and static: nothing runs on a GPU, so
every figure counts instructions as they are written, not as they execute.

- parse_listing(text) -> Listing: the kernel metadata (registers, LDS, spills, wave size, arch)
  and the instruction stream (mnemonic, operands, label positions).
- main_loop(listing) -> Loop | None: the innermost loop (a `.LBBx_y:` label and a later branch
  back to it) holding the most MMA instructions (v_mfma*, v_wmma*, v_smfmac*).
- loop_figures(loop, wave_size) -> LoopFigures: per iteration per wave, static: bytes and
  counts of global/buffer/flat loads and stores and of LDS reads and writes (bytes = per-lane
  width x wave_size lanes), MMA counts and FLOPs, VALU/SALU/wait/barrier counts, and whether a
  vector-memory wait before the first MMA forces a load issued earlier in the same pass
  (`exposed_wait`: the MMAs then stall on memory latency instead of hiding it).
- mma_flops(mnemonic): FLOPs of one MMA instruction (per wave), from the MxNxK in its name.
- occupancy(arch, vgprs, agprs, lds_bytes, waves_per_block): waves per SIMD on gfx942/gfx950.
- roofline_estimate(arch, figures, waves_per_block): an ESTIMATE of the roofline ceiling from the
  loop's MMA FLOPs per issued global byte and public spec-sheet peaks.

Counting conventions (static, per pass of the loop body as laid out in the listing; loads in
an inner loop such as a waterfall loop are counted once, and blocks the compiler placed outside
the label..branch range are not counted):

- VALU: every `v_` mnemonic that is not an MMA, including v_readfirstlane/v_readlane/
  v_writelane; a gfx12 `v_dual_*` (two operations) counts as one instruction.
- SALU: `s_` mnemonics that are not waits (s_waitcnt*, s_wait_*), branches, barriers, hints
  (s_nop, s_delay_alu, s_setprio, s_set_vgpr_msb, s_sleep) or scalar memory (s_load_*,
  s_buffer_load_*, s_store_*, s_prefetch_*, s_dcache_*; counted as `smem_count`).
- Barriers: s_barrier, and on gfx12-style targets s_barrier_wait (the signal is not counted).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field

# --- the listing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    index: int  # position in Listing.instructions
    line: int  # 1-based line of the listing
    mnemonic: str
    operands: str

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.operands}".strip()


@dataclass(frozen=True)
class Listing:
    """One kernel's listing. `vgprs` is the metadata's `.vgpr_count`, which on gfx90a+ is
    already the unified total (arch VGPRs rounded up to 4, plus AGPRs); `arch_vgprs` is the
    architectural VGPRs alone (`.set .L<kernel>.num_vgpr`, else vgprs - agprs)."""

    name: str
    arch: str | None
    vgprs: int
    agprs: int
    arch_vgprs: int
    sgprs: int
    lds_bytes: int
    vgpr_spills: int
    sgpr_spills: int
    scratch_bytes: int
    wave_size: int
    workgroup_size: int | None
    instructions: tuple[Instruction, ...]
    labels: tuple[tuple[str, int], ...]  # (label, index of the instruction that follows it)

    @property
    def waves_per_block(self) -> int | None:
        if not self.workgroup_size:
            return None
        return max(1, -(-self.workgroup_size // self.wave_size))


_LABEL = re.compile(r"^([.\w$]+):")
_MNEMONIC = re.compile(r"^[a-z_][a-z0-9_.]*$")
_ARCH = re.compile(r"\b(gfx[0-9a-f]+)")
_YAML_FIELD = re.compile(r"^(\s*(?:-\s+)?)\.([a-z_0-9]+):\s*(\S*)")
_AMDHSA_FIELD = re.compile(r"^\s*\.amdhsa_([a-z_0-9]+)\s+(\S+)")
_SET_NUM_VGPR = re.compile(r"^\s*\.set\s+\.L[\w.$]+\.num_vgpr,\s*(\d+)\s*$")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/")


def _strip(line: str) -> str:
    return _BLOCK_COMMENT.sub("", line).split(";", 1)[0].split("//", 1)[0].strip()


def _int(text: str | None, default: int = 0) -> int:
    try:
        return int(text, 0) if text is not None else default
    except ValueError:
        return default


def _metadata(lines: list[str]) -> dict[str, str]:
    """The first kernel's YAML metadata fields (`.name: value` at the kernel's own indentation,
    not its arguments'), then `.amdhsa_*` fields under `amdhsa_` keys; `.reqd_workgroup_size`
    becomes the product of its three entries."""
    meta: dict[str, str] = {}
    in_yaml, column, reqd = False, None, None
    for line in lines:
        stripped = line.strip()
        if stripped in (".amdgpu_metadata", ".end_amdgpu_metadata"):
            in_yaml = stripped == ".amdgpu_metadata"
        elif in_yaml and reqd is not None and stripped.startswith("- ") and len(reqd) < 3:
            reqd.append(_int(stripped[2:], 1))
            if len(reqd) == 3:
                meta.setdefault("reqd_workgroup_size", str(math.prod(reqd)))
        elif in_yaml and (match := _YAML_FIELD.match(line)):
            prefix, key, value = match.groups()
            if column is None and "-" in prefix:
                column = len(prefix)  # the first kernel's first field
            elif "-" in prefix and len(prefix) == column:
                in_yaml = False  # the second kernel's first field: stop
                continue
            elif len(prefix) != column:
                continue  # a field of an argument
            reqd = [] if key == "reqd_workgroup_size" else None
            if value:
                meta.setdefault(key, value)
        elif match := _AMDHSA_FIELD.match(line):
            meta.setdefault("amdhsa_" + match.group(1), match.group(2))
        elif match := _SET_NUM_VGPR.match(line):
            meta.setdefault("set_num_vgpr", match.group(1))
        elif stripped.startswith(".amdgcn_target") and (arch := _ARCH.search(stripped)):
            meta.setdefault("arch", arch.group(1))
    return meta


Labels = tuple[tuple[str, int], ...]  # (label, index of the instruction that follows it)


def _instructions(lines: list[str]) -> tuple[tuple[Instruction, ...], Labels]:
    """Instructions and labels outside the metadata blocks; directives and comments skipped."""
    instructions: list[Instruction] = []
    labels: list[tuple[str, int]] = []
    skipping = False
    for number, raw in enumerate(lines, 1):
        line = _strip(raw)
        if line in (".amdgpu_metadata", ".amdhsa_kernel") or line.startswith(".amdhsa_kernel "):
            skipping = True
        elif line in (".end_amdgpu_metadata", ".end_amdhsa_kernel"):
            skipping = False
        elif skipping or not line:
            continue
        elif match := _LABEL.match(line):
            labels.append((match.group(1), len(instructions)))
        elif not line.startswith("."):
            mnemonic, _, operands = line.partition(" ")
            if _MNEMONIC.match(mnemonic):
                instructions.append(
                    Instruction(len(instructions), number, mnemonic, operands.strip())
                )
    return tuple(instructions), tuple(labels)


def parse_listing(text: str) -> Listing:
    """Parse one kernel's ISA listing (the first kernel's metadata if it holds several)."""
    lines = text.splitlines()
    meta = _metadata(lines)
    instructions, labels = _instructions(lines)
    agprs = _int(meta.get("agpr_count"))
    vgprs = _int(meta.get("vgpr_count"), _int(meta.get("amdhsa_next_free_vgpr")))
    wave32 = _int(meta.get("amdhsa_wavefront_size32")) == 1
    workgroup = meta.get("reqd_workgroup_size") or meta.get("max_flat_workgroup_size")
    return Listing(
        name=meta.get("name", ""),
        arch=meta.get("arch"),
        vgprs=vgprs,
        agprs=agprs,
        arch_vgprs=_int(meta.get("set_num_vgpr"), max(0, vgprs - agprs)),
        sgprs=_int(meta.get("sgpr_count"), _int(meta.get("amdhsa_next_free_sgpr"))),
        lds_bytes=_int(
            meta.get("group_segment_fixed_size"), _int(meta.get("amdhsa_group_segment_fixed_size"))
        ),
        vgpr_spills=_int(meta.get("vgpr_spill_count")),
        sgpr_spills=_int(meta.get("sgpr_spill_count")),
        scratch_bytes=_int(meta.get("private_segment_fixed_size")),
        wave_size=_int(meta.get("wavefront_size"), 32 if wave32 else 64),
        workgroup_size=_int(workgroup) if workgroup else None,
        instructions=instructions,
        labels=labels,
    )


# --- loops -----------------------------------------------------------------------------------


def is_mma(mnemonic: str) -> bool:
    return mnemonic.startswith(("v_mfma", "v_wmma", "v_smfmac"))


def is_branch(mnemonic: str) -> bool:
    return mnemonic == "s_branch" or mnemonic.startswith("s_cbranch_")


@dataclass(frozen=True)
class Loop:
    """Instructions [start, end] of a listing: from the label to the branch back to it."""

    label: str
    start: int
    end: int  # index of the backward branch (inclusive)
    body: tuple[Instruction, ...]
    inner_loops: int = 0  # loops nested inside the body (e.g. waterfall loops)

    @property
    def mma_count(self) -> int:
        return sum(is_mma(i.mnemonic) for i in self.body)

    def contains(self, other: Loop) -> bool:
        return other is not self and self.start <= other.start and other.end <= self.end


def loops(listing: Listing) -> list[Loop]:
    """Every loop: a `.L` label and the last later branch back to it."""
    where = dict(listing.labels)
    ends: dict[str, int] = {}
    for inst in listing.instructions:
        target = inst.operands.split(",")[0].strip()
        if is_branch(inst.mnemonic) and target in where and where[target] <= inst.index:
            ends[target] = inst.index
    found = [
        Loop(label, where[label], end, listing.instructions[where[label] : end + 1])
        for label, end in ends.items()
        if label.startswith(".L")
    ]
    return [
        Loop(lp.label, lp.start, lp.end, lp.body, sum(lp.contains(o) for o in found))
        for lp in found
    ]


def main_loop(listing: Listing) -> Loop | None:
    """The innermost loop holding MMAs (no loop inside it holds any) with the most MMAs;
    the first such loop on a tie; None if no loop holds an MMA."""
    with_mma = [lp for lp in loops(listing) if lp.mma_count]
    innermost = [lp for lp in with_mma if not any(lp.contains(o) for o in with_mma)]
    return max(innermost, key=lambda lp: lp.mma_count, default=None)


# --- widths of memory instructions -----------------------------------------------------------

_WIDTHS = {
    "dword": 4, "dwordx2": 8, "dwordx3": 12, "dwordx4": 16,
    "ubyte": 1, "sbyte": 1, "byte": 1, "ushort": 2, "sshort": 2, "short": 2,
    "u8": 1, "i8": 1, "b8": 1, "u16": 2, "i16": 2, "b16": 2,
    "b32": 4, "b64": 8, "b96": 12, "b128": 16,
    "x": 4, "xy": 8, "xyz": 12, "xyzw": 16,  # buffer_load_format_* (32-bit components)
}  # fmt: skip
_DOUBLE = ("read2", "write2", "read2st64", "write2st64", "2addr")  # two elements per lane


def access_bytes(mnemonic: str) -> int:
    """Bytes one lane moves: the first width token of the name (d16 alone = 2), doubled for
    the two-address LDS forms (ds_read2_b32 = 8, ds_load_2addr_b64 = 16)."""
    tokens = mnemonic.split("_")[1:]
    width = next((_WIDTHS[t] for t in tokens if t in _WIDTHS), 2 if "d16" in tokens else 0)
    return width * (2 if any(t in _DOUBLE for t in tokens) else 1)


_VMEM = ("global_", "buffer_", "flat_")


def vmem_kind(mnemonic: str) -> str | None:
    """'load', 'async' (gfx1250 async-to-LDS load), 'store', 'atomic' or None (not VMEM)."""
    if not mnemonic.startswith(_VMEM) or "prefetch" in mnemonic:
        return None
    op = mnemonic.split("_", 1)[1]
    if op.startswith("load"):
        return "async" if "async" in op else "load"
    if op.startswith("store"):
        return "store"
    return "atomic" if op.startswith("atomic") else None


def lds_kind(mnemonic: str) -> str | None:
    """'read' (ds_read*, ds_load*) or 'write' (ds_write*, ds_store*); None otherwise."""
    if mnemonic.startswith(("ds_read", "ds_load")):
        return "read"
    if mnemonic.startswith(("ds_write", "ds_store")):
        return "write"
    return None


# --- MMA FLOPs -------------------------------------------------------------------------------

_SHAPE = re.compile(r"(\d+)x(\d+)x(\d+)")
_BLOCKS = re.compile(r"_(\d+)b(?:_|$)")


def mma_flops(mnemonic: str) -> int:
    """FLOPs of one MMA instruction, per wave: 2 * M * N * K from the MxNxK in its name, times
    the block count of multi-block MFMAs (`_4b_`); suffixes such as `_1k` are ignored. Sparse
    v_smfmac count the dense-equivalent product they name. 0 if the name holds no MxNxK."""
    shape = _SHAPE.search(mnemonic)
    if not shape:
        return 0
    m, n, k = (int(d) for d in shape.groups())
    blocks = _BLOCKS.search(mnemonic[shape.end() :])
    return 2 * m * n * k * (int(blocks.group(1)) if blocks else 1)


# --- figures of a loop -----------------------------------------------------------------------


@dataclass(frozen=True)
class LoopFigures:
    """Static figures of one pass of a loop body, per wave (bytes = lane width x wave_size)."""

    label: str
    instructions: int
    global_load_bytes: int
    global_load_count: int
    buffer_load_count: int
    global_store_bytes: int
    global_store_count: int
    global_atomic_count: int
    lds_read_bytes: int
    lds_write_bytes: int
    lds_read_count: int
    lds_write_count: int
    mma_count: int
    mma_by_mnemonic: Counter = field(default_factory=Counter)
    mma_flops: int = 0
    valu_count: int = 0
    salu_count: int = 0
    smem_count: int = 0
    barriers: int = 0
    waitcnts: int = 0
    inner_loops: int = 0
    exposed_wait: bool = False
    exposed_wait_detail: str | None = None

    def to_dict(self) -> dict:
        out = asdict(self)
        out["mma_by_mnemonic"] = dict(self.mma_by_mnemonic)
        return out


_HINTS = ("s_nop", "s_delay_alu", "s_setprio", "s_set_vgpr_msb", "s_sleep")
_SMEM = ("s_load_", "s_buffer_load_", "s_store_", "s_buffer_store_", "s_prefetch_", "s_dcache_")


def _is_wait(mnemonic: str) -> bool:
    return mnemonic.startswith(("s_waitcnt", "s_wait_"))


def _is_barrier(mnemonic: str) -> bool:
    return mnemonic in ("s_barrier", "s_barrier_wait")


def _is_salu(mnemonic: str) -> bool:
    return (
        mnemonic.startswith("s_")
        and not (_is_wait(mnemonic) or is_branch(mnemonic) or mnemonic.startswith("s_barrier"))
        and not mnemonic.startswith(_HINTS + _SMEM)
    )


_VMCNT = re.compile(r"vmcnt\((\d+)\)")


def _forced_load(inst: Instruction, issued: list[str]) -> bool:
    """Whether wait `inst` forces the completion of a load of `issued` (the VMEM kinds issued
    since the loop label, oldest first). gfx9 vmcnt counts loads, stores and atomics; gfx12
    loadcnt counts loads, asynccnt async loads; s_wait_loadcnt_dscnt holds loadcnt in bits
    13:8."""
    operands = inst.operands
    if inst.mnemonic == "s_waitcnt" and (match := _VMCNT.search(operands)):
        counted, allowed = [k for k in issued if k != "async"], int(match.group(1))
    elif inst.mnemonic == "s_wait_loadcnt":
        counted, allowed = [k for k in issued if k == "load"], _int(operands, 1 << 30)
    elif inst.mnemonic == "s_wait_loadcnt_dscnt":
        counted, allowed = [k for k in issued if k == "load"], (_int(operands) >> 8) & 0x3F
    elif inst.mnemonic == "s_wait_asynccnt":
        counted, allowed = [k for k in issued if k == "async"], _int(operands, 1 << 30)
    else:
        return False
    forced = counted[: max(0, len(counted) - allowed)]
    return any(k in ("load", "async") for k in forced)


def exposed_wait(body: tuple[Instruction, ...]) -> Instruction | None:
    """The first wait before the body's first MMA that forces a vector-memory load issued
    earlier in the same pass (N < loads issued since the label), or None."""
    issued: list[str] = []
    for inst in body:
        if is_mma(inst.mnemonic):
            return None
        if kind := vmem_kind(inst.mnemonic):
            issued.append(kind)
        elif _is_wait(inst.mnemonic) and _forced_load(inst, issued):
            return inst
    return None


def _memory_figures(body: tuple[Instruction, ...], lanes: int) -> dict[str, int]:
    figures = Counter()
    for inst in body:
        m, width = inst.mnemonic, access_bytes(inst.mnemonic) * lanes
        kind, lds = vmem_kind(m), lds_kind(m)
        if kind in ("load", "async"):
            figures["global_load_bytes"] += width
            figures["global_load_count"] += 1
            figures["buffer_load_count"] += m.startswith("buffer_")
        elif kind == "store":
            figures["global_store_bytes"] += width
            figures["global_store_count"] += 1
        elif kind == "atomic":
            figures["global_atomic_count"] += 1
        elif lds:
            figures[f"lds_{lds}_bytes"] += width
            figures[f"lds_{lds}_count"] += 1
    return figures


def loop_figures(loop: Loop, wave_size: int) -> LoopFigures:
    """Static figures of one pass of `loop`'s body, per wave of `wave_size` lanes."""
    body = loop.body
    mmas = Counter(i.mnemonic for i in body if is_mma(i.mnemonic))
    memory = _memory_figures(body, wave_size)
    wait = exposed_wait(body)
    return LoopFigures(
        label=loop.label,
        instructions=len(body),
        **{
            key: memory.get(key, 0)
            for key in (
                "global_load_bytes", "global_load_count", "buffer_load_count",
                "global_store_bytes", "global_store_count", "global_atomic_count",
                "lds_read_bytes", "lds_write_bytes", "lds_read_count", "lds_write_count",
            )
        },  # fmt: skip
        mma_count=sum(mmas.values()),
        mma_by_mnemonic=mmas,
        mma_flops=sum(mma_flops(m) * n for m, n in mmas.items()),
        valu_count=sum(i.mnemonic.startswith("v_") and not is_mma(i.mnemonic) for i in body),
        salu_count=sum(_is_salu(i.mnemonic) for i in body),
        smem_count=sum(i.mnemonic.startswith(_SMEM) for i in body),
        barriers=sum(_is_barrier(i.mnemonic) for i in body),
        waitcnts=sum(_is_wait(i.mnemonic) for i in body),
        inner_loops=loop.inner_loops,
        exposed_wait=wait is not None,
        exposed_wait_detail=None if wait is None else f"line {wait.line}: {wait.text}",
    )


# --- occupancy -------------------------------------------------------------------------------

MAX_WAVES_PER_SIMD = 8
SIMDS_PER_CU = 4
REGISTERS_PER_LANE = 512  # the unified VGPR + AGPR file of gfx90a+ (CDNA)
LDS_PER_CU = {"gfx942": 65536, "gfx950": 163840}


def _roundup(value: int, granule: int) -> int:
    return -(-value // granule) * granule


def occupancy(
    arch: str, vgprs: int, agprs: int, lds_bytes: int, waves_per_block: int
) -> int | None:
    """Waves per SIMD of a kernel on gfx942/gfx950 (CDNA3/CDNA4), or None for any other arch
    (gfx1250 is not modelled: its register file and LDS differ and are not public here).

    `vgprs` are the ARCHITECTURAL VGPRs (Listing.arch_vgprs; `.vgpr_count` already includes
    the AGPRs on gfx90a+, so pass agprs=0 with it). The unified register file holds 512
    registers per lane, allocated as roundup(roundup(vgprs, 4) + agprs, 8); at most 8 waves
    per SIMD; a block of `waves_per_block` waves puts waves_per_block / 4 waves on each of the 4
    SIMDs, and a CU holds LDS_PER_CU // lds_bytes blocks. Ignored: SGPR limits, the LDS
    allocation granule, the per-CU work-group limit and block granularity of the VGPR limit.
    """
    if arch not in LDS_PER_CU:
        return None
    registers = _roundup(_roundup(vgprs, 4) + agprs, 8) if agprs else _roundup(vgprs, 8)
    by_regs = REGISTERS_PER_LANE // registers if registers else MAX_WAVES_PER_SIMD
    by_lds = math.inf
    if lds_bytes:
        by_lds = (LDS_PER_CU[arch] // lds_bytes) * waves_per_block / SIMDS_PER_CU
    return int(min(MAX_WAVES_PER_SIMD, by_regs, by_lds))


# --- roofline estimate -----------------------------------------------------------------------

# Public spec-sheet peaks (dense matrix throughput, no sparsity; HBM bandwidth): AMD Instinct
# MI300X (gfx942) and MI355X (gfx950) data sheets. int8 MMAs use the fp8 peak (same TOPS).
SPEC_SHEET_PEAKS: dict[str, dict] = {
    "gfx942": {"device": "MI300X", "bf16": 1307.4e12, "fp8": 2614.9e12, "hbm": 5.3e12},
    "gfx950": {"device": "MI355X", "bf16": 2.5e15, "fp8": 5.0e15, "hbm": 8.0e12},
}
_EIGHT_BIT = ("fp8", "bf8", "f8", "i8", "iu8", "f6", "f4")


def mma_precision(mnemonic: str) -> str | None:
    """'fp8' (8-bit and narrower inputs), 'bf16' (bf16/f16 inputs) or None (other)."""
    # Input types follow the shape; old names glue them to it (16x16x16f16, 32x32x8bf16_1k).
    tokens = [t.lstrip("0123456789") for t in re.split(r"[_x]", mnemonic)[3:]]
    if any(t.startswith(_EIGHT_BIT) for t in tokens):
        return "fp8"
    if any(t.startswith(("bf16", "f16")) for t in tokens):
        return "bf16"
    return None


@dataclass(frozen=True)
class RooflineEstimate:
    """An ESTIMATE of a kernel's roofline ceiling from one main-loop iteration of one
    work-group. `fraction_of_peak` = min(peak, intensity x HBM bandwidth) / peak: the memory-
    bound ceiling IF EVERY ISSUED GLOBAL BYTE CAME FROM HBM. It is an upper-bound estimate under
    that assumption and ignores caches (L2, MALL reuse cut real HBM traffic, so a kernel can
    beat it) as well as latency, issue limits and occupancy (which keep kernels below it)."""

    device: str
    precision: str
    flops_per_iteration: int  # MMA FLOPs per work-group
    global_bytes_per_iteration: int  # issued global load bytes per work-group
    flop_per_byte: float
    machine_balance: float  # peak FLOP/s / HBM byte/s
    fraction_of_peak: float
    memory_bound: bool


def roofline_estimate(
    arch: str, figures: LoopFigures, waves_per_block: int
) -> RooflineEstimate | None:
    """RooflineEstimate (an estimate, see its docstring) of `figures` on the spec-sheet device
    of `arch`, or None: an arch without public peaks here (gfx1250), no MMA, or an MMA
    precision without a peak here (f32, f64)."""
    peaks = SPEC_SHEET_PEAKS.get(arch)
    precisions = {mma_precision(m) for m in figures.mma_by_mnemonic}
    if peaks is None or len(precisions) != 1 or None in precisions:
        return None
    (precision,) = precisions
    flops = figures.mma_flops * waves_per_block
    nbytes = figures.global_load_bytes * waves_per_block
    intensity = flops / nbytes if nbytes else math.inf
    peak, bandwidth = peaks[precision], peaks["hbm"]
    attainable = min(peak, intensity * bandwidth)
    return RooflineEstimate(
        device=peaks["device"],
        precision=precision,
        flops_per_iteration=flops,
        global_bytes_per_iteration=nbytes,
        flop_per_byte=intensity,
        machine_balance=peak / bandwidth,
        fraction_of_peak=attainable / peak,
        memory_bound=intensity * bandwidth < peak,
    )
