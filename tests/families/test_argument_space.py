"""Every call an entry accepts for a tabled row is replayed, or refused before any launch.

For a row of each family's default table, the entry's discrete arguments are enumerated from
what torch and the entry's signature allow (every dtype, layout, flag and optional tensor), not
from the replay's own variants. Each point is called in a naming dry run: when the row's lookup
serves it with FlyDSL, the kernels it asks for must be among those the replay's jobs of that row
ask for at the same axis value; when the entry refuses it, the error names an argument and no
kernel was asked for; calls another row or the heuristic serves belong to their own rows. (The
fmha_fp8 table lists shapes the runtime never looks up: every call of a row's shape is its.)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from aiter import dispatch
from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl import chunk_gdn_h as gdn_module
from aiter.aot.flydsl import conv3d as conv3d_module
from aiter.aot.flydsl import fmha_fp8 as fmha_module
from aiter.aot.flydsl import gemm as gemm_module
from aiter.aot.flydsl import moe as moe_module
from aiter.aot.flydsl.dry_run import dry_run
from aiter.aot.flydsl.jobs.family import row_ref
from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H
from aiter.ops.conv3d.table import CONV3D
from aiter.ops.fmha_fp8.table import FMHA_FP8
from aiter.ops.gemm.table import A8W8_BLOCKSCALE, A8W8_BPRESHUFFLE, A16W16
from aiter.ops.moe.table import FMOE
from aiter.tuning import Row, TableError, TableSpec

ARCH, CU_NUM = "gfx942", 304
# Dtypes a caller might pass: every kind the entries take, and some they do not.
FLOATS = (torch.bfloat16, torch.float16, torch.float32)
FP8S = (torch.float8_e4m3fnuz, torch.float8_e4m3fn)
REFUSALS = (ValueError, TypeError, NotImplementedError, TableError)


@dataclass
class Outcome:
    files: frozenset = frozenset()
    records: list = field(default_factory=list)
    error: BaseException | None = None


@contextmanager
def naming() -> Iterator[Callable[[Callable[[], object]], Outcome]]:
    """A probe: the kernel files and dispatch records of one call, or its error."""
    with dispatch.observe() as records, dry_run(ARCH, CU_NUM, bridge.MODE_NAME) as requests:

        def probe(call: Callable[[], object]) -> Outcome:
            first_request, first_record = len(requests), len(records)
            try:
                call()
            except REFUSALS as err:
                return Outcome(frozenset(r.path for r in requests[first_request:]), [], err)
            return Outcome(
                frozenset(r.path for r in requests[first_request:]), records[first_record:]
            )

        yield probe


def first_row(spec: TableSpec, **cells: str) -> Row:
    rows = [
        r
        for r in spec.load().rows
        if r["gfx"] == ARCH and all(r[name] == value for name, value in cells.items())
    ]
    assert rows, f"{spec.name} has no {ARCH} row with {cells}"
    return rows[0]


def replayed(module, row: Row, maxima: dict[str, int]) -> frozenset:
    """The kernel files a build of `row` compiles: every segment of every job of the row, as
    the replay's naming finds them (under the deployment maxima `maxima`)."""
    from aiter.aot.flydsl.replay.naming import name_job

    ref, files = row_ref(row), set()
    for job in module.FAMILY.jobs(ARCH, None, maxima):
        if job.info.row == ref:
            result = name_job(job, None)
            assert not result.message, f"the replay's job failed: {result.message}"
            files |= {Path(k.cache_dir) / k.file for s in result.segments for k in s.kernels}
    return frozenset(files)


def empty(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="cuda")


@dataclass(frozen=True)
class Point:
    label: str
    call: Callable[[], object]


