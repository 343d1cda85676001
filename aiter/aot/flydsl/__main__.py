"""`python -m aiter.aot.flydsl`: replay every registered AOT module in one build (one process
per arch serves them all); `--module gemm,moe` narrows it.
"""

import sys

from aiter.aot.flydsl.driver import main

if __name__ == "__main__":
    sys.exit(main())
