"""A kernel specialization as FlyDSL's cache files it (`KernelRequest`), and the compile-time
parameters of a launch that tell specializations apart.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiter.flydsl_bridge.internals import jit_function


@dataclass(frozen=True)
class KernelRequest:
    """One FlyDSL kernel specialization a call asked for, as FlyDSL's cache names it."""

    function: str  # the @flyc.jit function
    cache_dir: str  # <cache root>/<function>_<manager key>
    key: str  # FlyDSL's full cache key
    params: tuple[tuple[str, str], ...] = ()  # compile-time parameters, for reports
    module: str = field(default="", compare=False)  # the Python module defining `function`

    @property
    def file_name(self) -> str:
        return jit_function().JitCacheManager._safe_key(self.key) + ".pkl"

    @property
    def path(self) -> Path:
        return Path(self.cache_dir) / self.file_name

    @property
    def name(self) -> str:
        """Short, stable name: function and entry file."""
        return f"{self.function}/{self.file_name[:-4]}"

    def describe_params(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params)

    def exists(self) -> bool:
        return self.path.is_file()


def compile_time_params(jit_fn: Any, args: tuple, kwargs: dict) -> tuple[tuple[str, str], ...]:
    """Constexpr values and tensor dtypes of one launch: what tells specializations apart."""
    from flydsl.expr.typing import Constexpr

    jit_fn._ensure_sig()  # FlyDSL's signature has string annotations resolved
    signature = jit_fn._sig
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return ()
    params = []
    for name, value in bound.arguments.items():
        ann = signature.parameters[name].annotation
        if ann is not inspect.Parameter.empty and Constexpr.is_constexpr_annotation(ann):
            params.append((name, repr(value)))
        elif hasattr(value, "dtype") and hasattr(value, "shape"):
            params.append((name, str(value.dtype).replace("torch.", "")))
    return tuple(params)
