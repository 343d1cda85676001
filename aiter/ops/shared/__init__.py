"""What several families' kernels share: the GEMM index arithmetic and building blocks, the MMA
steps, tiles, the preshuffled weight layout and the launchers' argument checks.

FlyDSL hashes a kernel's helper sources into its cache key only when they sit in the kernel's
own directory. Helpers here are called from other directories, so every launcher of aiter reads
`SOURCES_DIGEST` (a module global FlyDSL snapshots into each key): editing a shared helper then
changes the key of every kernel, and no stale cache entry can serve.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def sources_digest(directory: Path) -> str:
    """sha256 of the Python sources in `directory`, by file name and content."""
    digest = hashlib.sha256()
    for path in sorted(directory.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


SOURCES_DIGEST = sources_digest(Path(__file__).resolve().parent)
