"""Rewrites every family's default tuned table in aiter/configs: `python -m aiter.configs.generate`
(each family's rows come from its own `generate` module).

`--scale F --out-dir DIR` writes tables F times the default size instead: every default model
shape also at F - 1 synthetic wider or larger sizes, to measure the builder on tables bigger than
the defaults (`benchmarks/aot_build.py --table DIR`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiter.ops.chunk_gdn_h import generate as chunk_gdn_h
from aiter.ops.conv3d import generate as conv3d
from aiter.ops.fmha_fp8 import generate as fmha_fp8
from aiter.ops.gemm import generate as gemm
from aiter.ops.moe import generate as moe

HERE = Path(__file__).resolve().parent
FAMILIES = (gemm, moe, conv3d, fmha_fp8, chunk_gdn_h)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=str(HERE))
    parser.add_argument("--scale", type=int, default=1, help="tables this many times the default")
    args = parser.parse_args()
    if args.scale < 1:
        parser.error(f"--scale must be a whole number of at least 1, not {args.scale}")
    if args.scale > 1 and Path(args.out_dir).resolve() == HERE:
        parser.error("--scale writes synthetic tables: give an --out-dir other than aiter/configs")
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        family.write(Path(args.out_dir), args.scale)


if __name__ == "__main__":
    main()