def check_points(module, row: Row, points: list[Point], names, looked_up=True, maxima=None) -> dict:
    """Classify every point; assert the replay covers what the row serves and refusals are
    clear. `looked_up` False: the runtime never reads the table (a table of shapes), so every
    FlyDSL call of the row's shape is the row's. Returns the counts by class."""
    counts = {"replayed": 0, "refused": 0, "elsewhere": 0}
    covered = replayed(module, row, maxima or {})
    assert covered, f"the replay asks for no kernel of {row_ref(row)}"
    ref = row_ref(row)
    with naming() as probe:
        for point in points:
            outcome = probe(point.call)
            if outcome.error is not None:
                message = str(outcome.error)
                assert any(n in message for n in names), f"{point.label}: unclear: {message}"
                assert not outcome.files, f"{point.label}: refused after asking for kernels"
                counts["refused"] += 1
                continue
            mine = [
                r
                for r in outcome.records
                if r.backend == "flydsl" and (r.row == ref or not looked_up)
            ]
            if not mine:
                counts["elsewhere"] += 1
                continue
            missing = outcome.files - covered
            assert not missing, f"{point.label}: served by {ref} but not replayed: {missing}"
            counts["replayed"] += 1
    assert counts["replayed"], f"no point of {ref} was served by it: {counts}"
    return counts


# --- the families ---


@pytest.mark.slow  # 288 points; the other families' spaces stay in the inner loop
def test_gemm_a16w16_argument_space() -> None:
    row = first_row(A16W16, libtype="flydsl")
    m, n, k = row.int("M"), row.int("N"), row.int("K")
    points = []
    for dtype, b_float32, out_dtype, bias in itertools.product(
        FLOATS, (False, True), (None, *FLOATS, torch.int8), (None, *FLOATS)
    ):
        b_dtype = torch.float32 if b_float32 else dtype  # B unlike A, or like it

        def call(dtype=dtype, b_dtype=b_dtype, out_dtype=out_dtype, bias=bias):
            bias_t = empty((n,), bias) if bias is not None else None
            return _a16w16(m, n, k, dtype, b_dtype, out_dtype, bias_t)

        points.append(Point(f"A={dtype} B={b_dtype} out={out_dtype} bias={bias}", call))
    names = ("A", "B", "bias", "out_dtype")
    check_points(gemm_module, row, points, names)


def _a16w16(m, n, k, dtype, b_dtype, out_dtype, bias):
    from aiter.ops.gemm.entry import gemm_a16w16

    return gemm_a16w16(empty((m, k), dtype), empty((n, k), b_dtype), bias, out_dtype=out_dtype)


@pytest.mark.parametrize("spec", [A8W8_BPRESHUFFLE, A8W8_BLOCKSCALE], ids=lambda s: s.short_name)
def test_gemm_a8w8_argument_space(spec) -> None:
    from aiter.ops.gemm import entry

    row = first_row(spec, libtype="flydsl")
    m, n, k = row.int("M"), row.int("N"), row.int("K")
    bpreshuffle = spec is A8W8_BPRESHUFFLE
    shapes = entry.bpreshuffle_scale_shapes(m, n) if bpreshuffle else None
    if not bpreshuffle:
        shapes = entry.blockscale_scale_shapes(m, n, k)
    function = entry.gemm_a8w8_bpreshuffle if bpreshuffle else entry.gemm_a8w8_blockscale
    points = []
    for q_dtype, out_dtype, scale_dtype in itertools.product(
        (*FP8S, torch.int8, torch.bfloat16), FLOATS, (torch.float32, torch.bfloat16)
    ):

        def call(q_dtype=q_dtype, out_dtype=out_dtype, scale_dtype=scale_dtype):
            return function(
                empty((m, k), q_dtype),
                empty((n, k), q_dtype),
                empty(shapes[0], scale_dtype),
                empty(shapes[1], scale_dtype),
                out_dtype=out_dtype,
            )

        points.append(Point(f"q={q_dtype} out={out_dtype} scales={scale_dtype}", call))
    names = ("XQ", "WQ", "x_scale", "w_scale", "out_dtype")
    check_points(gemm_module, row, points, names)


