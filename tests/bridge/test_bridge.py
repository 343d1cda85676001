"""Tests of aiter.flydsl_bridge: the FlyDSL internals the replay relies on, and what the
naming and compile modes record and write, with the tiny real kernel in tests/fixtures.

Replays run in fresh processes (tests/fixtures/replay_scale.py): FlyDSL binds a jit
function's cache directory at its first call.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import flydsl
import pytest

from aiter import flydsl_bridge as bridge
from aiter.flydsl_bridge import KernelRequest, ReplayHookBroken

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "fixtures" / "replay_scale.py"
JCM = bridge.jit_function().JitCacheManager
JF = bridge.jit_function().JitFunction
JIT = bridge.jit_function()


def run_replay(tmp: Path, phases: str, blocks: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ARCH", "FLYDSL_GPU_ARCH", "COMPILE_ONLY", "FLYDSL_RUNTIME_RUN_ONLY")
    }
    env.update(
        FLYDSL_RUNTIME_CACHE_DIR=str(tmp / "cache"),
        AITER_LLD_SHIM_DIR=str(tmp / "lld"),
        PYTHONPATH=str(REPO),
    )
    env.pop("FLYDSL_RUNTIME_ENABLE_CACHE", None)
    (tmp / "cache").mkdir(parents=True)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), phases, blocks],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("REPORT ")]
    assert len(lines) == 1, out.stdout
    return json.loads(lines[0][len("REPORT ") :])


# --- self_test ---


def test_written_against_the_installed_flydsl() -> None:
    assert bridge.flydsl_version() == flydsl.__version__ == bridge.TESTED_FLYDSL


def test_self_test_passes_on_installed_flydsl() -> None:
    assert bridge.self_test() is None


@pytest.mark.parametrize(
    "owner, name, label",
    [
        (JCM, "compile_lock", "JitCacheManager.compile_lock"),
        (JCM, "get", "JitCacheManager.get"),
        (JCM, "_safe_key", "JitCacheManager._safe_key"),
        (JF, "_compile_or_execute", "JitFunction._compile_or_execute"),
        (JF, "_ensure_sig", "JitFunction._ensure_sig"),
        (
            bridge.jit_function(),
            "_build_call_state",
            "flydsl.compiler.jit_function._build_call_state",
        ),
        (bridge.jit_function(), "JitFunction", "flydsl.compiler.jit_function.JitFunction"),
    ],
)
def test_missing_internal_is_named(monkeypatch, owner, name: str, label: str) -> None:
    monkeypatch.delattr(owner, name)
    with pytest.raises(ReplayHookBroken) as info:
        bridge.self_test()
    message = str(info.value)
    assert f"moved internals the AOT replay uses: {label} " in message
    assert f"flydsl {flydsl.__version__}" in message
    assert f"written against {bridge.TESTED_FLYDSL}" in message
    assert message.endswith("update aiter/flydsl_bridge")


def test_every_missing_internal_is_named(monkeypatch) -> None:
    monkeypatch.delattr(JCM, "get")
    monkeypatch.delattr(JF, "_ensure_cache_manager")
    with pytest.raises(ReplayHookBroken, match=r"JitCacheManager\.get, JitFunction\._ensure_cache"):
        bridge.self_test()


def test_changed_signature_is_named(monkeypatch) -> None:
    monkeypatch.setattr(JCM, "get", lambda self, key: None)
    with pytest.raises(ReplayHookBroken) as info:
        bridge.self_test()
    assert str(info.value) == (
        f"flydsl {flydsl.__version__}: JitCacheManager.get takes ['self', 'key'], the replay "
        "expects ['self', 'cache_key']; update aiter/flydsl_bridge"
    )


def test_changed_compile_or_execute_signature(monkeypatch) -> None:
    def moved(self, bound_args, *, execute):
        return None

    monkeypatch.setattr(JF, "_compile_or_execute", moved)
    with pytest.raises(ReplayHookBroken) as info:
        bridge.self_test()
    assert (
        "JitFunction._compile_or_execute takes ['self', 'bound_args', 'keyword-only execute'],"
        in str(info.value)
    )


def test_variadic_compile_or_execute_is_a_changed_signature(monkeypatch) -> None:
    def moved(self, *args, **kwargs):
        return None

    monkeypatch.setattr(JF, "_compile_or_execute", moved)
    with pytest.raises(ReplayHookBroken, match="'variadic positional args'"):
        bridge.self_test()


def test_changed_entry_names(monkeypatch) -> None:
    monkeypatch.setattr(JCM, "_safe_key", staticmethod(lambda key: "x" * 64))
    with pytest.raises(ReplayHookBroken, match="cache entry names changed"):
        bridge.self_test()


def test_record_launches_runs_self_test_and_patches_nothing_when_broken(monkeypatch) -> None:
    bridge.self_test_once.cache_clear()  # a process checks once; this test needs a fresh check
    monkeypatch.delattr(JCM, "compile_lock")
    get = JCM.get
    with (
        pytest.raises(ReplayHookBroken, match="JitCacheManager.compile_lock"),
        bridge.record_launches(bridge.MODE_NAME),
    ):
        pass
    assert JCM.get is get


def test_record_launches_restores_what_it_patched() -> None:
    originals = (JCM.get, JCM.compile_lock, JF._compile_or_execute)
    with bridge.record_launches(bridge.MODE_COMPILE) as requests:
        assert (JCM.get, JCM.compile_lock, JF._compile_or_execute) != originals
        assert requests == []
    assert (JCM.get, JCM.compile_lock, JF._compile_or_execute) == originals


def test_record_launches_refuses_unknown_mode() -> None:
    with (
        pytest.raises(ValueError, match="mode must be 'name' or 'compile', got 'list'"),
        bridge.record_launches("list"),
    ):
        pass


def test_kernel_request_names() -> None:
    key = "(('block', 64),)"
    request = KernelRequest("scale", "/c/scale_abc", key, (("block", "64"), ("x", "float32")))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    assert request.file_name == digest + ".pkl"
    assert request.path == Path("/c/scale_abc") / (digest + ".pkl")
    assert request.name == f"scale/{digest}"
    assert request.describe_params() == "block=64 x=float32"
    assert not request.exists()


# --- naming and compiling the tiny kernel, in fresh processes ---


@pytest.fixture(scope="module")
def named(tmp_path_factory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("named")
    return tmp, run_replay(tmp, "name", "64,128,64")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("compiled")
    return tmp, run_replay(tmp, "compile,compile,name", "64")


def test_naming_records_one_request_per_launch(named) -> None:
    tmp, report = named
    (phase,) = report["phases"]
    requests = phase["requests"]
    assert [r["function"] for r in requests] == ["scale", "scale", "scale"]
    assert [r["params"] for r in requests] == [
        [["x", "float32"], ["y", "float32"], ["block", "64"]],
        [["x", "float32"], ["y", "float32"], ["block", "128"]],
        [["x", "float32"], ["y", "float32"], ["block", "64"]],
    ]
    assert phase["returned"] == ["None", "None", "None"]
    for r in requests:
        cache_dir = Path(r["cache_dir"])
        assert cache_dir.parent == tmp / "cache"
        assert cache_dir.name.startswith("scale_")
        assert r["file_name"] == hashlib.sha256(r["key"].encode()).hexdigest()[:16] + ".pkl"
        assert r["path"] == str(cache_dir / r["file_name"])
        assert "arch='gfx942'" in r["key"]
        assert not r["exists"]


def test_naming_two_blocks_give_two_keys(named) -> None:
    requests = named[1]["phases"][0]["requests"]
    assert requests[0]["key"] != requests[1]["key"]
    assert requests[0]["path"] != requests[1]["path"]
    assert requests[0]["key"] == requests[2]["key"]
    assert len({r["cache_dir"] for r in requests}) == 1


def test_naming_remembers_each_key_once(named) -> None:
    """The third launch repeats the first: naming mode answers it from its memo, which holds
    FlyDSL's own key for each distinct launch."""
    phase = named[1]["phases"][0]
    keys = [r["key"] for r in phase["requests"]]
    assert phase["remembered"] == sorted(set(keys))
    assert len(phase["remembered"]) == 2


