"""Reading FlyDSL cache entries without running FlyDSL code: the code objects inside an entry,
its size and content hash, and whether it is a whole entry for an arch.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from aiter.flydsl_bridge.env import flydsl_version
from aiter.flydsl_bridge.internals import ReplayHookBroken


def extract_code_objects(entry_path: str | Path) -> list[bytes]:
    """The HSACO ELF files inside one FlyDSL cache entry (<cache>/<jit fn>_<key>/<file>.pkl).

    An entry pickles a CompiledArtifact whose state holds zlib-compressed, fully lowered MLIR;
    each `gpu.binary` object in it carries its code object as an MLIR string literal
    (`bin = "..."`, non-printable bytes escaped as \\XX). The pickle is read with a stand-in
    class, so no FlyDSL code runs while loading it.
    """
    import pickle
    import zlib

    artifact_class = ("flydsl.compiler.jit_executor", "CompiledArtifact")

    class _ArtifactState:
        state: Any = None

        def __setstate__(self, state: Any) -> None:
            self.state = state

    class _EntryUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) == artifact_class:
                return _ArtifactState
            raise ReplayHookBroken(
                f"{entry_path}: cache entry pickles {module}.{name}, expected "
                f"{'.'.join(artifact_class)} (flydsl {flydsl_version()})"
            )

    with open(entry_path, "rb") as f:
        artifact = _EntryUnpickler(f).load()
    state = getattr(artifact, "state", None)
    if not isinstance(state, dict) or not ({"ir_zlib", "ir_text"} & state.keys()):
        raise ReplayHookBroken(
            f"{entry_path}: cache entry state has no 'ir_zlib' or 'ir_text' "
            f"(flydsl {flydsl_version()}); update aiter/flydsl_bridge"
        )
    if "ir_zlib" in state:
        ir_text = zlib.decompress(state["ir_zlib"]).decode("utf-8")
    else:
        ir_text = state["ir_text"]

    def decode_string(text: str, pos: int) -> tuple[bytes, int]:
        # MLIR prints printable ASCII as is and every other byte (and the quote) as a
        # backslash and two hex digits; a backslash itself is doubled.
        out = bytearray()
        while True:
            if pos >= len(text):
                raise ReplayHookBroken(f"{entry_path}: unterminated string in the entry's MLIR")
            ch = text[pos]
            if ch == '"':
                return bytes(out), pos + 1
            if ch == "\\":
                if text[pos + 1] == "\\":
                    out.append(0x5C)
                    pos += 2
                else:
                    out.append(int(text[pos + 1 : pos + 3], 16))
                    pos += 3
            else:
                out.extend(ch.encode("ascii"))
                pos += 1

    codes = []
    marker = 'bin = "'
    start = ir_text.find(marker)
    while start >= 0:
        code, end = decode_string(ir_text, start + len(marker))
        codes.append(code)
        start = ir_text.find(marker, end)
    return codes


def file_digest(path: str | Path) -> tuple[int, str]:
    """Size and sha256 of a file."""
    data = Path(path).read_bytes()
    return len(data), hashlib.sha256(data).hexdigest()


def entry_defect(path: str | Path, arch: str) -> str | None:
    """Why a cache entry is not a whole FlyDSL entry for `arch`, or None when it is: missing,
    unreadable, or holding no code object or one of another arch. Runs no FlyDSL code."""
    from aiter.flydsl_bridge.elf import code_object_arch

    if not Path(path).is_file():
        return "missing"
    try:
        archs = {code_object_arch(code) for code in extract_code_objects(path)}
    except Exception as err:  # a corrupt entry is reported, never raised
        return f"not a readable FlyDSL entry ({type(err).__name__}: {err})"
    if archs != {arch}:
        return f"holds code objects for {sorted(archs) or 'no arch'}, expected {arch}"
    return None