def test_moe_argument_space() -> None:
    from aiter.ops.moe.entry import fused_moe

    row = first_row(FMOE)
    tokens, model_dim, inter = row.int("token"), row.int("model_dim"), row.int("inter_dim")
    experts, topk = row.int("expert"), row.int("topk")
    dtype = getattr(torch, row["dtype"].removeprefix("torch."))
    points = []
    for activation, gate_mode, masked, local, bias, doweight in itertools.product(
        ("silu", "swiglu", "gelu"),
        ("separated", "interleave", "mixed"),
        (False, True),
        (False, True),
        (False, True),
        (False, True),
    ):

        def call(activation=activation, gate_mode=gate_mode, masked=masked, local=local,
                 bias=bias, doweight=doweight):  # fmt: skip
            kwargs = {}
            if masked:
                kwargs["expert_mask"] = empty((experts,), torch.int32)
            if local:
                kwargs["num_local_tokens"] = empty((1,), torch.int32)
            if bias:
                kwargs["bias1"] = empty((experts, 2 * inter), torch.float32)
                kwargs["bias2"] = empty((experts, model_dim), torch.float32)
            return fused_moe(
                empty((tokens, model_dim), dtype),
                empty((experts, 2 * inter, model_dim), dtype),
                empty((experts, model_dim, inter), dtype),
                empty((tokens, topk), torch.float32),
                empty((tokens, topk), torch.int32),
                activation=activation,
                gate_mode=gate_mode,
                doweight_stage1=doweight,
                **kwargs,
            )

        label = f"{activation} {gate_mode} mask={masked} local={local} bias={bias} w1={doweight}"
        points.append(Point(label, call))
    names = ("activation", "gate_mode", "bias1", "bias2", "expert_mask", "num_local_tokens")
    check_points(moe_module, row, points, names)


