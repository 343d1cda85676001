"""Tests of the JIT monitor (aiter.jit_monitor): settings, the miss message and its nearest-entry
ranking on fake parameters, the per-thread record, and, over a small GEMM cache built once for
gfx942, what serving does on a miss under AITER_JIT, FLYDSL_RUNTIME_RUN_ONLY and
AITER_AOT_FALLBACK (each in its own process: the settings are read once per process).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import types
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

from aiter import dispatch, jit_monitor
from aiter import flydsl_bridge as bridge
from aiter.flydsl_bridge import manifest, watching
from aiter.jit_monitor import (
    ABSENT,
    ALLOW,
    ENV_FALLBACK,
    ENV_JIT,
    ERROR,
    WARN,
    CachedEntry,
    JitCompileRefused,
    Miss,
    Settings,
)
from aiter.ops.gemm.table import (
    A16W16,
)
from tests.aot_cli import REPO, other_tables, run_aot

MANAGER_KEY = "0123456789abcdef0123456789abcdef"
GEMM_PARAMS = (
    ("a", "bfloat16"),
    ("b", "bfloat16"),
    ("c", "float32"),
    ("tile_m", "32"),
    ("tile_n", "64"),
    ("tile_k", "64"),
    ("split_k", "4"),
    ("has_bias", "False"),
    ("mma", "'mfma'"),
)


def _params(**changes: str) -> tuple[tuple[str, str], ...]:
    return tuple((name, changes.get(name, value)) for name, value in GEMM_PARAMS)


def _request(cache: Path, params=GEMM_PARAMS, module="aiter.ops.gemm.kernels.a16w16"):
    return bridge.KernelRequest(
        "gemm_a16w16", str(cache / f"gemm_a16w16_{MANAGER_KEY}"), "key", params, module=module
    )


def _record(row: str | None = None) -> dispatch.DispatchRecord:
    return dispatch.DispatchRecord(
        "gemm_a16w16",
        dispatch.BACKEND_FLYDSL,
        "flydsl_a16w16_mfma_32x64x64",
        "table" if row else "heuristic",
        row,
        {"split_k": 4},
        args={"A": "bfloat16[32, 4096] row-major", "B": "bfloat16[2048, 4096] row-major"},
        table=A16W16.short_name,
    )


@pytest.fixture
def monitor_state(monkeypatch):
    """A clean environment for the monitor, and the process's monitor state put back after."""
    for name in (ENV_JIT, ENV_FALLBACK, bridge.ENV_RUN_ONLY):
        monkeypatch.delenv(name, raising=False)
    jit_monitor.uninstall()
    yield
    jit_monitor.uninstall()


# --- settings ---


def test_settings_default_to_allow_without_fallback() -> None:
    assert Settings.from_env({}) == Settings(ALLOW, False, False)
    assert not Settings.from_env({}).listens


@pytest.mark.parametrize("value, policy", [("allow", ALLOW), ("warn", WARN), ("ERROR", ERROR)])
def test_settings_read_the_policy(value: str, policy: str) -> None:
    assert Settings.from_env({ENV_JIT: value}).policy == policy


def test_a_bad_policy_names_the_variable_and_the_choices() -> None:
    with pytest.raises(ValueError) as info:
        Settings.from_env({ENV_JIT: "loud"})
    assert str(info.value) == "AITER_JIT='loud': expected one of allow, warn, error (default allow)"


def test_a_bad_fallback_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match=r"AITER_AOT_FALLBACK='yes': expected 1 \(on\) or 0"):
        Settings.from_env({ENV_FALLBACK: "yes"})


def test_run_only_is_read_as_flydsl_reads_it() -> None:
    assert Settings.from_env({bridge.ENV_RUN_ONLY: "True"}).run_only
    assert not Settings.from_env({bridge.ENV_RUN_ONLY: "0"}).run_only
    assert Settings.from_env({bridge.ENV_RUN_ONLY: "1"}).listens


def test_a_bad_policy_fails_the_first_call_of_a_public_entry(monitor_state, monkeypatch) -> None:
    monkeypatch.setenv(ENV_JIT, "loud")
    with pytest.raises(ValueError, match="AITER_JIT='loud'"):
        dispatch.report(_record)
    monkeypatch.setenv(ENV_JIT, "warn")
    dispatch.report(_record)  # the installer stays until an installation succeeds
    assert jit_monitor.settings().policy == WARN


# --- the ranking and the message, on fake parameters ---


