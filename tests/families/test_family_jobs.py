"""The jobs of the MoE and conv3d modules, made by the shared job code from what each declares
(MoE: per-row variants, the runtime's padded-token runs and lookup; conv3d: the runtime's lookup),
against the jobs the modules made on their own before (pinned, and transcribed as references).
"""

from __future__ import annotations

import dataclasses

import pytest

from aiter.aot.flydsl import conv3d, moe
from aiter.ops.conv3d.table import CONV3D
from aiter.ops.moe.table import ACT_SWIGLU, FMOE, SWIGLU_VARIANTS
from aiter.tuning import Row

ARCHS = ("gfx942", "gfx950", "gfx1250")
PADDED_RUNS = [(1, 1), (2, 2)] + [(2**k + 1, 2 ** (k + 1)) for k in range(1, 15)]


def _line(row: str) -> int:
    return int(row.rsplit(":", 1)[1])


def _tuples(jobs) -> list[tuple[int, int, int, str, int | None]]:
    return [(_line(j.info.row), j.info.lo, j.info.hi, j.info.variant, j.info.tabled) for j in jobs]


# --- MoE ---


def _old_moe_jobs(arch: str, top: int) -> list[tuple[int, int, int, str, int | None]]:
    """The jobs moe.make_jobs made before the shared code made them (transcribed): per shape, one
    run per padded token count (its own binary search), the row the runtime's lookup picks at
    the run's start or the shape's nearest row, the spec's variants and swiglu's biases."""
    from aiter.ops.moe.host_planner import get_padded_M
    from aiter.ops.moe.plan import tuned_row
    from aiter.tuning.spec import describe_variant

    runs, lo = [], 1
    while lo <= top:
        hi, step_hi = lo, top
        while hi < step_hi:
            mid = (hi + step_hi + 1) // 2
            hi, step_hi = (mid, step_hi) if get_padded_M(mid) == get_padded_M(lo) else (hi, mid - 1)
        runs.append((lo, hi))
        lo = hi + 1
    shapes: dict[tuple[str, ...], list[Row]] = {}
    for row in FMOE.load().rows:
        if row["gfx"] == arch:
            shapes.setdefault(tuple(row[n] for n in FMOE.key if n != "token"), []).append(row)
    jobs = []
    for rows in shapes.values():
        rows.sort(key=lambda r: r.int("token"))
        key = {name: rows[0][name] for name in FMOE.key if name != "token"}
        for lo, hi in runs:
            _, served = tuned_row(key, lo)
            row = served or min(rows, key=lambda r: abs(r.int("token") - lo))
            tabled = row.int("token") if served is not None else None
            variants = FMOE.variants()
            if row["act_type"] == ACT_SWIGLU:
                variants = [v | {"bias": b} for v in variants for b in SWIGLU_VARIANTS["bias"]]
            for variant in variants:
                tabled_here = tabled if tabled is not None and lo <= tabled <= hi else None
                jobs.append((row.line, lo, hi, describe_variant(variant), tabled_here))
    return jobs


@pytest.mark.parametrize("arch, first_line", [("gfx942", 2), ("gfx950", 98), ("gfx1250", 194)])
def test_moe_jobs_of_the_default_table_are_those_of_before(arch, first_line) -> None:
    jobs = moe.FAMILY.jobs(arch, None, {})
    # Pinned from the module's own job maker before the change: 6 shapes x 16 padded runs x 8
    # variants, every run of its own row (tabled at the run's top), shape by shape.
    assert len(jobs) == 768
    assert len({j.info.row for j in jobs}) == 96
    assert sorted({(j.info.lo, j.info.hi) for j in jobs}) == PADDED_RUNS
    assert all(j.info.tabled == j.info.hi for j in jobs)
    first, last = _tuples(jobs)[0], _tuples(jobs)[-1]
    assert first == (first_line, 1, 1, "gate_mode=separated local_tokens=all experts=all", 1)
    assert last == (
        first_line + 95, 16385, 32768, "gate_mode=interleave local_tokens=given experts=masked",
        32768,
    )  # fmt: skip
    assert _tuples(jobs) == _old_moe_jobs(arch, 32768)


@pytest.mark.parametrize("top", [100000, 700])
def test_moe_jobs_above_and_below_the_default_maximum_are_those_of_before(top) -> None:
    jobs = moe.FAMILY.jobs("gfx942", None, {"tokens": top})
    assert len(jobs) == {100000: 816, 700: 528}[top]
    assert _tuples(jobs) == _old_moe_jobs("gfx942", top)


def _moe_row(gfx: str, cu: int, token: int, act: str, doweight: int = 0) -> str:
    cells = dict.fromkeys(FMOE.header, "")
    bf16 = "torch.bfloat16"
    cells.update(
        gfx=gfx, cu_num=str(cu), token=str(token), model_dim="2048", inter_dim="256",
        expert="8", topk="2", act_type=act, dtype=bf16, q_dtype_a=bf16, q_dtype_w=bf16,
        q_type="QuantType.No", use_g1u1="1", doweight_stage1=str(doweight), block_m="0",
        ksplit="0", run_1stage="0",
    )  # fmt: skip
    return ",".join(cells[name] for name in FMOE.header)