@pytest.mark.slow  # a fresh process
def test_naming_memo_that_drifts_from_flydsl_is_an_error(tmp_path) -> None:
    report = run_replay(tmp_path, "name-drift", "64")
    assert "differs from FlyDSL's" in report["drift_error"]
    assert "launch_keys.py" in report["drift_error"]


def test_naming_compiles_and_writes_nothing(named) -> None:
    tmp, report = named
    assert report["phases"][0]["pkl"] == {}
    assert report["phases"][0]["files"] == []
    assert list((tmp / "cache").rglob("*")) == []
    assert not (tmp / "lld").exists()  # naming never looked for a linker


@pytest.mark.slow  # compiles a kernel in a fresh process
@pytest.mark.slow  # compiles the tiny kernel in a fresh process
def test_compile_writes_exactly_the_named_file(compiled) -> None:
    tmp, report = compiled
    first = report["phases"][0]
    assert first["mode"] == "compile"
    (request,) = first["requests"]
    assert request["params"] == [["x", "float32"], ["y", "float32"], ["block", "64"]]
    assert request["exists"]
    assert list(first["pkl"]) == [request["path"]]
    assert Path(request["path"]).is_file()
    assert sorted(p for p in first["files"] if not p.endswith(".lock")) == [
        Path(request["cache_dir"]).name,
        str(Path(request["cache_dir"]).name + "/" + request["file_name"]),
    ]