def test_parse_params_reads_what_describe_params_writes() -> None:
    params = (*GEMM_PARAMS, ("shape", "(1, 2)"))
    text = bridge.KernelRequest("f", "", "", params).describe_params()
    assert jit_monitor.parse_params(text) == params


def test_rank_nearest_puts_the_fewest_differences_first() -> None:
    entries = [
        CachedEntry("d/two.pkl", _params(split_k="1", c="bfloat16")),
        CachedEntry("d/one.pkl", _params(split_k="1")),
        CachedEntry("d/unknown.pkl", None),
    ]
    ranked = jit_monitor.rank_nearest(GEMM_PARAMS, entries)
    assert [n.entry.path for n in ranked] == ["d/one.pkl", "d/two.pkl", "d/unknown.pkl"]
    assert ranked[0].differs == (("split_k", "4", "1"),)
    assert ranked[1].differs == (("c", "float32", "bfloat16"), ("split_k", "4", "1"))
    assert ranked[2].differs == ()


def test_rank_nearest_breaks_ties_by_how_far_sizes_are() -> None:
    entries = [
        CachedEntry("d/split1.pkl", _params(split_k="1")),  # a factor of 4 away
        CachedEntry("d/split8.pkl", _params(split_k="8")),  # a factor of 2 away
        CachedEntry("d/wmma.pkl", _params(mma="'wmma'")),  # not a size: counts as 1
    ]
    ranked = jit_monitor.rank_nearest(GEMM_PARAMS, entries)
    assert [n.entry.path for n in ranked] == ["d/split8.pkl", "d/wmma.pkl", "d/split1.pkl"]


def test_rank_nearest_shows_parameters_one_side_lacks() -> None:
    theirs = (*GEMM_PARAMS[:-1], ("waves", "2"))
    (nearest,) = jit_monitor.rank_nearest(GEMM_PARAMS, [CachedEntry("d/x.pkl", theirs)])
    assert nearest.differs == (("mma", "'mfma'", ABSENT), ("waves", ABSENT, "2"))


def _miss(tmp_path: Path, record, nearest=(), entries=0, elsewhere=0) -> Miss:
    return Miss(
        headline="gemm_a16w16: FlyDSL kernel gemm_a16w16 is not in the kernel cache; because",
        request=_request(tmp_path),
        record=record,
        arch="gfx942",
        cu_num="304",
        cache_root=str(tmp_path),
        entries=entries,
        nearest=tuple(nearest),
        elsewhere=elsewhere,
        fix="add a row",
    )


def test_the_message_names_every_fact(tmp_path) -> None:
    nearest = jit_monitor.rank_nearest(
        GEMM_PARAMS, [CachedEntry("d/one.pkl", _params(split_k="1"), "t.csv:2, M 1-32")]
    )
    text = jit_monitor.format_miss(_miss(tmp_path, _record(), nearest, 1, 2))
    lines = text.splitlines()
    assert lines[0].startswith("gemm_a16w16: FlyDSL kernel gemm_a16w16 is not in the kernel")
    assert lines[1] == (
        "  call:    gemm_a16w16(A=bfloat16[32, 4096] row-major, B=bfloat16[2048, 4096] row-major)"
    )
    assert lines[2] == "  device:  gfx942, 304 CUs"
    assert (
        lines[3] == "  served:  untuned shape, heuristic -> flydsl_a16w16_mfma_32x64x64 split_k=4"
    )
    assert lines[4] == (
        "  kernel:  gemm_a16w16 [a=bfloat16 b=bfloat16 c=float32 tile_m=32 tile_n=64 tile_k=64 "
        "split_k=4 has_bias=False mma='mfma']"
    )
    assert lines[5].startswith(f"  entry:   {tmp_path}/gemm_a16w16_{MANAGER_KEY}/")
    assert lines[6] == (
        f"  cache:   {tmp_path} holds 1 other entry of gemm_a16w16 for this kernel source and "
        "arch; 2 more under other manager keys (another kernel source, FlyDSL version or arch); "
        "nearest 1:"
    )
    assert lines[7] == "    d/one.pkl (built for t.csv:2, M 1-32): split_k=1 (this call: 4)"
    assert lines[8] == "  fix:     add a row"


