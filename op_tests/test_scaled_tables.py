"""`python -m aiter.configs.generate --scale F`: tables F times the default size that the
runtime's own table checks accept, holding every default row."""

from __future__ import annotations

import sys

import pytest

from aiter.configs import generate
from aiter.ops.chunk_gdn_h.table import CHUNK_GDN_H
from aiter.ops.conv3d.table import CONV3D
from aiter.ops.fmha_fp8.table import FMHA_FP8
from aiter.ops.gemm.table import A8W8_BLOCKSCALE, A8W8_BPRESHUFFLE, A16W16
from aiter.ops.moe.table import FMOE
from aiter.tuning.spec import CONFIG_DIR, CONFIG_DIR_ENV

SPECS = (A16W16, A8W8_BPRESHUFFLE, A8W8_BLOCKSCALE, FMOE, CONV3D, FMHA_FP8, CHUNK_GDN_H)
SCALE = 3


def _generate(monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["generate", *args])
    generate.main()


@pytest.fixture(scope="module")
def scaled_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaled")
    with pytest.MonkeyPatch.context() as patch:
        _generate(patch, "--scale", str(SCALE), "--out-dir", str(out))
    return out


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_a_scaled_table_is_scale_times_the_default_and_holds_it(scaled_dir, spec) -> None:
    default = (CONFIG_DIR / spec.name).read_text().splitlines()
    scaled = (scaled_dir / spec.name).read_text().splitlines()
    assert scaled[0] == default[0]  # the same header
    assert len(scaled) - 1 == SCALE * (len(default) - 1)
    assert set(default[1:]) <= set(scaled[1:])
    assert len(set(scaled[1:])) == len(scaled) - 1  # no row written twice


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_the_runtime_accepts_every_scaled_row(scaled_dir, spec, monkeypatch) -> None:
    monkeypatch.setenv(CONFIG_DIR_ENV, str(scaled_dir))
    monkeypatch.delenv(spec.env_var, raising=False)
    assert spec.default_path == scaled_dir / spec.name
    table = spec.load()  # raises, naming file and row, on any cell the runtime would refuse
    rows = (scaled_dir / spec.name).read_text().count("\n") - 1
    assert len(table.rows) == rows


@pytest.mark.parametrize(
    "args, message",
    [
        (["--scale", "0", "--out-dir", "elsewhere"], "--scale must be a whole number"),
        (["--scale", "2"], "give an --out-dir other than aiter/configs"),
    ],
)
def test_bad_scales_are_refused_before_anything_is_written(
    args, message, monkeypatch, tmp_path, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    before = {p.name: p.read_text() for p in CONFIG_DIR.glob("*.csv")}
    with pytest.raises(SystemExit):
        _generate(monkeypatch, *args)
    assert message in capsys.readouterr().err
    assert {p.name: p.read_text() for p in CONFIG_DIR.glob("*.csv")} == before
    assert not (tmp_path / "elsewhere").exists()