@pytest.mark.slow  # compiles a kernel in a fresh process
@pytest.mark.slow  # compiles the tiny kernel in a fresh process
def test_compiling_again_hits_the_cache(compiled) -> None:
    _, report = compiled
    first, second = report["phases"][:2]
    assert second["mode"] == "compile"
    assert [r["path"] for r in second["requests"]] == [first["requests"][0]["path"]]
    assert second["pkl"] == first["pkl"]  # same file, same mtime: nothing rewritten


@pytest.mark.slow  # compiles a kernel in a fresh process
@pytest.mark.slow  # compiles the tiny kernel in a fresh process
def test_naming_after_compiling_names_the_same_file(compiled) -> None:
    _, report = compiled
    compile_phase, _, name_phase = report["phases"]
    assert name_phase["mode"] == "name"
    (named_request,) = name_phase["requests"]
    assert named_request["key"] == compile_phase["requests"][0]["key"]
    assert named_request["path"] == compile_phase["requests"][0]["path"]
    assert named_request["exists"]
    assert name_phase["pkl"] == compile_phase["pkl"]


@pytest.mark.slow  # compiles a kernel in a fresh process
@pytest.mark.slow  # compiles the tiny kernel in a fresh process
def test_keys_are_stable_across_processes(named, compiled) -> None:
    named_key = named[1]["phases"][0]["requests"][0]["key"]
    compiled_request = compiled[1]["phases"][0]["requests"][0]
    assert named_key == compiled_request["key"]
    assert (
        Path(named[1]["phases"][0]["requests"][0]["cache_dir"]).name
        == Path(compiled_request["cache_dir"]).name
    )


@pytest.mark.slow  # compiles the tiny kernel in a fresh process
def test_compiled_entry_holds_a_gfx942_code_object(compiled) -> None:
    path = compiled[1]["phases"][0]["requests"][0]["path"]
    codes = bridge.extract_code_objects(path)
    assert len(codes) == 1
    code = codes[0]
    assert code[:4] == b"\x7fELF"
    (e_machine,) = struct.unpack_from("<H", code, 18)
    (e_flags,) = struct.unpack_from("<I", code, 48)
    assert e_machine == 224
    assert e_flags & 0xFF == 0x4C  # gfx942


# --- the light part: importing hooks, FlyDSL's environment variables ---


def run_python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout.strip()


def test_importing_hooks_imports_neither_torch_nor_flydsl() -> None:
    code = (
        "import aiter.flydsl_bridge, sys; " "print('torch' in sys.modules, 'flydsl' in sys.modules)"
    )
    assert run_python(code) == "False False"


def test_light_helpers_import_neither_torch_nor_flydsl() -> None:
    code = (
        "import sys\n"
        "from aiter import flydsl_bridge as bridge\n"
        "bridge.cache_dir_from_env(); bridge.default_cache_dir(); bridge.target_env('gfx950')\n"
        "print(bridge.flydsl_version(), 'torch' in sys.modules, 'flydsl' in sys.modules)"
    )
    assert run_python(code) == f"{flydsl.__version__} False False"


def test_jit_function_is_flydsls_jit_function_module() -> None:
    from flydsl.compiler import jit_function

    assert bridge.jit_function() is jit_function


def test_key_env_vars_are_flydsls() -> None:
    per_arch = [n for names in JIT._TARGET_CACHE_INVALIDATING_ENV_VARS.values() for n in names]
    flydsl_vars = (*JIT._CACHE_INVALIDATING_ENV_VARS, *per_arch)
    assert flydsl_vars == bridge.KEY_ENV_VARS
    assert "LLVM_GFX1250_ANY_XNACK_CODEGEN" in bridge.KEY_ENV_VARS
    assert bridge.ENV_CACHE_DIR not in bridge.KEY_ENV_VARS


def test_cache_dir_from_env_honours_the_variable() -> None:
    assert bridge.cache_dir_from_env({"FLYDSL_RUNTIME_CACHE_DIR": "/x/cache"}) == "/x/cache"
    assert bridge.cache_dir_from_env({"FLYDSL_RUNTIME_CACHE_DIR": "rel"}) == "rel"