def test_the_message_names_the_row_that_served(tmp_path) -> None:
    text = jit_monitor.format_miss(_miss(tmp_path, _record("/t/bf16_tuned_gemm.csv:3")))
    assert "  served:  row /t/bf16_tuned_gemm.csv:3 -> flydsl_a16w16_mfma_32x64x64" in text
    assert "holds no entry of gemm_a16w16" in text


def test_the_message_without_a_record_says_so(tmp_path) -> None:
    text = jit_monitor.format_miss(_miss(tmp_path, None))
    assert "  call:    unknown: no aiter entry reported a call in this thread" in text
    assert "  served:  unknown" in text


def test_the_fix_for_an_untuned_shape_names_the_table_and_the_build(monkeypatch) -> None:
    monkeypatch.delenv("AITER_CONFIG_DIR", raising=False)
    fix = jit_monitor.fix_hint(_record(), "gfx942", "304", "/srv/cache")
    assert fix == (
        "add a row for this shape to bf16_tuned_gemm.csv (--csv gemm_a16w16=PATH) and rebuild: "
        "GPU_ARCHS=gfx942:304 python -m aiter.aot.flydsl --module gemm --csv gemm_a16w16=PATH "
        "--cache-dir /srv/cache"
    )


def test_the_fix_for_a_tuned_row_rebuilds_with_its_table(monkeypatch) -> None:
    monkeypatch.setenv("AITER_CONFIG_DIR", "/t")  # the build must read the tables serving reads
    fix = jit_monitor.fix_hint(_record("/t/extra.csv:7"), "gfx942", "304", "/srv/cache")
    assert fix.startswith(
        "the row is in /t/extra.csv: rebuild the cache with it: GPU_ARCHS=gfx942:304 "
        "AITER_CONFIG_DIR=/t python -m aiter.aot.flydsl --module gemm --csv "
        "gemm_a16w16=/t/extra.csv --cache-dir /srv/cache"
    )
    default = jit_monitor.fix_hint(_record("/t/bf16_tuned_gemm.csv:2"), "gfx942", "304", "")
    assert "--module gemm (a build replays M up to --max-m" in default
    assert "--max-m" in fix


def test_the_fix_without_a_table_builds_everything() -> None:
    fix = jit_monitor.fix_hint(None, "unknown", "unknown", "")
    assert fix == "build the cache for this operator and serve from it: python -m aiter.aot.flydsl"


def _fake_cache(root: Path) -> Path:
    """A cache with three entries of gemm_a16w16 (two in the manifest) and one under another
    manager key; the entries are empty files: only their names and the manifest are read."""
    kernel_dir = root / f"gemm_a16w16_{MANAGER_KEY}"
    kernel_dir.mkdir(parents=True)
    for name in ("one", "two", "three"):
        (kernel_dir / f"{name}.pkl").write_bytes(b"")
    (root / f"gemm_a16w16_{'f' * 32}").mkdir()
    (root / f"gemm_a16w16_{'f' * 32}" / "old.pkl").write_bytes(b"")
    (root / f"gemm_a16w16_splitk_reduce_{MANAGER_KEY}").mkdir()  # another function
    (root / f"gemm_a16w16_splitk_reduce_{MANAGER_KEY}" / "r.pkl").write_bytes(b"")
    asked = manifest.Requester(
        "gemm", "bf16_tuned_gemm.csv", "/t/bf16_tuned_gemm.csv:2", "M", 1, 32
    )

    def entry(params: tuple[tuple[str, str], ...], asked_by: int) -> manifest.KernelEntry:
        text = " ".join(f"{k}={v}" for k, v in params)
        return manifest.KernelEntry("gemm_a16w16", text, 0, "", requested_by=[asked] * asked_by)

    kernels = {
        f"{kernel_dir.name}/one.pkl": entry(_params(split_k="1"), 1),
        f"{kernel_dir.name}/two.pkl": entry(_params(split_k="8", c="bfloat16"), 2),
    }
    manifest.update_manifest(root, "gfx942", "gemm", kernels, {})
    return root


def test_cached_entries_reads_the_manifest_and_the_directory(tmp_path) -> None:
    cache = _fake_cache(tmp_path / "cache")
    entries, elsewhere = jit_monitor.cached_entries(_request(cache))
    by_path = {e.path.split("/")[1]: e for e in entries}
    assert set(by_path) == {"one.pkl", "two.pkl", "three.pkl"}
    assert by_path["one.pkl"].params == _params(split_k="1")
    assert by_path["one.pkl"].built_for == "bf16_tuned_gemm.csv:2, M 1-32"
    assert by_path["two.pkl"].built_for == "bf16_tuned_gemm.csv:2, M 1-32, and 1 more"
    assert by_path["three.pkl"].params is None
    assert elsewhere == 1


