"""What an AOT-built cache holds, who asked for each kernel, and what built it.

One JSON file at the cache root; each build replaces its own (arch, module) part atomically.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MANIFEST_NAME = "aiter_aot_manifest.json"
FORMAT = 1


def manifest_path(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / MANIFEST_NAME


def read_manifest(cache_dir: str | Path) -> dict[str, Any]:
    path = manifest_path(cache_dir)
    if not path.is_file():
        return {"format": FORMAT, "archs": {}}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path}: not a valid aiter manifest ({err}); delete it to rebuild"
        ) from None
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: manifest format {data.get('format')!r}, expected {FORMAT}")
    return data


def update_manifest(
    cache_dir: str | Path,
    arch: str,
    module: str,
    kernels: dict[str, dict[str, Any]],
    versions: dict[str, str],
) -> Path:
    """Replace `module`'s kernels for `arch`; other archs and modules are kept as they were.

    `kernels` maps a cache entry (path relative to the cache root) to its function,
    compile-time parameters and the jobs that asked for it.
    """
    data = read_manifest(cache_dir)
    data["versions"] = versions
    data["archs"].setdefault(arch, {})[module] = kernels
    path = manifest_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{MANIFEST_NAME}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path