def test_cache_dir_from_env_falls_back_to_flydsls_default(monkeypatch) -> None:
    from flydsl.utils.env import runtime

    monkeypatch.delenv("FLYDSL_RUNTIME_CACHE_DIR", raising=False)
    expected = str(runtime.cache_dir)
    assert expected == str(Path.home() / ".flydsl" / "cache")
    assert bridge.cache_dir_from_env({}) == expected
    assert bridge.cache_dir_from_env({"FLYDSL_RUNTIME_CACHE_DIR": ""}) == expected
    assert bridge.cache_dir_from_env() == expected
    assert bridge.default_cache_dir() == expected


def test_cache_dir_from_env_reads_os_environ_by_default(monkeypatch, tmp_path) -> None:
    from flydsl.utils.env import runtime

    monkeypatch.setenv("FLYDSL_RUNTIME_CACHE_DIR", str(tmp_path))
    assert bridge.cache_dir_from_env() == str(tmp_path) == runtime.cache_dir
    assert bridge.default_cache_dir() == str(tmp_path)


def test_target_env_sets_the_three_variables() -> None:
    assert bridge.target_env("gfx950") == {
        "ARCH": "gfx950",
        "FLYDSL_GPU_ARCH": "gfx950",
        "COMPILE_ONLY": "1",
    }


def test_target_env_makes_flydsl_target_the_arch(monkeypatch) -> None:
    from flydsl.utils.env import compile as compile_env

    for name, value in bridge.target_env("gfx1250").items():
        monkeypatch.setenv(name, value)
    assert bridge.flydsl_target_arch() == "gfx1250"
    assert compile_env.arch == "gfx1250"
    assert compile_env.compile_only is True


def test_self_test_catches_a_new_key_variable(monkeypatch) -> None:
    monkeypatch.setattr(JIT, "_CACHE_INVALIDATING_ENV_VARS", (*bridge.KEY_ENV_VARS[:-1], "NEW"))
    with pytest.raises(ReplayHookBroken, match=r"folds .*'NEW'.* into its cache keys"):
        bridge.self_test()


def test_self_test_catches_a_new_per_arch_key_variable(monkeypatch) -> None:
    per_arch = {"gfx1250": ("LLVM_GFX1250_ANY_XNACK_CODEGEN",), "gfx950": ("GFX950_FLAG",)}
    monkeypatch.setattr(JIT, "_TARGET_CACHE_INVALIDATING_ENV_VARS", per_arch)
    with pytest.raises(ReplayHookBroken, match="GFX950_FLAG"):
        bridge.self_test()


def test_self_test_names_moved_key_variables(monkeypatch) -> None:
    monkeypatch.delattr(JIT, "_TARGET_CACHE_INVALIDATING_ENV_VARS")
    with pytest.raises(ReplayHookBroken) as info:
        bridge.self_test()
    assert (
        "moved internals the AOT replay uses: "
        "flydsl.compiler.jit_function._TARGET_CACHE_INVALIDATING_ENV_VARS "
    ) in str(info.value)


def test_self_test_catches_a_moved_default_cache_dir(monkeypatch) -> None:
    from flydsl.utils import env

    option = type(env.runtime).__dict__["cache_dir"]
    monkeypatch.setattr(option, "default", "/var/cache/flydsl")
    with pytest.raises(ReplayHookBroken, match="default cache directory is '/var/cache/flydsl'"):
        bridge.self_test()


@pytest.mark.parametrize(
    "manager, attr, variable",
    [
        ("runtime", "cache_dir", "FLYDSL_RUNTIME_CACHE_DIR"),
        ("runtime", "run_only", "FLYDSL_RUNTIME_RUN_ONLY"),
        ("compile", "compile_only", "COMPILE_ONLY"),
        ("compile", "arch", "ARCH"),
    ],
)
def test_self_test_catches_a_renamed_variable(monkeypatch, manager, attr, variable) -> None:
    from flydsl.utils import env

    option = type(getattr(env, manager)).__dict__[attr]
    assert option.env_var == variable
    monkeypatch.setattr(option, "env_var", "RENAMED")
    with pytest.raises(ReplayHookBroken, match=f"reads 'RENAMED', aiter sets '{variable}'"):
        bridge.self_test()


@pytest.mark.slow  # compiles a kernel in a fresh process
@pytest.mark.slow  # compiles the tiny kernel in a fresh process
def test_extract_code_objects_does_not_import_flydsl(compiled) -> None:
    path = compiled[1]["phases"][0]["requests"][0]["path"]
    code = (
        "import sys\n"
        "from aiter.flydsl_bridge import extract_code_objects\n"
        f"codes = extract_code_objects({path!r})\n"
        "print(len(codes), codes[0][:4] == b'\\x7fELF', 'flydsl' in sys.modules)"
    )
    assert run_python(code) == "1 True False"
