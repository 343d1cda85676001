"""Importing every operator of aiter with its kernel modules, before a process forks workers."""

from __future__ import annotations

import importlib
import pkgutil


def import_all() -> None:
    """Every operator entry of aiter and every module of its package's `kernels`: an entry
    imports its kernels at their first call, and each module costs 10-20 ms of FlyDSL's kernel
    rewriting, which every forked naming worker would pay again."""
    import aiter

    for module in sorted(set(aiter._ENTRIES.values())):
        importlib.import_module(module)
        try:
            kernels = importlib.import_module(f"{module.rpartition('.')[0]}.kernels")
        except ModuleNotFoundError:
            continue
        for info in pkgutil.iter_modules(kernels.__path__, f"{kernels.__name__}."):
            importlib.import_module(info.name)
