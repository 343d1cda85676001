"""Jobs an AOT module makes: a row's bucket (the top row up to the deployment's maximum), one
job per caller variant, ranges cut at the maximum, a family's own variants, lookup and runs of a
runtime function, and grid jobs along every edge."""

from __future__ import annotations

import pytest

from aiter.aot.flydsl.jobs.family import Family, grid_jobs, job_info
from aiter.aot.flydsl.jobs.records import JobInfo
from aiter.aot.flydsl.replay.naming import replayed_ranges as _replayed_ranges
from aiter.tuning import BucketAxis, Column, TableSpec

HEADER = "gfx,cu_num,tokens,experts\n"


def _family(tmp_path, rows: str, declared=None, **choices) -> Family:
    (tmp_path / "t.csv").write_text(HEADER + rows)
    spec = TableSpec(
        name="t.csv",
        short_name="t",
        env_var="AITER_TEST_JOBS_T",
        columns=(Column("gfx", "str"), Column("cu_num", "int"), Column("tokens", "int"),
                 Column("experts", "int")),  # fmt: skip
        key=("gfx", "cu_num", "experts", "tokens"),
        axis=BucketAxis("tokens", "tokens", default_max=4096),
        open_choices=choices,
        directory=tmp_path,
    )
    return Family(
        name="t", tables=(spec,), caller=lambda spec, row, variant: print, **(declared or {})
    )


def _ranges(jobs) -> list[tuple[str, int, int, int | None]]:
    return [(j.info.row.rsplit(":", 1)[1], j.info.lo, j.info.hi, j.info.tabled) for j in jobs]


ROWS = "gfx942,304,16,8\ngfx942,304,128,8\ngfx942,304,64,16\ngfx950,256,16,8\n"


def test_buckets_and_the_top_row_up_to_the_maximum(tmp_path) -> None:
    jobs = _family(tmp_path, ROWS).jobs("gfx942", None, {})
    # rows 2 and 3 are one shape (experts 8); row 4 is alone; the spec's default max is 4096
    assert _ranges(jobs) == [("2", 1, 16, 16), ("3", 17, 4096, 128), ("4", 1, 4096, 64)]
    assert {j.info.axis for j in jobs} == {"tokens"}


def test_the_deployment_maximum_cuts_ranges(tmp_path) -> None:
    jobs = _family(tmp_path, ROWS).jobs("gfx942", None, {"tokens": 100})
    assert _ranges(jobs) == [("2", 1, 16, 16), ("3", 17, 100, None), ("4", 1, 100, 64)]
    jobs = _family(tmp_path, ROWS).jobs("gfx942", None, {"tokens": 10})
    assert _ranges(jobs) == [("2", 1, 10, None), ("4", 1, 10, None)]


def test_one_job_per_open_choice_and_cu_filter(tmp_path) -> None:
    family = _family(tmp_path, ROWS, flavour=("a", "b"))
    jobs = family.jobs("gfx942", frozenset({304}), {})
    assert [j.info.variant for j in jobs] == ["flavour=a", "flavour=b"] * 3
    assert family.jobs("gfx942", frozenset({80}), {}) == []


def test_job_info_is_filled_from_the_family_spec_row_and_variant(tmp_path) -> None:
    family = _family(tmp_path, ROWS)
    spec, row = family.tables[0], family.tables[0].load().rows[1]
    info = job_info(family, spec, row, {"flavour": "a", "size": "2"}, 17, 4096, tabled=128)
    assert info == JobInfo(
        module="t", table="t.csv", row=f"{tmp_path / 't.csv'}:3", arch="gfx942", cu_num=304,
        variant="flavour=a size=2", axis="tokens", lo=17, hi=4096, tabled=128,
    )  # fmt: skip


def test_a_family_declares_its_rows_variants(tmp_path) -> None:
    def variants(spec, row):  # rows with many experts also run a "wide" variant
        base = spec.variants()
        return base + [{**v, "wide": "yes"} for v in base] if row.int("experts") > 8 else base

    family = _family(tmp_path, ROWS, {"variants": variants}, flavour=("a", "b"))
    jobs = family.jobs("gfx942", None, {})
    assert [(j.info.row.rsplit(":", 1)[1], j.info.variant) for j in jobs] == [
        ("2", "flavour=a"), ("2", "flavour=b"), ("3", "flavour=a"), ("3", "flavour=b"),
        ("4", "flavour=a"), ("4", "flavour=b"), ("4", "flavour=a wide=yes"),
        ("4", "flavour=b wide=yes"),
    ]  # fmt: skip


# Two shapes (experts 8 and 16) in rows 2 and 4 / 3 and 5; the runtime pads tokens to a power of
# two and serves only a row tabled at the padded count exactly.
SHAPES = "gfx942,304,64,8\ngfx942,304,16,16\ngfx942,304,100,8\ngfx942,304,256,16\n"


def _exact_padded(spec, rows, tokens):
    padded = 1 << (tokens - 1).bit_length()
    return next((r for r in rows if r.int("tokens") == padded), None)


def _padded_runs(tmp_path, **declared):
    declared = {"serving": _exact_padded, "segment_by": lambda t: (t - 1).bit_length(), **declared}
    jobs = _family(tmp_path, SHAPES, declared).jobs("gfx942", None, {"tokens": 300})
    return _ranges(jobs)


