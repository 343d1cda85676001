"""`python -m aiter.aot.flydsl.capture merge|suggest`: see `cli`."""

import sys

from aiter.aot.flydsl.capture.cli import main

if __name__ == "__main__":
    sys.exit(main())
