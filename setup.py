"""Package metadata for aiter, its C++ host planner (csrc/, a torch extension without device
code) and its emulated HIP runtime (csrc/emulated_hip.c, plain C); setup.py stays the build
entry, tool settings are in pyproject.
"""

import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Command, Extension, find_packages, setup
from setuptools.command.build import build
from setuptools.command.build_py import build_py

NO_COMPILER = (
    "aiter: building the C++ host planner (csrc/) needs a C++ compiler{}; install one "
    "(Debian/Ubuntu: apt-get install g++) or set CXX"
)
NO_TORCH = (
    "aiter: building the C++ host planner (csrc/) needs torch at build time; install "
    'torch==2.13.0 first (pip install "torch==2.13.0"), then install aiter with '
    "pip install --no-build-isolation"
)


def _cxx_compiler() -> str:
    """The C++ compiler to build with: CXX when set, else c++, g++ or clang++ on PATH."""
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        if not shutil.which(shlex.split(cxx)[0]):
            raise SystemExit(NO_COMPILER.format(f" (CXX={cxx!r} is not on PATH)"))
        return cxx
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return name
    raise SystemExit(NO_COMPILER.format(""))


# torch's build compiles with CXX, else c++; name the one found (g++ or clang++ without c++).
os.environ["CXX"] = _cxx_compiler()
try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension, library_paths
except ImportError:
    raise SystemExit(NO_TORCH) from None

# Where the extension finds torch's libraries (libc10, libtorch_cpu) when it is imported before
# torch: beside an installed aiter (site-packages/torch/lib), else where this build found them
# (an editable install, whose .so stays in the source tree).
TORCH_RPATH = ":".join(["$ORIGIN/../torch/lib", *library_paths()])


EMULATED_HIP = "aiter.flydsl_bridge._emulated_hip"
EMULATED_HIP_SOURCE = "csrc/emulated_hip.c"
EMULATED_HIP_MAP = "csrc/emulated_hip.map"