def _row_record(m: int) -> dispatch.DispatchRecord:
    """A call of M = m served by the row the fake cache's build replayed (M 1-32)."""
    return dataclasses.replace(_record("/srv/tables/bf16_tuned_gemm.csv:2"), axis={"M": m})


def test_the_fix_says_a_rebuild_cannot_help_where_the_build_replayed_the_call(tmp_path) -> None:
    """The cache's own build replayed the row at this M (another checkout of the same table) and
    never asked for this kernel: rebuilding would write the same cache, so the fix says so and
    names the gap."""
    cache = _fake_cache(tmp_path / "cache")
    fix = jit_monitor.fix_hint(_row_record(20), "gfx942", "304", str(cache), _request(cache))
    assert fix.startswith(
        "a rebuild cannot help: the build of this cache replayed row "
        "/srv/tables/bf16_tuned_gemm.csv:2 (M 1-32) and never asked for gemm_a16w16 ["
    )
    assert "at M=20; the replay does not reach this call" in fix
    assert f"{ENV_FALLBACK}=1" in fix and "rebuild the cache" not in fix


def test_the_fix_raises_the_maximum_for_a_call_beyond_the_replay(tmp_path) -> None:
    cache = _fake_cache(tmp_path / "cache")
    fix = jit_monitor.fix_hint(_row_record(40), "gfx942", "304", str(cache), _request(cache))
    assert fix.startswith(
        "the build of this cache replayed row /srv/tables/bf16_tuned_gemm.csv:2 at M 1-32, "
        "and this call's M is 40: rebuild with --max-m 40 or more: "
    )


def test_the_fix_rebuilds_an_entry_the_build_wrote_that_is_gone(tmp_path) -> None:
    cache = _fake_cache(tmp_path / "cache")
    request = _request(cache)
    kernels = dict(manifest.read(cache).archs["gfx942"]["gemm"])
    kernels[f"gemm_a16w16_{MANAGER_KEY}/{request.file_name}"] = kernels.pop(
        f"gemm_a16w16_{MANAGER_KEY}/one.pkl"
    )
    manifest.update_manifest(cache, "gfx942", "gemm", kernels, {})
    fix = jit_monitor.fix_hint(_row_record(20), "gfx942", "304", str(cache), request)
    assert fix.startswith("the build of this cache wrote this entry and it is gone: ")


def test_the_fix_for_a_row_no_build_of_the_cache_replayed_is_to_build_it(tmp_path) -> None:
    cache = _fake_cache(tmp_path / "cache")
    record = dataclasses.replace(_record("/srv/tables/bf16_tuned_gemm.csv:9"), axis={"M": 20})
    fix = jit_monitor.fix_hint(record, "gfx942", "304", str(cache), _request(cache))
    assert fix.startswith("the row is in /srv/tables/bf16_tuned_gemm.csv: rebuild the cache")


def test_describe_miss_lists_the_nearest_entries(tmp_path) -> None:
    from aiter import device

    cache = _fake_cache(tmp_path / "cache")
    with device.simulate("gfx942", 304):
        miss = jit_monitor.describe_miss(_request(cache), _record(), jit_monitor.REASON_ERROR)
    assert miss.headline == (
        "gemm_a16w16: FlyDSL kernel gemm_a16w16 is not in the kernel cache; "
        "AITER_JIT=error refuses to compile it"
    )
    assert (miss.arch, miss.cu_num, miss.entries, miss.elsewhere) == ("gfx942", "304", 3, 1)
    assert [n.entry.path.split("/")[1] for n in miss.nearest] == ["one.pkl", "two.pkl", "three.pkl"]
    assert miss.fix.startswith("add a row for this shape to bf16_tuned_gemm.csv")


def test_a_cache_that_is_off_is_said(tmp_path) -> None:
    request = bridge.KernelRequest("gemm_a16w16", "", "", GEMM_PARAMS, module="aiter.x")
    miss = jit_monitor.describe_miss(request, _record(), jit_monitor.REASON_RUN_ONLY)
    text = jit_monitor.format_miss(miss)
    assert "FlyDSL's disk cache is off" in text and "entry:" not in text


# --- the monitor in this process, with fake requests ---