def test_conv3d_argument_space() -> None:
    from aiter.ops.conv3d.entry import conv3d

    row = first_row(CONV3D)
    n, c, d, h, w, k = (row.int(name) for name in ("N", "C", "D", "H", "W", "K"))
    kernel = tuple(row.int(name) for name in ("kT", "kH", "kW"))
    groups = row.int("groups")
    stride = tuple(row.int(f"stride_{a}") for a in "dhw")
    padding = tuple(row.int(f"pad_{a}") for a in "dhw")
    dilation = tuple(row.int(f"dil_{a}") for a in "dhw")
    points = []
    layouts = ("NCDHW", "NDHWC", "NHWC")
    for dtype, input_layout, output_layout, bias in itertools.product(
        FLOATS, layouts, layouts, (None, *FLOATS)
    ):

        def call(dtype=dtype, input_layout=input_layout, output_layout=output_layout, bias=bias):
            shape = (n, c, d, h, w) if input_layout != "NDHWC" else (n, d, h, w, c)
            return conv3d(
                empty(shape, dtype),
                empty((k, c // groups, *kernel), dtype),
                empty((k,), bias) if bias is not None else None,
                stride=stride,
                padding=padding,
                dilation=dilation,
                groups=groups,
                input_layout=input_layout,
                output_layout=output_layout,
            )

        points.append(Point(f"{dtype} {input_layout}->{output_layout} bias={bias}", call))
    names = ("x", "weight", "bias", "input_layout", "output_layout")
    check_points(conv3d_module, row, points, names)


# A short-context deployment: its queries and keys never reach the plan's KV split.
FMHA_ROWS = [
    "gfx942,304,8,1,128,128,dense,1,2,512,short",
    "gfx942,304,8,1,128,128,varlen,1,2,512,short",
]


@pytest.mark.slow  # naming a row's whole grid takes seconds
@pytest.mark.parametrize("layout", ["dense", "varlen"])
def test_fmha_fp8_argument_space(layout, tmp_path, monkeypatch) -> None:
    from aiter.ops.fmha_fp8.entry import flash_attn_fp8

    header = ",".join(FMHA_FP8.header)
    (tmp_path / FMHA_FP8.name).write_text("\n".join([header, *FMHA_ROWS]) + "\n")
    monkeypatch.setenv("AITER_CONFIG_DIR", str(tmp_path))
    row = first_row(FMHA_FP8, layout=layout)
    hq, hkv = row.int("num_heads"), row.int("num_kv_heads")
    d, dv = row.int("head_dim"), row.int("head_dim_v")
    causal = row["causal"] in ("1", "true", "True")
    batch, seqlen_q, seqlen_k = 1, 1, row.int("max_seqlen")
    points = []
    for q_dtype, return_lse, splits, descale in itertools.product(
        (*FP8S, torch.bfloat16), (False, True), (None, 1, 2), (torch.float32, torch.bfloat16)
    ):

        def call(q_dtype=q_dtype, return_lse=return_lse, splits=splits, descale=descale):
            scales = {
                name: empty((1,), descale) for name in ("q_descale", "k_descale", "v_descale")
            }
            if layout == "varlen":
                return flash_attn_fp8(
                    empty((batch * seqlen_q, hq, d), q_dtype),
                    empty((batch * seqlen_k, hkv, d), q_dtype),
                    empty((batch * seqlen_k, hkv, dv), q_dtype),
                    causal=causal,
                    cu_seqlens_q=empty((batch + 1,), torch.int32),
                    cu_seqlens_kv=empty((batch + 1,), torch.int32),
                    max_seqlen_q=seqlen_q,
                    max_seqlen_kv=seqlen_k,
                    num_kv_splits=splits,
                    return_lse=return_lse,
                    **scales,
                )
            return flash_attn_fp8(
                empty((batch, seqlen_q, hq, d), q_dtype),
                empty((batch, seqlen_k, hkv, d), q_dtype),
                empty((batch, seqlen_k, hkv, dv), q_dtype),
                causal=causal,
                num_kv_splits=splits,
                return_lse=return_lse,
                **scales,
            )

        points.append(
            Point(f"q={q_dtype} lse={return_lse} splits={splits} descale={descale}", call)
        )
    names = ("q", "k", "v", "q_descale", "num_kv_splits")
    check_points(fmha_module, row, points, names, looked_up=False)


@pytest.mark.slow  # naming a row's whole grid takes seconds
@pytest.mark.parametrize("varlen", ["0", "1"])
def test_chunk_gdn_h_argument_space(varlen) -> None:
    from aiter.aot.flydsl.dry_run import host_tensor
    from aiter.ops.chunk_gdn_h.entry import chunk_gated_delta_rule_fwd_h

    row = first_row(CHUNK_GDN_H, N="1", is_varlen=varlen)
    h, hg, k, v = (row.int(c) for c in ("H", "Hg", "K", "V"))
    tokens = row.int("T_flat")
    points = []
    for dtype, g, gk, h0, final, save, cu in itertools.product(
        FLOATS,
        (None, torch.float32, torch.bfloat16),
        (None, torch.float32),
        (None, *FLOATS),
        (False, True),
        (True, False),
        (None, torch.int32, torch.int64),
    ):
        if (cu is None) == (varlen == "1"):
            continue  # the other layout's points belong to its own row

        def call(dtype=dtype, g=g, gk=gk, h0=h0, final=final, save=save, cu=cu):
            b, t = (1, tokens) if cu is not None else (1, tokens)
            return chunk_gated_delta_rule_fwd_h(
                empty((b, t, hg, k), dtype), empty((b, t, h, k), dtype),
                empty((b, t, h, v), dtype),
                g=empty((b, t, h), g) if g is not None else None,
                gk=empty((b, t, h, k), gk) if gk is not None else None,
                initial_state=empty((1, h, k, v), h0) if h0 is not None else None,
                output_final_state=final, save_new_value=save,
                cu_seqlens=host_tensor([0, tokens], cu) if cu is not None else None,
            )  # fmt: skip

        points.append(
            Point(f"dtype={dtype} g={g} gk={gk} h0={h0} final={final} save={save} cu={cu}", call)
        )
    names = ("k", "w", "u", "g", "gk", "initial_state", "cu_seqlens")
    counts = check_points(gdn_module, row, points, names)
    assert counts["refused"] and counts["elsewhere"], counts
