"""Tests of aiter.aot.flydsl.execution.fingerprint: which changes move the fingerprint and which do not,
the files and variables it covers, and that it stays light (no torch, milliseconds).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from aiter import flydsl_bridge as bridge
from aiter.aot.flydsl.execution import fingerprint
from aiter.aot.flydsl.execution.fingerprint import (
    FingerprintInputs,
    compute,
    describe,
    fingerprint_env,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def inputs(tmp_path) -> FingerprintInputs:
    source = tmp_path / "aot_module.py"
    source.write_text("BLOCK = 64\n")
    default = tmp_path / "default.csv"
    default.write_text("M,N,K,kernel\n32,64,128,a\n")
    extra = tmp_path / "extra.csv"
    extra.write_text("M,N,K,kernel\n64,64,128,b\n")
    return FingerprintInputs(
        sources=(*fingerprint.package_sources()[:5], str(source)),
        tables=(str(default), str(extra)),
        env=fingerprint_env({"AITER_CONFIG_GEMM_BF16": str(extra)}),
        versions=(("aiter", "0.1.0"), ("flydsl", "0.4.2"), ("torch", "2.13.0")),
        targets=("gfx942:304", "gfx950"),
        options=(("max-M", "32768"),),
    )


def flip_one_byte(path: str) -> None:
    data = bytearray(Path(path).read_bytes())
    data[-2] ^= 0x01
    Path(path).write_bytes(bytes(data))


def test_same_inputs_same_hash(inputs) -> None:
    digest = compute(inputs)
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert compute(inputs) == digest
    assert compute(dataclasses.replace(inputs, env=tuple(inputs.env))) == digest


def test_one_byte_of_a_table_changes_the_hash(inputs) -> None:
    before = compute(inputs)
    flip_one_byte(inputs.tables[1])
    assert compute(inputs) != before


def test_one_byte_of_a_source_changes_the_hash(inputs) -> None:
    before = compute(inputs)
    flip_one_byte(inputs.sources[-1])
    assert compute(inputs) != before


def test_table_order_counts_source_order_does_not(inputs) -> None:
    before = compute(inputs)
    assert compute(dataclasses.replace(inputs, tables=inputs.tables[::-1])) != before
    assert compute(dataclasses.replace(inputs, sources=inputs.sources[::-1])) == before
    assert compute(dataclasses.replace(inputs, targets=inputs.targets[::-1])) == before


def test_a_table_moving_into_the_sources_changes_the_hash(inputs) -> None:
    moved = dataclasses.replace(
        inputs, sources=(*inputs.sources, inputs.tables[1]), tables=inputs.tables[:1]
    )
    assert compute(moved) != compute(inputs)


@pytest.mark.parametrize("name", bridge.KEY_ENV_VARS)
def test_a_flydsl_key_variable_changes_the_hash(inputs, name: str) -> None:
    changed = dataclasses.replace(inputs, env=fingerprint_env({name: "1"}))
    unchanged = dataclasses.replace(inputs, env=fingerprint_env({}))
    assert compute(changed) != compute(unchanged)


def test_an_aiter_variable_changes_the_hash(inputs) -> None:
    base = {"AITER_CONFIG_GEMM_BF16": "/t/a.csv"}
    digests = {
        compute(dataclasses.replace(inputs, env=fingerprint_env(environ)))
        for environ in (
            base,
            {"AITER_CONFIG_GEMM_BF16": "/t/b.csv"},
            {**base, "AITER_ANYTHING_NEW": "x"},
            {},
        )
    }
    assert len(digests) == 4


def test_gpu_archs_changes_the_hash(inputs) -> None:
    one = dataclasses.replace(inputs, env=fingerprint_env({"GPU_ARCHS": "gfx942"}))
    two = dataclasses.replace(inputs, env=fingerprint_env({"GPU_ARCHS": "gfx942;gfx950"}))
    assert compute(one) != compute(two)


def test_the_cache_dir_does_not_change_the_hash(inputs) -> None:
    environ = {"AITER_CONFIG_GEMM_BF16": "/t/a.csv"}
    moved = {**environ, bridge.ENV_CACHE_DIR: "/elsewhere/cache"}
    assert fingerprint_env(moved) == fingerprint_env(environ)
    assert compute(dataclasses.replace(inputs, env=fingerprint_env(moved))) == compute(
        dataclasses.replace(inputs, env=fingerprint_env(environ))
    )


def test_the_flydsl_version_changes_the_hash(inputs) -> None:
    newer = (("aiter", "0.1.0"), ("flydsl", "0.4.3"), ("torch", "2.13.0"))
    assert compute(dataclasses.replace(inputs, versions=newer)) != compute(inputs)


def test_a_target_changes_the_hash(inputs) -> None:
    before = compute(inputs)
    assert compute(dataclasses.replace(inputs, targets=("gfx942:304",))) != before
    assert compute(dataclasses.replace(inputs, targets=("gfx942:80", "gfx950"))) != before
    assert compute(dataclasses.replace(inputs, targets=(*inputs.targets, "gfx1250"))) != before


def test_an_option_changes_the_hash(inputs) -> None:
    before = compute(inputs)
    assert compute(dataclasses.replace(inputs, options=(("max-M", "16384"),))) != before
    assert compute(dataclasses.replace(inputs, options=())) != before


def test_a_name_value_pair_cannot_shift_between_fields(inputs) -> None:
    first = dataclasses.replace(inputs, options=(("ab", "c"),))
    second = dataclasses.replace(inputs, options=(("a", "bc"),))
    assert compute(first) != compute(second)


def test_an_unreadable_file_is_hashed_as_an_error(inputs, tmp_path) -> None:
    missing = str(tmp_path / "gone.csv")
    with_missing = dataclasses.replace(inputs, tables=(*inputs.tables, missing))
    digest = compute(with_missing)
    assert digest == compute(with_missing)
    Path(missing).write_bytes(b"")
    assert compute(with_missing) != digest
    Path(missing).unlink()
    summary = describe(with_missing)
    assert summary["digests"][missing].startswith("FileNotFoundError: ")
    directory = dataclasses.replace(inputs, sources=(*inputs.sources, str(tmp_path)))
    assert len(compute(directory)) == 64


def test_fingerprint_env_covers_key_aiter_and_arch_variables() -> None:
    environ = {
        "AITER_CONFIG_GEMM_BF16": "/t/a.csv",
        "FLYDSL_COMPILE_OPT_LEVEL": "3",
        "FLYDSL_RUNTIME_CACHE_DIR": "/c",
        "FLYDSL_RUNTIME_RUN_ONLY": "1",
        "HOME": "/root",
        "PATH": "/bin",
    }
    env = dict(fingerprint_env(environ))
    assert set(env) == {*bridge.KEY_ENV_VARS, "GPU_ARCHS", "AITER_CONFIG_GEMM_BF16"}
    assert env["FLYDSL_COMPILE_OPT_LEVEL"] == "3"
    assert env["FLYDSL_KTRACE_ENABLE"] == ""
    assert env["GPU_ARCHS"] == ""
    assert list(fingerprint_env(environ)) == sorted(fingerprint_env(environ))


def test_fingerprint_env_reads_os_environ_by_default(monkeypatch) -> None:
    monkeypatch.setenv("AITER_FINGERPRINT_PROBE", "on")
    assert ("AITER_FINGERPRINT_PROBE", "on") in fingerprint_env()


def test_package_versions_are_the_installed_ones() -> None:
    assert fingerprint.package_versions() == (
        ("aiter", metadata.version("aiter")),
        ("flydsl", metadata.version("flydsl")),
        ("torch", metadata.version("torch")),
    )


def test_package_versions_marks_a_missing_package(monkeypatch) -> None:
    real = metadata.version

    def version(name: str) -> str:
        if name == "torch":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    assert dict(fingerprint.package_versions())["torch"] == "missing"


def test_package_sources_cover_the_package(tmp_path) -> None:
    sources = fingerprint.package_sources()
    package = REPO / "aiter"
    relative = [Path(s).relative_to(package).as_posix() for s in sources]
    assert sources == sorted(sources)
    assert "ops/gemm/entry.py" in relative
    assert "flydsl_bridge/internals.py" in relative
    assert {r for r in relative if r.startswith("configs/") and r.endswith(".csv")} == {
        f"configs/{p.name}" for p in (package / "configs").glob("*.csv")
    }
    assert any(r.startswith("ops/gemm/kernels/") for r in relative)
    assert not [s for s in sources if "__pycache__" in s]
    assert all(s.endswith((".py", ".csv", ".so")) for s in sources)
    # The C++ host planner chooses MoE kernels: its built extension is part of the fingerprint.
    assert any(r.startswith("_moe_host") and r.endswith(".so") for r in relative)


def test_package_sources_append_extra_files_once(tmp_path) -> None:
    extra = tmp_path / "my_aot.py"
    extra.write_text("")
    own = REPO / "aiter" / "arch.py"
    sources = fingerprint.package_sources([extra, str(extra), own])
    assert sources[-1] == str(extra)
    assert sources.count(str(extra)) == 1
    assert sources.count(str(own)) == 1


def test_describe_is_json_and_names_files(inputs) -> None:
    summary = json.loads(json.dumps(describe(inputs)))
    # Package files are named relative to the checkout, files elsewhere absolutely.
    assert sorted(summary["sources"]) == sorted(
        [*(Path(s).relative_to(REPO).as_posix() for s in inputs.sources[:-1]), inputs.sources[-1]]
    )
    assert summary["tables"] == list(inputs.tables)
    assert summary["env"]["AITER_CONFIG_GEMM_BF16"] == inputs.tables[1]
    assert summary["versions"] == {"aiter": "0.1.0", "flydsl": "0.4.2", "torch": "2.13.0"}
    assert summary["targets"] == ["gfx942:304", "gfx950"]
    assert summary["options"] == {"max-M": "32768"}
    assert set(summary["digests"]) == {*summary["sources"], *summary["tables"]}


def test_hashing_the_package_takes_milliseconds() -> None:
    sources = fingerprint.package_sources()
    tables = tuple(s for s in sources if s.endswith(".csv"))
    inputs = FingerprintInputs(tuple(sources), tables, fingerprint_env({}), (), ("gfx942",), ())
    start = time.perf_counter()
    compute(inputs)
    assert time.perf_counter() - start < 0.5


def test_importing_fingerprint_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from aiter.aot.flydsl.execution import fingerprint as f\n"
        "i = f.FingerprintInputs(tuple(f.package_sources()), (), f.fingerprint_env(),"
        " f.package_versions(), ('gfx942',), ())\n"
        "f.compute(i); f.describe(i)\n"
        "print('torch' in sys.modules, 'flydsl' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.strip() == "False False"