def test_default_settings_leave_reports_free(monitor_state) -> None:
    dispatch.report(_record)  # the first report installs the monitor
    assert jit_monitor.settings() == Settings()
    assert not dispatch.listening()

    def build_record() -> dispatch.DispatchRecord:
        raise AssertionError("a record was built with no one listening")

    dispatch.report(build_record)


def test_the_monitor_keeps_the_last_record_of_each_thread(monitor_state) -> None:
    jit_monitor.install(Settings(policy=WARN))
    mine, theirs = _record(), _record("/t/bf16_tuned_gemm.csv:3")
    dispatch.report(lambda: mine)
    seen = []

    def other_thread() -> None:
        dispatch.report(lambda: theirs)
        seen.append(jit_monitor.last_record())

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen == [theirs] and jit_monitor.last_record() is mine
    jit_monitor.install(Settings())
    assert jit_monitor.last_record() is None and not dispatch.listening()


def test_error_refuses_a_compile_of_an_aiter_kernel(monitor_state, tmp_path) -> None:
    jit_monitor.install(Settings(policy=ERROR))
    dispatch.report(_record)
    with pytest.raises(JitCompileRefused) as info:
        watching._listener.compiling(_request(_fake_cache(tmp_path / "cache")))
    assert isinstance(info.value, RuntimeError)
    assert "AITER_JIT=error refuses to compile it" in str(info.value)
    assert "  call:    gemm_a16w16(A=bfloat16[32, 4096] row-major" in str(info.value)
    watching._listener.compiling(_request(tmp_path, module="tests.fixtures.tiny_kernels"))


def test_warn_logs_once_per_kernel(monitor_state, tmp_path, caplog) -> None:
    jit_monitor.install(Settings(policy=WARN))
    dispatch.report(_record)
    listener = watching._listener
    with caplog.at_level(logging.WARNING, logger="aiter.jit"):
        listener.compiling(_request(tmp_path))
        listener.compiling(_request(tmp_path))
        listener.compiling(_request(tmp_path, _params(split_k="8")))
    assert [r.name for r in caplog.records] == ["aiter.jit", "aiter.jit"]
    assert "AITER_JIT=warn" in caplog.records[0].getMessage()


def test_allow_says_nothing(monitor_state, tmp_path, caplog) -> None:
    jit_monitor.install(Settings(policy=ALLOW, run_only=True))  # listening, for run-only misses
    with caplog.at_level(logging.DEBUG, logger="aiter.jit"):
        watching._listener.compiling(_request(tmp_path))
    assert not caplog.records


def test_run_only_misses_get_the_message(monitor_state, tmp_path) -> None:
    jit_monitor.install(Settings(run_only=True))
    dispatch.report(_record)
    error = RuntimeError(f"{bridge.RUN_ONLY_MISS}gemm_a16w16: ...")
    replacement = watching._listener.run_only_miss(_request(tmp_path), error)
    assert isinstance(replacement, JitCompileRefused)
    assert "FLYDSL_RUNTIME_RUN_ONLY=1 forbids compiling it" in str(replacement)
    assert (
        watching._listener.run_only_miss(_request(tmp_path, module="user.kernels"), error) is None
    )


def test_the_aot_builder_is_left_alone(monitor_state, monkeypatch) -> None:
    main = types.ModuleType("__main__")
    main.__spec__ = ModuleSpec(bridge.AOT_BUILD_MAIN, None)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setenv(ENV_JIT, "error")
    assert bridge.in_aot_build()
    assert jit_monitor.install() == Settings() and not dispatch.listening()


# --- fallback order and kernel naming ---


def test_equivalent_choices_try_other_splits_then_the_heuristic() -> None:
    from aiter.ops.gemm import plan as gemm_plan
    from aiter.ops.shared.tiles import GemmTile

    family = gemm_plan.A16W16
    planned = gemm_plan.KernelChoice(family, "mfma", GemmTile(128, 64, 64), 4)
    variants = family.equivalent_choices(planned, 32, 4096, 4096, 304)
    heuristic = family.choose(32, 4096, 4096, 304, "mfma", None, 0)
    assert [(v.tile, v.split_k) for v in variants] == [
        (planned.tile, 1),
        (planned.tile, 2),
        (planned.tile, 8),
        (heuristic.tile, heuristic.split_k),
    ]


