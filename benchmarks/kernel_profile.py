"""Static ISA profile of the repository's GEMM-shaped kernels, the fp8 attention forward and the
chunk_gdn_h pass: per main-loop iteration per wave (a k-tile, a key block for attention, a
chunk for chunk_gdn_h), what the compiled code loads, stages through LDS and multiplies, from
FlyDSL's ISA listings.

    .venv/bin/python benchmarks/kernel_profile.py [--arch gfx942,gfx950,gfx1250]
        [--kernel a16w16 ...] [--json PATH] [--keep-listings DIR]
    .venv/bin/python benchmarks/kernel_profile.py --emulated REPORT.json [...] [--json PATH]

The second form gives dynamic figures from emulated runs instead (benchmarks/emulated_profile.py).

Each arch compiles in a child process of its own (FlyDSL freezes its target per process, and an
LLVM abort kills the process: a child's death is reported as the failure of the config it was
compiling, and a new child carries on with the rest). The children launch every config on CPU
tensors with COMPILE_ONLY=1 and FLYDSL_DEBUG_DUMP_ASM=1, one FLYDSL_DUMP_DIR per config, and
parse the listings with aiter.flydsl_bridge.listing. Nothing runs on a GPU: every figure is
static, and the roofline column is an estimate (see listing.roofline_estimate).

From tests: profile_configs(arch, configs) -> rows, format_table(rows) -> str,
default_configs(arch) -> configs, profile_listing(text) -> dict (no compile).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from compile_env import child_env  # noqa: E402

from aiter.arch import ARCHS  # noqa: E402
from aiter.flydsl_bridge import listing as isa  # noqa: E402

GEMM_KERNELS = ("a16w16", "a8w8_bpreshuffle", "a8w8_blockscale", "mx_a4w4", "mx_fp8",
                "moe_stage1", "moe_stage2", "conv3d")  # fmt: skip
KERNELS = (*GEMM_KERNELS, "fmha_fp8", "chunk_gdn_h")
MARK = "@@kernel_profile "  # prefix of the child's result lines (FlyDSL prints to stdout too)
CHILD_TIMEOUT = 1800

# --- configurations --------------------------------------------------------------------------

# The big tiles, a middle one and the decode tiles the heuristic picks for M <= 32 (256 bytes
# of K per row).
A16W16_TILES = ((128, 128, 64), (64, 128, 32), (16, 64, 32), (256, 128, 64), (16, 64, 128))
BPRESHUFFLE_TILES = ((128, 128, 128), (64, 128, 64), (16, 64, 256))
BLOCKSCALE_TILES = ((128, 128, 128), (64, 128, 128))
# The MX GEMMs (gfx950): tiles in K elements, beside the fp8 and bf16 tiles of the same shape
# above (128x128, the 256-wide tiles and the decode tile the heuristic picks).
MX_TILES = {
    "mx_a4w4": ((128, 128, 256), (256, 256, 128), (256, 128, 256), (16, 64, 512)),
    "mx_fp8": ((128, 128, 128), (256, 128, 128), (16, 64, 256)),
}
GEMM_MNK = (512, 512, 1024)
MOE_SIZES = dict(m=256, model_dim=1024, inter=512, experts=8, topk=2)
MOE_STAGE2_MODE = "atomic"  # a config's "mode" when it names none (the planner's default)
CONV_SHAPES = dict(x=(2, 64, 8, 16, 16), w=(128, 64, 3, 3, 3), padding=1)
# fp8 attention: (block_m, D, Dv) per config, causal, no split; the main loop is the key loop.
FMHA_TILES = ((128, 128, 128), (64, 128, 128), (128, 192, 128), (128, 256, 256), (64, 256, 256))
FMHA_SIZES = dict(batch=2, seqlen_q=512, seqlen_k=512, heads=8, kv_heads=2)
# chunk_gdn_h: (K, BV) per config, scalar gates, initial and final state, dense; the main loop
# is the chunk loop.
GDN_TILES = ((128, 64), (128, 16), (256, 64), (64, 32))
GDN_SIZES = dict(batch=2, seqlen=512, heads=8, key_heads=4, head_dim_v=128)


def default_configs(arch: str) -> list[dict]:
    """Representative configs of every kernel that exists for `arch` (the a8w8 blockscale
    kernel has no gfx1250 WMMA flavour)."""
    info = ARCHS[arch]
    mma, fp8 = info.mma, info.fp8_dtype_name
    configs = [dict(kernel="a16w16", tile=t, dtype="bfloat16") for t in A16W16_TILES]
    configs += [dict(kernel="a8w8_bpreshuffle", tile=t, dtype=fp8) for t in BPRESHUFFLE_TILES]
    configs.append(dict(kernel="a8w8_bpreshuffle", tile=BPRESHUFFLE_TILES[0], dtype="int8"))
    if mma == "mfma":
        configs += [dict(kernel="a8w8_blockscale", tile=t, dtype=fp8) for t in BLOCKSCALE_TILES]
    configs += [
        dict(kernel="moe_stage1", tile=(32, 128, 64), dtype="bfloat16"),
        dict(kernel="moe_stage1", tile=(64, 128, 128), dtype=fp8),
        dict(kernel="moe_stage2", tile=(64, 128, 64), dtype="bfloat16"),
        dict(kernel="moe_stage2", tile=(64, 128, 64), dtype="float16"),
        dict(kernel="moe_stage2", tile=(64, 128, 64), dtype="bfloat16", mode="reduce"),
        dict(kernel="moe_stage2", tile=(32, 128, 128), dtype=fp8),
        dict(kernel="conv3d", tile=(64, 64, 2, 2, 1), dtype="bfloat16"),
        dict(kernel="conv3d", tile=(128, 128, 2, 2, 1), dtype="bfloat16"),
    ]
    if arch == "gfx950":
        configs += [
            dict(kernel=kernel, tile=t, dtype="uint8" if kernel == "mx_a4w4" else fp8)
            for kernel, tiles in MX_TILES.items()
            for t in tiles
        ]
    configs += [dict(kernel="fmha_fp8", tile=t, dtype=fp8) for t in FMHA_TILES]
    configs += [dict(kernel="chunk_gdn_h", tile=t, dtype="bfloat16") for t in GDN_TILES]
    return [dict(cfg, mma=mma, tile=list(cfg["tile"])) for cfg in configs]


def registry_configs(arch: str, tile_ks: set[int]) -> list[dict]:
    """Every tile the registries offer `arch` whose tile_k is in `tile_ks`, for checking the
    register and LDS budget's estimate against the compiler: a16w16 in bf16, bpreshuffle and
    blockscale in fp8, both MoE stages in bf16 and fp8 (the GEMM kernels' widest operands)."""
    from aiter.ops.gemm.kernels import a8w8, a16w16
    from aiter.ops.moe.kernels import stages

    info = ARCHS[arch]
    mma, fp8 = info.mma, info.fp8_dtype_name
    registries = [
        ("a16w16", a16w16.SUPPORTED_TILES, ("bfloat16",)),
        ("a8w8_bpreshuffle", a8w8.BPRESHUFFLE_TILES, (fp8,)),
        ("a8w8_blockscale", a8w8.BLOCKSCALE_TILES, (fp8,)),
        ("moe_stage1", stages.STAGE_TILES, ("bfloat16", fp8)),
        ("moe_stage2", stages.STAGE_TILES, ("bfloat16", fp8)),
    ]
    return [
        dict(kernel=kernel, tile=[t.tile_m, t.tile_n, t.tile_k], dtype=dtype, mma=mma)
        for kernel, tiles, dtypes in registries
        for t in tiles.get(mma, ())
        if t.tile_k in tile_ks
        for dtype in dtypes
    ]


def not_built(arch: str) -> list[str]:
    """Kernels default_configs leaves out for `arch`, with the module's reason."""
    mx = f"mx_a4w4, mx_fp8: {arch} has no MX GEMM kernel (aiter.ops.gemm.kernels.mx)"
    if arch == "gfx950":
        return []
    if ARCHS[arch].mma == "mfma":
        return [mx]
    return [
        "a8w8_blockscale: aiter.ops.gemm.kernels.a8w8 has no gfx1250 (WMMA) blockscale kernel",
        mx,
    ]


def config_label(cfg: dict) -> str:
    tile = cfg["tile"]
    shape = "x".join(str(t) for t in tile[:3])
    if cfg["kernel"] == "conv3d":
        shape = f"{tile[0]}x{tile[1]} w{tile[2]}x{tile[3]}"
    if cfg["kernel"] == "fmha_fp8":
        shape = f"bm{tile[0]} d{tile[1]}x{tile[2]}"
    if cfg["kernel"] == "chunk_gdn_h":
        shape = f"k{tile[0]} bv{tile[1]}"
    short = {"bfloat16": "bf16", "float16": "f16", "int8": "i8", "uint8": "fp4"}
    mode = f" {cfg['mode']}" if cfg.get("mode", MOE_STAGE2_MODE) != MOE_STAGE2_MODE else ""
    return f"{shape} {short.get(cfg['dtype'], 'fp8')}{mode}"


# --- launches (in the child) -----------------------------------------------------------------


def _empty(*shape, dtype=None):
    import torch

    return torch.empty(shape, dtype=dtype or torch.float32)


def _launch_a16w16(cfg: dict, dtype) -> None:
    from aiter.ops.gemm.kernels.a16w16 import GemmTile, launch_gemm_a16w16

    m, n, k = GEMM_MNK
    a, b, out = _empty(m, k, dtype=dtype), _empty(n, k, dtype=dtype), _empty(m, n, dtype=dtype)
    launch_gemm_a16w16(
        a, b, None, out, None, tile=GemmTile(*cfg["tile"]), split_k=1, mma=cfg["mma"]
    )


def _launch_a8w8(cfg: dict, dtype) -> None:
    import torch

    from aiter.ops.gemm.kernels import a8w8

    m, n, k = GEMM_MNK
    x, w = _empty(m, k, dtype=dtype), _empty(n, k, dtype=dtype)
    out, tile = _empty(m, n, dtype=torch.bfloat16), a8w8.A8W8Tile(*cfg["tile"])
    if cfg["kernel"] == "a8w8_bpreshuffle":
        launch, scales = a8w8.launch_gemm_a8w8_bpreshuffle, (_empty(m, 1), _empty(1, n))
    else:
        block = a8w8.BLOCKSCALE_BLOCK
        launch = a8w8.launch_gemm_a8w8_blockscale
        scales = (_empty(m, k // block), _empty(n // block, k // block))
    launch(x, w, *scales, out, None, None, tile=tile, split_k=1, mma=cfg["mma"])


def _routing(tile_m: int) -> tuple:
    import torch

    from aiter.ops.moe.kernels.sorting_index import sorting_sizes

    s = MOE_SIZES
    p, blocks = sorting_sizes(s["m"], s["topk"], s["experts"], tile_m)
    i32 = torch.int32
    return _empty(p, dtype=i32), _empty(p), _empty(blocks, dtype=i32), _empty(2, dtype=i32)


def _launch_moe(cfg: dict, dtype) -> None:
    import torch

    from aiter.ops.moe.kernels import stages
    from aiter.ops.shared.tiles import GemmTile

    s, tile = MOE_SIZES, GemmTile(*cfg["tile"])
    m, d, inter, e, topk = s["m"], s["model_dim"], s["inter"], s["experts"], s["topk"]
    quant = dtype.itemsize == 1
    out_dtype = torch.bfloat16 if quant else dtype  # fp8's out is the hidden (bf16) dtype
    routing = _routing(tile.tile_m)
    if cfg["kernel"] == "moe_stage1":
        scales = dict(a_scale=_empty(m, 1), w1_scale=_empty(e, 2 * inter, 1)) if quant else {}
        stages.launch_moe_stage1(
            _empty(m, d, dtype=dtype), _empty(e, 2 * inter, d, dtype=dtype), *routing,
            _empty(m * topk, inter, dtype=out_dtype), topk=topk, tile=tile, ksplit=1,
            activation="silu", gate_mode="separated", doweight=False, mma=cfg["mma"], **scales,
        )  # fmt: skip
        return
    scales = dict(a2_scale=_empty(m * topk, 1), w2_scale=_empty(e, d, 1)) if quant else {}
    mode = cfg.get("mode", MOE_STAGE2_MODE)
    workspace = _empty(*stages.stage2_workspace_shape(m, topk, d)) if mode == "reduce" else None
    stages.launch_moe_stage2(
        _empty(m * topk, inter, dtype=dtype), _empty(e, d, inter, dtype=dtype), *routing,
        _empty(m, d, dtype=out_dtype), topk=topk, tile=tile, mode=mode, apply_weight=True,
        mma=cfg["mma"], workspace=workspace, **scales,
    )  # fmt: skip


def _launch_conv3d(cfg: dict, dtype) -> None:
    from aiter.ops.conv3d.kernels import implicit_gemm as cv

    s = CONV_SHAPES
    geo = cv.conv3d_geometry(s["x"], s["w"], padding=s["padding"])
    cv.launch_conv3d(
        _empty(*geo.x_padded_shape(), dtype=dtype), _empty(*geo.packed_weight_shape(), dtype=dtype),
        None, _empty(*geo.out_shape("NDHWC"), dtype=dtype), None, geometry=geo,
        tile=cv.ConvTile(*cfg["tile"]), split_k=1, output_layout="NDHWC", mma=cfg["mma"],
    )  # fmt: skip


def _launch_fmha(cfg: dict, dtype) -> None:
    import torch

    from aiter.ops.fmha_fp8.kernels import flash_attn as fa

    s = FMHA_SIZES
    block_m, d, dv = cfg["tile"]
    b, sq, sk, hq, hkv = s["batch"], s["seqlen_q"], s["seqlen_k"], s["heads"], s["kv_heads"]
    fa.launch_flash_attn_fp8(
        _empty(b, sq, hq, d, dtype=dtype), _empty(b, sk, hkv, d, dtype=dtype),
        _empty(b, sk, hkv, dv, dtype=dtype), _empty(b, sq, hq, dv, dtype=torch.bfloat16),
        _empty(b, hq, sq), _empty(1), _empty(1), _empty(1), softmax_scale=d**-0.5, causal=True,
        block_m=block_m, rescale_threshold=6.0, num_kv_splits=1, interleave=True, mma=cfg["mma"],
    )  # fmt: skip


def _launch_gdn(cfg: dict, dtype) -> None:
    from aiter.ops.chunk_gdn_h.kernels import chunk_h as ch
    from aiter.ops.chunk_gdn_h.kernels.chunk_h_index import num_chunks

    s = GDN_SIZES
    k, block_v = cfg["tile"]
    b, t, h, hg, v = s["batch"], s["seqlen"], s["heads"], s["key_heads"], s["head_dim_v"]
    ch.launch_chunk_gdn_h(
        _empty(b, t, hg, k, dtype=dtype), _empty(b, t, h, k, dtype=dtype),
        _empty(b, t, h, v, dtype=dtype), _empty(b, t, h), None,
        _empty(b, num_chunks(t, 64), h, k, v, dtype=dtype), _empty(b, t, h, v, dtype=dtype),
        _empty(b, h, k, v), _empty(b, h, k, v), None, None, num_seqs=b, chunk_size=64,
        block_v=block_v, mma=cfg["mma"],
    )  # fmt: skip


def _launch_mx(cfg: dict, dtype) -> None:
    import torch

    from aiter.ops.gemm.kernels import mx

    fmt = "fp4" if cfg["kernel"] == "mx_a4w4" else "fp8"
    m, n, k = GEMM_MNK
    row = k // 2 if fmt == "fp4" else k
    a, b = _empty(m, row, dtype=dtype), _empty(n, row, dtype=dtype)
    scales = (_empty(*mx.mx_scale_shape(m, k), dtype=torch.uint8),
              _empty(*mx.mx_scale_shape(n, k), dtype=torch.uint8))  # fmt: skip
    out = _empty(m, n, dtype=torch.bfloat16)
    mx.launch_gemm_mx(fmt, a, b, *scales, None, out, None, None, tile=mx.MXTile(*cfg["tile"]),
                      split_k=1, mma=cfg["mma"])  # fmt: skip


_LAUNCHERS = {
    "a16w16": _launch_a16w16,
    "a8w8_bpreshuffle": _launch_a8w8,
    "a8w8_blockscale": _launch_a8w8,
    "mx_a4w4": _launch_mx,
    "mx_fp8": _launch_mx,
    "moe_stage1": _launch_moe,
    "moe_stage2": _launch_moe,
    "conv3d": _launch_conv3d,
    "fmha_fp8": _launch_fmha,
    "chunk_gdn_h": _launch_gdn,
}


# --- figures of one listing ------------------------------------------------------------------


def _atomic_counts(text: str) -> dict[str, int]:
    """Atomic instructions in the whole listing (epilogues included) by mnemonic, static."""
    counts: dict[str, int] = {}
    for mnemonic in re.findall(r"^\s*((?:global|buffer|flat)_atomic_\w+)", text, re.MULTILINE):
        counts[mnemonic] = counts.get(mnemonic, 0) + 1
    return counts


def profile_listing(text: str) -> dict:
    """Metadata, main-loop figures, occupancy and roofline estimate of one listing."""
    lst = isa.parse_listing(text)
    waves = lst.waves_per_block or 1
    row = dict(
        name=lst.name, arch=lst.arch, vgprs=lst.vgprs, agprs=lst.agprs, arch_vgprs=lst.arch_vgprs,
        sgprs=lst.sgprs, lds_bytes=lst.lds_bytes, vgpr_spills=lst.vgpr_spills,
        sgpr_spills=lst.sgpr_spills, scratch_bytes=lst.scratch_bytes, wave_size=lst.wave_size,
        waves_per_block=waves,
        occupancy=isa.occupancy(lst.arch, lst.arch_vgprs, lst.agprs, lst.lds_bytes, waves),
        atomics=_atomic_counts(text), loop=None, roofline=None,
    )  # fmt: skip
    loop = isa.main_loop(lst)
    if loop is not None:
        figures = isa.loop_figures(loop, lst.wave_size)
        row["loop"] = figures.to_dict()
        estimate = isa.roofline_estimate(lst.arch, figures, waves)
        row["roofline"] = None if estimate is None else vars(estimate)
    return row


def _child(arch: str, root: Path) -> None:
    """Child main: configs as JSON on stdin; one MARK line per config start and result."""
    import torch

    configs = json.load(sys.stdin)
    os.environ["FLYDSL_DEBUG_DUMP_ASM"] = "1"
    for idx, cfg in enumerate(configs):
        dump = root / f"{cfg['index']:03d}"
        os.environ["FLYDSL_DUMP_DIR"] = str(dump)
        print(MARK + json.dumps({"start": idx}), flush=True)
        result: dict = {"done": idx, "listings": []}
        try:
            _LAUNCHERS[cfg["kernel"]](cfg, getattr(torch, cfg["dtype"]))
        except Exception as exc:  # a launcher's refusal or a compile error: report, carry on
            result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        for path in sorted(dump.glob("*/*final_isa.s")):
            result["listings"].append(dict(profile_listing(path.read_text()), path=str(path)))
        print(MARK + json.dumps(result), flush=True)


# --- the parent ------------------------------------------------------------------------------


def _run_child(
    arch: str, configs: list[dict], root: Path, env: dict
) -> tuple[dict, bool, str, int]:
    """One child's results by position in `configs`, whether it started any config, its stderr
    tail and its return code."""
    try:
        child = subprocess.run(
            [sys.executable, __file__, "--child", arch, str(root)], input=json.dumps(configs),
            env=env, cwd=REPO, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
        )  # fmt: skip
        stdout, stderr, code = child.stdout, child.stderr, child.returncode
    except subprocess.TimeoutExpired as exc:
        stdout, stderr, code = exc.stdout or "", f"timed out after {CHILD_TIMEOUT} s", -1
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
    results, started = {}, False
    for line in stdout.splitlines():
        if line.startswith(MARK):
            message = json.loads(line[len(MARK) :])
            started = True
            if "done" in message:
                results[message["done"]] = message
    return results, started, stderr[-1500:], code


def _last_error(stderr: str) -> str:
    """The last 'LLVM ERROR' line of a child's stderr, else its last line (200 characters)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()] or ["(no stderr)"]
    errors = [line for line in lines if "LLVM ERROR" in line or "Error" in line]
    return (errors or lines)[-1][:200]


def profile_configs(
    arch: str, configs: list[dict], root: Path | None = None, rocm_path: str | None = None
) -> list[dict]:
    """Compile `configs` for `arch` in child processes and return one result per config:
    the config, "label", "listings" (profile_listing of each listing, with "path") and
    "error" when the launch raised or the child died while compiling it. Listings are written
    under `root` (a temporary directory, removed afterwards, when None)."""
    if root is None:
        with tempfile.TemporaryDirectory(prefix="kernel_profile_") as tmp:
            return profile_configs(arch, configs, Path(tmp), rocm_path)
    pending = [dict(cfg, index=i) for i, cfg in enumerate(configs)]
    done: list[dict] = []
    env = child_env(arch, root / f"cache_{arch}", rocm_path)
    while pending:
        results, started, stderr, code = _run_child(arch, pending, root / arch, env)
        finished = [dict(pending[i], **results[i]) for i in sorted(results)]
        done += finished
        pending = pending[len(finished) :]
        if not pending:
            break
        # The child died compiling pending[0] (or before its first config: then all of them).
        reason = f"child process died (exit code {code}): {_last_error(stderr)}"
        failed = pending[:1] if started else pending
        done += [dict(cfg, listings=[], error=reason) for cfg in failed]
        pending = pending[len(failed) :]
    for row in done:
        row["label"], row["arch"] = config_label(row), arch
    return done


# --- the table -------------------------------------------------------------------------------

HEADER = (
    "Static figures from the compiled ISA (FlyDSL's listings; nothing ran on a GPU). Per "
    "main-loop iteration per wave: global loads (bytes, buffer loads/all loads), LDS read/write "
    "bytes, MMAs, VALU instructions, exposed wait (a vmcnt/loadcnt wait before the first MMA "
    "forcing a load of the same iteration), inner loops nested in the main loop (e.g. waterfall "
    "loops). w/SIMD: waves per SIMD ('-': not modelled). FLOP/B = MMA FLOPs per issued global "
    "load byte. atomics: static count of atomic instructions in the whole kernel by mnemonic "
    "(e.g. MoE stage 2's adds into its output). "
    "'est. roof' = ESTIMATED ceiling min(peak, FLOP/B x HBM BW) as % of the spec-sheet peak of "
    "MI300X (gfx942) / MI355X (gfx950), assuming every issued byte comes from HBM (an upper-bound "
    "estimate that ignores caches); n/a for gfx1250 (no public peaks used here)."
)
COLUMNS = (
    ("kernel", 16), ("arch", 7), ("tile", 22), ("gload B (buf/all)", 18), ("LDS r/w B", 12),
    ("MMA", 32), ("VALU", 5), ("exp.wait", 8), ("inner", 5), ("VGPR+AGPR", 9), ("LDS", 6),
    ("spill v/s", 9), ("w/SIMD", 6), ("FLOP/B", 7), ("est. roof", 14), ("atomics", 24),
)  # fmt: skip


def _mma_text(loop: dict) -> str:
    return " + ".join(
        f"{n} {m.removeprefix('v_')}" for m, n in sorted(loop["mma_by_mnemonic"].items())
    )


def _atomics_text(atomics: dict[str, int]) -> str:
    parts = [f"{n} {m.split('_atomic_', 1)[1]}" for m, n in sorted(atomics.items())]
    return " + ".join(parts) or "-"


def _roof_text(roof: dict | None) -> str:
    if roof is None:
        return "n/a"
    kind = "mem" if roof["memory_bound"] else "comp"
    return f"{roof['fraction_of_peak'] * 100:.0f}% {kind} {roof['device']}"


def _cells(row: dict, lst: dict) -> list[str]:
    loop = lst["loop"]
    regs = f"{lst['arch_vgprs']}+{lst['agprs']}"
    occ = "-" if lst["occupancy"] is None else str(lst["occupancy"])
    spill = f"{lst['vgpr_spills']}/{lst['sgpr_spills']}"
    head = [row["kernel"], row["arch"], row["label"]]
    tail = [regs, str(lst["lds_bytes"]), spill, occ]
    atomics = _atomics_text(lst.get("atomics", {}))
    if loop is None:
        return head + ["(no MMA loop)", "", "", "", "", ""] + tail + ["", "", atomics]
    gload = f"{loop['global_load_bytes']} ({loop['buffer_load_count']}/{loop['global_load_count']})"
    flop_b = loop["mma_flops"] / loop["global_load_bytes"] if loop["global_load_bytes"] else None
    body = [
        gload, f"{loop['lds_read_bytes']}/{loop['lds_write_bytes']}", _mma_text(loop),
        str(loop["valu_count"]), "yes" if loop["exposed_wait"] else "no", str(loop["inner_loops"]),
    ]  # fmt: skip
    ratio = "inf" if flop_b is None else f"{flop_b:.1f}"
    return head + body + tail + [ratio, _roof_text(lst["roofline"]), atomics]


def format_table(rows: list[dict]) -> str:
    """The header line and one line per (kernel, arch, tile) GEMM listing; failures and
    listings without an MMA loop are listed too."""
    lines = [HEADER, "  ".join(name.ljust(width) for name, width in COLUMNS)]
    failures = []
    for row in rows:
        gemms = [lst for lst in row["listings"] if lst["loop"] is not None]
        for lst in gemms or row["listings"][:1]:
            lines.append(
                "  ".join(c.ljust(w) for c, (_, w) in zip(_cells(row, lst), COLUMNS, strict=True))
            )
        if row.get("error") or not row["listings"]:
            failures.append(f"  {row['kernel']} {row['arch']} {row['label']}: "
                            f"{row.get('error') or 'no listing written'}")  # fmt: skip
    if failures:
        lines += ["FAILED or skipped:"] + failures
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="gfx942,gfx950,gfx1250")
    parser.add_argument("--kernel", nargs="*", choices=KERNELS, help="default: all")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    parser.add_argument("--keep-listings", type=Path, help="keep the ISA listings here")
    parser.add_argument(
        "--sorting", action="store_true",
        help="also the MoE sorting kernels (benchmarks/sorting_profile.py's tables)",
    )  # fmt: skip
    parser.add_argument(
        "--registry-tiles", metavar="TILE_KS",
        help="instead of the representative configs, every registry tile with one of these "
        "comma-separated tile_k values (e.g. 128,256)",
    )  # fmt: skip
    parser.add_argument(
        "--emulated", nargs="+", type=Path, metavar="REPORT",
        help="instead: dynamic figures per kernel from emulated runs (op_tests/emulated/runner.py "
        "reports or --check --execute --report documents); see benchmarks/emulated_profile.py",
    )  # fmt: skip
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.emulated:
        import emulated_profile

        return emulated_profile.main(args.emulated, args.json)
    if args.child:
        _child(args.child[0], Path(args.child[1]))
        return 0
    rows, notes = [], []
    for arch in (a.strip() for a in args.arch.split(",") if a.strip()):
        if args.registry_tiles:
            configs = registry_configs(arch, {int(k) for k in args.registry_tiles.split(",")})
        else:
            configs = default_configs(arch)
        configs = [c for c in configs if not args.kernel or c["kernel"] in args.kernel]
        rows += profile_configs(arch, configs, args.keep_listings)
        notes += [f"  {arch}: {note}" for note in not_built(arch)]
    print(format_table(rows))
    if notes:
        print("Not built (unsupported by the kernel module):\n" + "\n".join(notes))
    if args.sorting:
        import sorting_profile

        archs = [a.strip() for a in args.arch.split(",") if a.strip()]
        facts = {arch: sorting_profile.profile_arch(arch) for arch in archs}
        work = [sorting_profile.work_per_lane(t) for t in sorting_profile.TOKENS]
        print("\n" + sorting_profile.format_tables(facts, work))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