def test_moe_swiglu_rows_add_bias_variants_and_unserved_runs_go_to_the_nearest_row(
    tmp_path, monkeypatch
) -> None:
    rows = [
        _moe_row("gfx942", 304, 512, "ActivationType.Silu"),
        _moe_row("gfx942", 304, 64, ACT_SWIGLU, doweight=1),
        _moe_row("gfx942", 304, 100, "ActivationType.Silu"),  # not a padded count: serves none
        _moe_row("gfx1250", 256, 512, "ActivationType.Silu"),
    ]
    (tmp_path / FMOE.name).write_text("\n".join([",".join(FMOE.header), *rows]) + "\n")
    monkeypatch.setenv("AITER_CONFIG_DIR", str(tmp_path))
    jobs = moe.FAMILY.jobs("gfx942", None, {"tokens": 512})
    assert _tuples(jobs) == _old_moe_jobs("gfx942", 512)
    # 10 runs up to 512: 8 variants each for silu, 16 for swiglu's biases.
    assert len(jobs) == 10 * 8 + 10 * 16
    silu = {(_line(j.info.row), j.info.lo, j.info.hi, j.info.tabled) for j in jobs[:80]}
    assert silu == {
        (4 if lo <= 256 else 2, lo, hi, 512 if lo == 257 else None)  # 100 is nearer up to 306
        for lo, hi in PADDED_RUNS[:10]
    }
    swiglu = jobs[80:]
    assert {_line(j.info.row) for j in swiglu} == {3}
    assert {j.info.tabled for j in swiglu if (j.info.lo, j.info.hi) == (33, 64)} == {64}
    assert sum(j.info.variant.endswith("bias=both") for j in swiglu) == 10 * 8


# --- conv3d ---


def _old_served_frames(row: Row, top: int) -> list[tuple[int, int]]:
    """conv3d.served_frames before the shared code found the runs (transcribed): a scan of every
    frame count up to where the row's output positions can no longer lend its tile."""
    from aiter.ops.conv3d.plan import find_row, row_geometry
    from aiter.ops.conv3d.table import BORROW_RATIO

    geometry = row_geometry(row)
    has_bias = row["bias"].strip().lower() in ("1", "true", "1.0")
    runs: list[tuple[int, int]] = []
    for frames in range(1, top + 1):
        try:
            call = dataclasses.replace(geometry, d=frames)
        except ValueError:
            continue
        if call.positions > BORROW_RATIO * geometry.positions:
            break
        if find_row(call, has_bias, row["gfx"], row.int("cu_num"))[0] == row:
            if runs and runs[-1][1] == frames - 1:
                runs[-1] = (runs[-1][0], frames)
            else:
                runs.append((frames, frames))
    return runs


def _old_conv3d_jobs(arch: str, top: int) -> list[tuple[int, int, int, str, int | None]]:
    from aiter.tuning.spec import describe_variant

    jobs = []
    for row in CONV3D.load().rows:
        if row["gfx"] == arch:
            for lo, hi in _old_served_frames(row, top):
                tabled = row.int("D") if lo <= row.int("D") <= hi else None
                for variant in CONV3D.variants():
                    jobs.append((row.line, lo, hi, describe_variant(variant), tabled))
    return jobs


def test_conv3d_jobs_of_the_default_table_are_those_of_before() -> None:
    for arch in ARCHS:
        jobs = conv3d.FAMILY.jobs(arch, None, {})
        # 29 runs x the entry's 2 input dtypes x 4 layout pairs (116 before fp16 was replayed)
        assert len(jobs) == 232
        assert _tuples(jobs) == _old_conv3d_jobs(arch, 32768)
    assert len(conv3d.FAMILY.jobs("gfx942", None, {"frames": 6})) == 168


def _conv_row(**cells: object) -> str:
    row = dict.fromkeys(CONV3D.header, "")
    row.update(
        gfx="gfx942", cu_num="80", N="1", C="32", D="8", H="8", W="8", K="32", kT="3", kH="3",
        kW="3", stride_d="1", stride_h="1", stride_w="1", pad_d="1", pad_h="1", pad_w="1",
        dil_d="1", dil_h="1", dil_w="1", groups="1", bias="1", tile_m="0", tile_n="0",
        wave_m="0", wave_n="0", wgm="0", splitK="0",
    )  # fmt: skip
    row.update({name: str(value) for name, value in cells.items()})
    return ",".join(row[name] for name in CONV3D.header)


def test_conv3d_runs_around_rows_that_serve_only_their_own_frames(tmp_path, monkeypatch) -> None:
    rows = [
        _conv_row(D=8),  # lends its tile to 2..12 frames
        _conv_row(D=13, libtype="torch"),  # serves only 13 frames
        _conv_row(D=21),  # nearer (by output positions) from 14 frames
        _conv_row(D=11, stride_d=2),  # another layer: 11 and 12 frames give equal positions
        _conv_row(D=12, stride_d=2, libtype="torch"),  # serves only 12, inside 11's frames
        _conv_row(D=3, kT=1, pad_d=0),  # a layer whose kernel has output from 1 frame
    ]
    (tmp_path / CONV3D.name).write_text("\n".join([",".join(CONV3D.header), *rows]) + "\n")
    monkeypatch.setenv("AITER_CONFIG_DIR", str(tmp_path))
    jobs = conv3d.FAMILY.jobs("gfx942", None, {"frames": 200})
    assert _tuples(jobs) == _old_conv3d_jobs("gfx942", 200)
    variants = len(CONV3D.variants())  # 2 dtypes x 4 layout pairs
    runs = [(_line(j.info.row), j.info.lo, j.info.hi, j.info.tabled) for j in jobs[::variants]]
    assert runs == [
        (2, 2, 12, 8), (3, 13, 13, 13), (4, 14, 84, 21),
        (5, 3, 11, 11), (5, 13, 48, None), (6, 12, 12, 12),
        (7, 1, 12, 3),
    ]  # fmt: skip
