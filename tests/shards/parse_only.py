"""Stands in for `python` when tests/shards/test_ci_recipe.py runs the recipe's steps: an aiter
command line is parsed as the real command parses it (a usage error exits 2), nothing runs."""

from __future__ import annotations

import sys

from aiter.aot.flydsl.distribution import merge
from aiter.aot.flydsl.execution.options import UsageError, parse


def main(argv: list[str]) -> int:
    if argv[:2] != ["-m", "aiter.aot.flydsl"]:
        print(f"not an aiter command: python {' '.join(argv)}", file=sys.stderr)
        return 3
    rest = argv[2:]
    try:
        if rest[:1] == ["merge"]:
            merge.parser().parse_args(rest[1:])
        else:
            parse(None, rest)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("PARSED python " + " ".join(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
