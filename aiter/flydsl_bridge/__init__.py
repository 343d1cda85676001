"""The one place aiter touches FlyDSL's internals, for the serving runtime and the AOT builder
alike: environment variable names, recording and naming launches, the hooks the JIT monitor
listens through, cache entries and their code objects, and the typed manifest of a built cache.

Importing it imports neither FlyDSL nor torch; FlyDSL is loaded at the first use of a hook.
`self_test()` and `serving_self_test()` fail loudly when a FlyDSL upgrade moved an internal.
"""

from aiter.flydsl_bridge.entries import extract_code_objects
from aiter.flydsl_bridge.env import (
    ENV_ARCH,
    ENV_CACHE_DIR,
    ENV_COMPILE_ONLY,
    ENV_GPU_ARCH,
    ENV_RUN_ONLY,
    KEY_ENV_VARS,
    TESTED_FLYDSL,
    cache_dir_from_env,
    default_cache_dir,
    flydsl_version,
    run_only_from_env,
    target_env,
)
from aiter.flydsl_bridge.internals import (
    ReplayHookBroken,
    flydsl_target_arch,
    guard_kernel_execution,
    jit_function,
    register_stream_type,
    self_test,
    self_test_once,
)
from aiter.flydsl_bridge.recording import MODE_COMPILE, MODE_NAME, record_launches
from aiter.flydsl_bridge.requests import KernelRequest
from aiter.flydsl_bridge.watching import (
    AOT_BUILD_MAIN,
    RUN_ONLY_MISS,
    CompileListener,
    in_aot_build,
    mark_aot_build,
    name_launches,
    observe_launches,
    serving_self_test,
    watch_compiles,
)

__all__ = [
    "AOT_BUILD_MAIN",
    "ENV_ARCH",
    "ENV_CACHE_DIR",
    "ENV_COMPILE_ONLY",
    "ENV_GPU_ARCH",
    "ENV_RUN_ONLY",
    "KEY_ENV_VARS",
    "MODE_COMPILE",
    "MODE_NAME",
    "RUN_ONLY_MISS",
    "TESTED_FLYDSL",
    "CompileListener",
    "KernelRequest",
    "ReplayHookBroken",
    "cache_dir_from_env",
    "default_cache_dir",
    "extract_code_objects",
    "flydsl_target_arch",
    "flydsl_version",
    "guard_kernel_execution",
    "in_aot_build",
    "mark_aot_build",
    "jit_function",
    "name_launches",
    "observe_launches",
    "record_launches",
    "register_stream_type",
    "run_only_from_env",
    "self_test",
    "self_test_once",
    "serving_self_test",
    "target_env",
    "watch_compiles",
]