def test_serving_self_test_passes_and_names_a_moved_internal(monkeypatch) -> None:
    bridge.serving_self_test()
    monkeypatch.delattr(bridge.jit_function().JitFunction, "_build_full_cache_key")
    with pytest.raises(bridge.ReplayHookBroken, match=r"JitFunction\._build_full_cache_key"):
        bridge.serving_self_test()


def test_name_launches_names_what_a_launch_needs_and_runs_nothing() -> None:
    import torch

    from aiter.aot.flydsl.dry_run import dry_run
    from aiter.ops.gemm.kernels.a16w16 import launch_gemm_a16w16
    from aiter.ops.shared.tiles import GemmTile

    with dry_run("gfx942", 304, bridge.MODE_NAME) as requests:
        a = torch.empty((32, 4096), dtype=torch.bfloat16, device="cuda")
        b = torch.empty((2048, 4096), dtype=torch.bfloat16, device="cuda")
        out = torch.empty((32, 2048), dtype=torch.bfloat16, device="cuda")
        workspace = torch.empty((4, 32, 2048), dtype=torch.float32, device="cuda")
        kwargs = dict(tile=GemmTile(32, 64, 64), split_k=4, mma="mfma", stream=0)
        with bridge.name_launches() as named:
            launch_gemm_a16w16(a, b, None, out, workspace, **kwargs)
        assert requests == []  # the replay's own list does not see what was only named
        launch_gemm_a16w16(a, b, None, out, workspace, **kwargs)
    assert [r.path for r in named] == [r.path for r in requests]
    assert [r.function for r in named] == ["gemm_a16w16", "gemm_a16w16_splitk_reduce"]
    assert [r.params for r in named] == [r.params for r in requests]
    assert all(r.module == "aiter.ops.gemm.kernels.a16w16" for r in named)


# --- serving from a built cache (each case in its own process) ---

BF16 = "torch.bfloat16"
ROWS = [
    # one tile, two splits: the split-4 kernel's no-split sibling is cached too
    f"gfx942,304,32,4096,4096,0,{BF16},{BF16},flydsl,4,,flydsl_a16w16_mfma_32x64x64",
    f"gfx942,304,64,4096,4096,0,{BF16},{BF16},flydsl,1,,flydsl_a16w16_mfma_32x64x64",
]
TUNED = (32, 4096, 4096)  # row 2 serves it with split_k 4
UNTUNED = (32, 2048, 4096)  # no row: the heuristic picks split_k 8 for the same tile