def _c_compiler() -> list[str]:
    """The C compiler: CC when set, else cc, gcc or clang on PATH."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        return shlex.split(cc)
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    raise SystemExit(
        "aiter: building the emulated HIP runtime (csrc/emulated_hip.c) needs a C compiler; "
        "install one (Debian/Ubuntu: apt-get install gcc) or set CC"
    )


class BuildExtensions(BuildExtension):
    """torch's extension build for the host planner; the emulated HIP runtime is a plain C shared
    library named as FlyDSL's runtime expects HIP (SONAME libamdhip64.so.7, symbols versioned
    hip_4.2), with the flags aiter.flydsl_bridge.hip_standin uses when it builds one itself."""

    def build_extension(self, ext) -> None:
        if ext.name != EMULATED_HIP:
            super().build_extension(ext)
            return
        output = self.get_ext_fullpath(ext.name)
        inputs = [*ext.sources, *ext.depends]
        if not self.force and os.path.exists(output):
            newest = max(os.path.getmtime(path) for path in inputs)
            if os.path.getmtime(output) >= newest:
                return
        os.makedirs(os.path.dirname(output), exist_ok=True)
        command = [
            *_c_compiler(),
            *("-O2", "-g0", "-std=c11", "-fPIC", "-shared"),
            "-Wl,-soname,libamdhip64.so.7",
            f"-Wl,--version-script={EMULATED_HIP_MAP}",
            *("-o", output, *ext.sources),
        ]
        print(shlex.join(command))
        subprocess.run(command, check=True)


class BuildPyFresh(build_py):
    """build_py into an empty build/lib/aiter: a module deleted from the sources must not stay in
    the wheel (the shared helpers' directory digest is in every kernel's cache key)."""

    def run(self) -> None:
        target = os.path.abspath(os.path.join(self.build_lib, "aiter"))
        source = os.path.abspath(os.path.join(os.path.dirname(__file__), "aiter"))
        if not getattr(self, "editable_mode", False) and target != source:
            shutil.rmtree(target, ignore_errors=True)
        super().run()


class BuildFlydslCache(Command):
    """With AITER_AOT=1: fill the FlyDSL cache the wheel ships (aiter/flydsl_cache) by replaying
    every AOT module for GPU_ARCHS, or ship AITER_AOT_CACHE=DIR once --check passes on it. Runs
    after the extension is built, from the build directory, so it replays what the wheel holds."""

    description = "build the FlyDSL kernel cache the wheel ships (AITER_AOT=1)"
    user_options: list = []

    def initialize_options(self) -> None:
        self.build_lib = None

    def finalize_options(self) -> None:
        self.set_undefined_options("build", ("build_lib", "build_lib"))

    def run(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(self.build_lib)}
        command = [sys.executable, "-m", "aiter.aot.flydsl.wheel", self.build_lib]
        if subprocess.run(command, env=env, check=False).returncode:
            raise SystemExit("aiter: the AOT cache step failed (see the replay's summary above)")


def _aot_requested(_command) -> bool:
    requested = os.environ.get("AITER_AOT") == "1" or bool(os.environ.get("AITER_AOT_CACHE"))
    if os.environ.get("AITER_AOT_ARCH_WHEELS") and not requested:
        raise SystemExit(
            "aiter: AITER_AOT_ARCH_WHEELS=DIST needs AITER_AOT=1 or AITER_AOT_CACHE=DIR: the "
            "cache its wheels carry"
        )
    return requested


build.sub_commands.append(("build_flydsl_cache", _aot_requested))

setup(
    name="aiter",
    version="0.1.0",
    description="FlyDSL GPU operators for AMD Instinct GPUs, with a CPU-only AOT kernel-cache builder",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["aiter", "aiter.*"]),
    package_data={"aiter": ["configs/*.csv"]},
    ext_modules=[
        # Host code only: integer planning ops registered as torch.ops.aiter.* (no ROCm needed).
        CppExtension(
            "aiter._moe_host",
            ["csrc/moe_plan.cpp"],
            # torch 2.13's headers are C++20 (torch adds -std=c++20); -g0 keeps the .so small.
            extra_compile_args={"cxx": ["-O2", "-g0"]},
            extra_link_args=[f"-Wl,-rpath,{TORCH_RPATH}"],
        ),
        # The HIP runtime aiter.emulated stands in with: plain C, no torch and no Python API
        # (BuildExtensions compiles it with the C compiler), an extension only so that it
        # installs, and lands in the sources of an editable install, like one.
        Extension(EMULATED_HIP, [EMULATED_HIP_SOURCE], depends=[EMULATED_HIP_MAP]),
    ],
    cmdclass={
        "build_py": BuildPyFresh,
        "build_ext": BuildExtensions,
        "build_flydsl_cache": BuildFlydslCache,
    },
    install_requires=[
        # Exactly the release whose CPU build the Makefile installs first, so pip never swaps it
        # for another (multi-GB) build.
        "torch==2.13.0",
        "flydsl==0.4.2",
        # Pinned to the versions the tests run with: a new release cannot change a build.
        "pandas==3.1.1",
        "numpy==2.4.6",
        "ziglang==0.17.1",
        "msgpack==1.2.4",  # the emulator reads a code object's AMDGPU metadata note
    ],
    extras_require={
        "dev": [
            "pytest==9.2.0",
            "pytest-xdist==3.8.0",  # the inner loop's two workers (make fast)
            "execnet==2.1.2",
            "hypothesis==6.170.17",
            "pyyaml==6.0.4",  # the CI matrix recipe's test reads the workflow
            "black==26.10.1",
            "ruff==0.17.6",
            "ray==2.60.0",  # the --executor ray tests start a local two-node cluster
        ],
        # --executor ray: a build's shards as tasks on a Ray cluster.
        "ray": ["ray==2.60.0"],
    },
)
