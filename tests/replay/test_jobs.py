"""Jobs an AOT module makes: a row's bucket (the top row up to the deployment's maximum), one
job per caller variant, ranges cut at the maximum, and grid jobs along every edge."""

from __future__ import annotations

import pytest

from aiter.aot.flydsl.jobs import Family, grid_jobs
from aiter.aot.flydsl.naming import replayed_ranges as _replayed_ranges
from aiter.tuning import BucketAxis, Column, TableSpec

HEADER = "gfx,cu_num,tokens,experts\n"


def _family(tmp_path, rows: str, **choices) -> Family:
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
    return Family(module="t", tables=(spec,), caller=lambda spec, row, variant: print)


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


def test_grid_jobs_run_along_every_edge(tmp_path) -> None:
    family = _family(tmp_path, "")
    jobs = grid_jobs(
        family, table="g", row="g.csv:2", arch="gfx942", cu_num=304, variant="",
        grid={"batch": [1, 4], "seqlen": [16, 256, 1024]}, call=print,
    )  # fmt: skip
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
    assert {j.info.group for j in jobs} == {"g.csv:2"}


def test_grid_values_must_be_positive(tmp_path) -> None:
    with pytest.raises(ValueError, match="grid axis 'batch'"):
        grid_jobs(
            _family(tmp_path, ""), table="g", row="r", arch="gfx942", cu_num=304,
            variant="", grid={"batch": [0, 2]}, call=print,
        )  # fmt: skip


def test_a_module_limit_refuses_in_between_values_but_not_tabled_ones(tmp_path) -> None:
    job = _family(tmp_path, ROWS).jobs("gfx942", None, {})[1].info  # tokens 17-4096, row 128
    assert _replayed_ranges(job, None) == ([(17, 4096)], "")
    ranges, refused = _replayed_ranges(job, 100)
    assert ranges == [(17, 100), (128, 128)]
    assert refused == (
        "in-between tokens 101-4096 above the module's limit 100 not replayed "
        "(the tabled tokens 128 is)"
    )