SERVE = textwrap.dedent("""
    import json, logging, sys
    import torch
    from aiter import dispatch
    from aiter import flydsl_bridge as bridge
    from aiter.aot.flydsl.dry_run import dry_run
    from aiter.ops.gemm.entry import gemm_a16w16
    from aiter.toolchain import configure_linker

    configure_linker()
    logging.basicConfig(format="LOG %(name)s %(levelname)s %(message)s")
    records, requests = [], []
    try:
        with dispatch.observe() as records, dry_run("gfx942", 304, bridge.MODE_COMPILE) as requests:
            for m, n, k, bias in json.loads(sys.argv[1]):
                a = torch.empty((m, k), dtype=torch.bfloat16, device="cuda")
                b = torch.empty((n, k), dtype=torch.bfloat16, device="cuda")
                c = torch.empty((n,), dtype=torch.bfloat16, device="cuda") if bias else None
                gemm_a16w16(a, b, c)
    finally:
        result = {
            "records": [[r.kernel, r.source, r.params] for r in records],
            "kernels": [[r.function, r.file_name, r.describe_params()] for r in requests],
        }
        print("RESULT " + json.dumps(result))
    """)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A gfx942 cache of ROWS, built once by the AOT command line; tests serve from copies."""
    tables = tmp_path_factory.mktemp("tables")
    (tables / A16W16.name).write_text("\n".join([",".join(A16W16.header), *ROWS]) + "\n")
    for spec in other_tables(A16W16):
        (tables / spec.name).write_text(",".join(spec.header) + "\n")
    env = {"AITER_CONFIG_DIR": str(tables), "GPU_ARCHS": "gfx942"}
    cache = tmp_path_factory.mktemp("built") / "cache"
    args = ("--cache-dir", str(cache), "-j", "2", "--max-m", "64")
    # The builder compiles whatever AITER_JIT says: the monitor leaves its processes alone.
    proc = run_aot("aiter.aot.flydsl.gemm", *args, env={**env, "AITER_JIT": "error"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return env, cache, manifest.read(cache).archs["gfx942"]["gemm"]


@pytest.fixture
def cache(built, tmp_path) -> Path:
    """A copy of the built cache that a test may change."""
    return Path(shutil.copytree(built[1], tmp_path / "cache"))


def _entry(built, cache: Path, split_k: int) -> Path:
    """The cache entry of the main GEMM kernel built for the row with `split_k`."""
    for rel, entry in built[2].items():
        if entry.function == "gemm_a16w16" and f"split_k={split_k} " in entry.params:
            return cache / rel
    raise AssertionError(f"no split_k={split_k} entry was built")


def serve(built, cache: Path, tmp_path: Path, calls, **env: str):
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in (ENV_JIT, ENV_FALLBACK, bridge.ENV_RUN_ONLY, bridge.ENV_COMPILE_ONLY)
    }
    full.update(built[0], **env, PYTHONPATH=str(REPO), FLYDSL_GPU_ARCH="gfx942")
    full[bridge.ENV_CACHE_DIR] = str(cache)
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            json.dumps([[*c[:3], c[3] if len(c) > 3 else 0] for c in calls]),
        ],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout + proc.stderr[-3000:]
    return proc, json.loads(lines[0][len("RESULT ") :])


def _entries(cache: Path) -> set[str]:
    return {str(p.relative_to(cache)) for p in cache.glob("*/*.pkl")}


@pytest.mark.slow
def test_error_refuses_an_untuned_miss_with_every_fact(built, cache, tmp_path) -> None:
    before = _entries(cache)
    proc, result = serve(built, cache, tmp_path, [UNTUNED], AITER_JIT="error")
    assert proc.returncode != 0
    message = proc.stderr[proc.stderr.index("aiter.jit_monitor.JitCompileRefused: ") :]
    expected = [
        "gemm_a16w16: FlyDSL kernel gemm_a16w16 is not in the kernel cache; AITER_JIT=error "
        "refuses to compile it",
        "  call:    gemm_a16w16(A=bfloat16[32, 4096] row-major, B=bfloat16[2048, 4096] "
        "row-major, bias=none, out_dtype=bfloat16)",
        "  device:  gfx942, 304 CUs",
        "  served:  untuned shape, heuristic -> flydsl_a16w16_mfma_32x64x128 split_k=8",
        "  kernel:  gemm_a16w16 [a=bfloat16 b=bfloat16 bias=bfloat16 c=float32 tile_m=32 "
        "tile_n=64 tile_k=128 split_k=8 has_bias=False mma='mfma']",
        f"  cache:   {cache} holds 2 other entries of gemm_a16w16 for this kernel source and "
        "arch; nearest 2:",
        f"    {_entry(built, cache, 4).relative_to(cache)} (built for bf16_tuned_gemm.csv:2, "
        "M 1-32): tile_k=64 (this call: 128), split_k=4 (this call: 8)",
        f"    {_entry(built, cache, 1).relative_to(cache)} (built for bf16_tuned_gemm.csv:3, "
        "M 33-64): c=bfloat16 (this call: float32), tile_k=64 (this call: 128), split_k=1 "
        "(this call: 8)",
        "  fix:     add a row for this shape to bf16_tuned_gemm.csv, e.g. "
        "gfx942,304,32,2048,4096,0,torch.bfloat16,torch.bfloat16,flydsl,8,,"
        "flydsl_a16w16_mfma_32x64x128 (--csv gemm_a16w16=PATH) and rebuild: "
        f"GPU_ARCHS=gfx942:304 AITER_CONFIG_DIR={built[0]['AITER_CONFIG_DIR']} "
        f"python -m aiter.aot.flydsl --module gemm --csv gemm_a16w16=PATH --cache-dir {cache}",
    ]
    for line in expected:
        assert line in message, message
    assert "  entry:   " in message and "(absent)" in message
    assert _entries(cache) == before  # nothing compiled
    assert result["kernels"] == []


@pytest.mark.slow
def test_error_names_the_row_whose_kernel_is_missing(built, cache, tmp_path) -> None:
    _entry(built, cache, 4).unlink()
    proc, _ = serve(built, cache, tmp_path, [TUNED], AITER_JIT="error")
    assert proc.returncode != 0
    row = f"{built[0]['AITER_CONFIG_DIR']}/bf16_tuned_gemm.csv:2"
    assert f"  served:  row {row} -> flydsl_a16w16_mfma_32x64x64 split_k=4" in proc.stderr
    assert "  fix:     the build of this cache wrote this entry and it is gone: " in proc.stderr


@pytest.mark.slow
def test_warn_logs_once_per_kernel_and_compiles(built, cache, tmp_path) -> None:
    before = _entries(cache)
    proc, result = serve(built, cache, tmp_path, [UNTUNED, UNTUNED], AITER_JIT="warn")
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("LOG aiter.jit ")]
    assert warnings == [
        "LOG aiter.jit WARNING gemm_a16w16: FlyDSL kernel gemm_a16w16 is not in the kernel "
        "cache; AITER_JIT=warn: compiling it now, on the serving path (logged once per kernel)",
        "LOG aiter.jit WARNING gemm_a16w16: FlyDSL kernel gemm_a16w16_splitk_reduce is not in "
        "the kernel cache; AITER_JIT=warn: compiling it now, on the serving path (logged once "
        "per kernel)",
    ]
    assert "  call:    gemm_a16w16(A=bfloat16[32, 4096] row-major" in proc.stderr
    compiled = _entries(cache) - before
    assert len(compiled) == 2 and len(result["kernels"]) == 4


@pytest.mark.slow
def test_allow_compiles_silently(built, cache, tmp_path) -> None:
    before = _entries(cache)
    proc, _ = serve(built, cache, tmp_path, [UNTUNED])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "aiter.jit" not in proc.stderr and "not in the kernel cache" not in proc.stderr
    assert len(_entries(cache) - before) == 2


@pytest.mark.slow
def test_run_only_miss_carries_the_message(built, cache, tmp_path) -> None:
    proc, _ = serve(built, cache, tmp_path, [TUNED, UNTUNED], FLYDSL_RUNTIME_RUN_ONLY="1")
    assert proc.returncode != 0
    stderr = proc.stderr
    assert "FLYDSL_RUNTIME_RUN_ONLY=1 but no usable AOT cache for gemm_a16w16" in stderr  # cause
    message = stderr[stderr.index("aiter.jit_monitor.JitCompileRefused: ") :]
    assert message.startswith(
        "aiter.jit_monitor.JitCompileRefused: gemm_a16w16: FlyDSL kernel gemm_a16w16 is not in "
        "the kernel cache; FLYDSL_RUNTIME_RUN_ONLY=1 forbids compiling it"
    )
    for part in ("B=bfloat16[2048, 4096]", "gfx942, 304 CUs", "untuned shape, heuristic",
                 "split_k=8 has_bias=False", "(this call: 8)", "add a row for this shape"):  # fmt: skip
        assert part in message, message


@pytest.mark.slow
def test_fallback_serves_a_deleted_split_with_its_cached_sibling(built, cache, tmp_path) -> None:
    split4, split1 = _entry(built, cache, 4), _entry(built, cache, 1)
    split4.unlink()
    env = {"AITER_AOT_FALLBACK": "1", "AITER_JIT": "error"}
    proc, result = serve(built, cache, tmp_path, [TUNED, TUNED, TUNED], **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = [line for line in proc.stderr.splitlines() if line.startswith("LOG aiter.jit ")]
    assert logged == [
        "LOG aiter.jit WARNING gemm_a16w16: kernel flydsl_a16w16_mfma_32x64x64 split_k=4 is not "
        "in the kernel cache; serving it with the cached equivalent flydsl_a16w16_mfma_32x64x64 "
        "split_k=1 instead (AITER_AOT_FALLBACK=1: the same result, the K sum blocked differently)"
    ]
    assert [k[:2] for k in result["kernels"]] == [["gemm_a16w16", split1.name]] * 3
    planned = "flydsl_a16w16_mfma_32x64x64 split_k=4"
    assert (
        result["records"]
        == [["flydsl_a16w16_mfma_32x64x64", "table", {"split_k": 1, "fallback_from": planned}]] * 3
    )
    assert not split4.exists()


@pytest.mark.slow
def test_fallback_without_a_cached_variant_defers_to_the_policy(built, cache, tmp_path) -> None:
    before = _entries(cache)
    biased = (*TUNED, 1)  # has_bias: no variant of it is cached
    env = {"AITER_AOT_FALLBACK": "1", "AITER_JIT": "error"}
    proc, _ = serve(built, cache, tmp_path, [biased], **env)
    assert proc.returncode != 0
    assert "AITER_JIT=error refuses to compile it" in proc.stderr
    assert "serving it with the cached equivalent" not in proc.stderr
    assert _entries(cache) == before
