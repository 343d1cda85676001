"""Rewrites every family's default tuned table in aiter/configs: `python -m aiter.configs.generate`
(each family's rows come from its own `generate` module)."""

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
    args = parser.parse_args()
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        family.write(Path(args.out_dir))


if __name__ == "__main__":
    main()