def test_runs_of_a_runtime_function_go_to_the_row_the_lookup_serves_or_the_nearest(
    tmp_path,
) -> None:
    # Shape by shape, one job per padded run (1, 2, 3-4, ... 257-300); a run no row serves is the
    # job of the row nearest its start, with no tabled value (row 4, tabled 100, serves nothing).
    assert _padded_runs(tmp_path) == [
        ("2", 1, 1, None), ("2", 2, 2, None), ("2", 3, 4, None), ("2", 5, 8, None),
        ("2", 9, 16, None), ("2", 17, 32, None), ("2", 33, 64, 64),
        ("2", 65, 128, None),  # 64 is nearer to 65 than 100
        ("4", 129, 256, None), ("4", 257, 300, None),
        ("3", 1, 1, None), ("3", 2, 2, None), ("3", 3, 4, None), ("3", 5, 8, None),
        ("3", 9, 16, 16), ("3", 17, 32, None), ("3", 33, 64, None), ("3", 65, 128, None),
        ("5", 129, 256, 256), ("5", 257, 300, None),
    ]  # fmt: skip


def test_runs_no_row_serves_are_left_out_when_the_family_says_so(tmp_path) -> None:
    assert _padded_runs(tmp_path, replay_unserved=False) == [
        ("2", 33, 64, 64), ("3", 9, 16, 16), ("5", 129, 256, 256)
    ]  # fmt: skip


def test_a_lookup_without_runs_of_its_own_cuts_where_the_served_row_changes(tmp_path) -> None:
    # A tabled value serves itself; row 2 (64) also lends itself to 17..120, around row 4 (100),
    # which bisection alone would not see (no power of two near it) but the tabled values are
    # probed. Jobs come in table order of their rows, each row's runs in axis order.
    def lends(spec, rows, tokens):
        by_value = {r.int("tokens"): r for r in rows}
        if tokens in by_value:
            return by_value[tokens]
        return by_value.get(64) if 17 <= tokens <= 120 else None

    family = _family(tmp_path, SHAPES, {"serving": lends, "replay_unserved": False})
    assert _ranges(family.jobs("gfx942", None, {})) == [
        ("2", 17, 99, 64), ("2", 101, 120, None), ("3", 16, 16, 16), ("4", 100, 100, 100),
        ("5", 256, 256, 256),
    ]  # fmt: skip


def test_table_order_is_kept_when_a_shape_s_rows_are_apart(tmp_path) -> None:
    rows = "gfx942,304,128,8\ngfx942,304,64,16\ngfx942,304,16,8\n"
    jobs = _family(tmp_path, rows).jobs("gfx942", None, {})
    assert _ranges(jobs) == [("2", 17, 4096, 128), ("3", 1, 4096, 64), ("4", 1, 16, 16)]


def _grid_row(tmp_path):
    family = _family(tmp_path, ROWS, {"grid": lambda spec, row, maxima: {}})
    return family, family.tables[0], family.tables[0].load().rows[0]


def test_grid_jobs_run_along_every_edge(tmp_path) -> None:
    family, spec, row = _grid_row(tmp_path)
    jobs = grid_jobs(family, spec, row, {}, {"batch": [1, 4], "seqlen": [16, 256, 1024]})
    edges = {(j.info.axis, j.info.lo, j.info.hi, tuple(j.info.fixed.items())) for j in jobs}
    assert edges == {
        ("batch", 1, 4, (("seqlen", 16),)),
        ("batch", 1, 4, (("seqlen", 256),)),
        ("batch", 1, 4, (("seqlen", 1024),)),
        ("seqlen", 16, 256, (("batch", 1),)),
        ("seqlen", 256, 1024, (("batch", 1),)),
        ("seqlen", 16, 256, (("batch", 4),)),
        ("seqlen", 256, 1024, (("batch", 4),)),
        ("batch", 4, 4, (("seqlen", 1024),)),  # the far corner, replayed as a point
    }
    cells = [j.info.cell for j in jobs if j.info.cell]
    assert {"batch": [1, 4], "seqlen": [16, 256]} in cells and len(cells) == 6
    assert {j.info.group for j in jobs} == {f"{tmp_path / 't.csv'}:2"}
    assert {(j.info.table, j.info.arch, j.info.cu_num, j.info.tabled) for j in jobs} == {
        ("t.csv", "gfx942", 304, None)
    }


def test_a_grid_family_makes_each_row_s_grid_per_variant(tmp_path) -> None:
    def grid(spec, row, maxima):
        return {"batch": [1, 2], "seqlen": [1, min(row.int("tokens"), maxima.get("tokens", 99))]}

    family = _family(tmp_path, ROWS, {"grid": grid}, flavour=("a", "b"))
    jobs = family.jobs("gfx950", None, {"tokens": 8})  # row 5 only: seqlen 1 and 8
    assert {(j.info.variant, j.info.group.rsplit(" ", 1)[1]) for j in jobs} == {
        ("flavour=a", "flavour=a"), ("flavour=b", "flavour=b")
    }  # fmt: skip
    assert {(j.info.axis, j.info.lo, j.info.hi) for j in jobs if j.info.variant == "flavour=a"} == {
        ("batch", 1, 2), ("seqlen", 1, 8), ("batch", 2, 2)
    }  # fmt: skip


def test_grid_values_must_be_positive(tmp_path) -> None:
    family, spec, row = _grid_row(tmp_path)
    with pytest.raises(ValueError, match="grid axis 'batch'"):
        grid_jobs(family, spec, row, {}, {"batch": [0, 2]})


def test_a_module_limit_refuses_in_between_values_but_not_tabled_ones(tmp_path) -> None:
    job = _family(tmp_path, ROWS).jobs("gfx942", None, {})[1].info  # tokens 17-4096, row 128
    assert _replayed_ranges(job, None) == ([(17, 4096)], "")
    ranges, refused = _replayed_ranges(job, 100)
    assert ranges == [(17, 100), (128, 128)]
    assert refused == (
        "in-between tokens 101-4096 above the module's limit 100 not replayed "
        "(the tabled tokens 128 is)"
    )
